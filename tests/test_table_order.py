"""Mode ecmp: one mh table on every balancer, from the file alone
(engine/table_order.py).

keepalived adds each real server at the head of the kernel's list, on a
start in its config's order, on a reload only the new ones; mh fills its
table in list order.  A fake keepalived here fills the fake kernel from the
config apply wrote, as the real one does (the netns suite runs the real one).
"""

import re
from ipaddress import IPv4Address

import pytest

from test_daemons import ECMP, LAYOUT, Balancer, changes, routed
from lbctl.config.model import DestKey, ServiceKey
from lbctl.engine.plan import format_plan
from lbctl.errors import ConfigError
from lbctl.state import FWD_DIRECT_ROUTING, ServiceSpec

PI3 = "  pi3: {address: 192.168.100.6}\n"
PI9 = "  pi9: {address: 192.168.100.9}\n"
PI8 = "  pi8: {address: 192.168.100.8}\n"
PI2 = "  pi2: {address: 192.168.100.4}\n"
THREE = ECMP.replace(PI2, PI2 + PI3)
MID_LIST = THREE.replace(PI2, PI2 + PI9)  # pi9 between pi2 and pi3, on line 13
APPENDED = THREE.replace(PI3, PI3 + PI9)
TWO_APPENDED = APPENDED.replace(PI9, PI9 + PI8)
WITHOUT_PI2 = THREE.replace(PI2, "")


def keepalived_fills_the_table(node):
    """The fake keepalived of `node` changes the fake kernel's table as the
    real one does, from the keepalived.conf apply wrote."""
    daemon, ipvs = node.daemons["keepalived"], node.adapters.ipvs

    def fill(fresh):
        if fresh:
            ipvs.services.clear()
            ipvs.dests.clear()
        conf = node.adapters.files.read(LAYOUT.conf)[0]
        for block in conf.split("virtual_server ")[1:]:
            vip, port = block.split()[:2]
            protocol = re.search(r"protocol (\w+)", block)[1].lower()
            key = ServiceKey(protocol, IPv4Address(vip), int(port))
            ipvs.services.setdefault(key, ServiceSpec("mh"))
            wanted = [DestKey(key, IPv4Address(a), int(p))
                      for a, p in re.findall(r"real_server (\S+) (\d+)", block)]
            for dest in [d for d in ipvs.dests if d.service == key and d not in wanted]:
                del ipvs.dests[dest]
            for dest in wanted:
                ipvs.dests.setdefault(dest, [1, FWD_DIRECT_ROUTING, 0])  # at the head

    for name, fresh in (("start", True), ("reload", False)):
        def call(_own=getattr(daemon, name), _fresh=fresh):
            _own()
            fill(_fresh)
        setattr(daemon, name, call)
    return node


def balancer(check_order=True):
    return keepalived_fills_the_table(Balancer(check_order))


def web_order(node):
    web = next(s for s in node.adapters.ipvs.dump() if s.key.port == 80)
    return [str(d.address) for d in web.dests]


def restart(node):
    node.daemons["keepalived"].stop()
    node.daemons["keepalived"].start()


def stop(node):
    """keepalived stopped (by hand, or it died): it deleted its services."""
    node.daemons["keepalived"].stop()
    node.daemons["keepalived"].is_running = False
    node.adapters.ipvs.services.clear()
    node.adapters.ipvs.dests.clear()


def refusal(node, text):
    """apply's error for `text`, checking that nothing was changed."""
    table, files = node.adapters.ipvs.dump(), dict(node.adapters.files.files)
    with pytest.raises(ConfigError) as refused:
        node.apply(text)
    assert (node.adapters.ipvs.dump(), node.adapters.files.files) == (table, files)
    return str(refused.value)


def test_a_worker_appended_heads_the_list_after_a_reload_as_after_a_restart():
    node = balancer()
    node.apply(THREE)
    assert web_order(node) == ["192.168.100.6", "192.168.100.4", "192.168.100.3"]
    plan = node.plan(APPENDED)
    assert changes(plan) == [("keepalived", "reload")], format_plan(plan)
    node.apply(APPENDED)
    listed = ["192.168.100.9", "192.168.100.6", "192.168.100.4", "192.168.100.3"]
    assert web_order(node) == listed
    assert node.plan(APPENDED).empty and not node.warnings
    restart(node)  # a reboot, a crash
    assert web_order(node) == listed
    stop(node)  # keepalived deleted its table; apply starts it from the file
    plan = node.plan(APPENDED)
    assert changes(plan) == [("keepalived", "start")], format_plan(plan)
    node.apply(APPENDED)
    assert web_order(node) == listed


def test_a_worker_added_mid_list_is_refused_at_its_place_in_the_file():
    node = balancer()
    node.apply(THREE)
    error = refusal(node, MID_LIST)
    assert error.startswith("cluster.yaml:13:3: services.dns: worker pi9 is new to this "
                            "balancer's table and stands before pi3, which the table has"), error
    assert "cluster.yaml:13:3: services.web: worker pi9" in error
    assert "add new workers after the others (here after pi3)" in error
    assert "\n      pi9: {address: 192.168.100.9}\n      ^" in error


def test_a_worker_added_mid_list_of_a_services_own_workers_is_refused_there():
    text = THREE.replace("scheduler_flags: [mh-port]}",
                         "scheduler_flags: [mh-port], workers: [pi1, pi2, pi3]}")
    node = balancer()
    node.apply(text)
    added = APPENDED.replace("scheduler_flags: [mh-port]}",
                             "scheduler_flags: [mh-port], workers: [pi9, pi1, pi2, pi3]}")
    error = refusal(node, added)
    line, col = next((n, row.index("pi9, pi1")) for n, row in enumerate(added.splitlines(), 1)
                     if "web:" in row)
    assert f"cluster.yaml:{line}:{col + 1}: services.web: worker pi9 is new" in error, error


def test_workers_reordered_are_refused():
    node = balancer()
    node.apply(THREE)
    error = refusal(node, ECMP.replace(PI2, PI3 + PI2))
    assert "cluster.yaml:12:3: services.web: worker pi3 is not where this balancer's table " \
           "has it: keep the workers the table has in its order, pi1, pi2, pi3" in error, error


def test_balancers_given_the_appends_in_other_batches_list_them_alike():
    """One balancer took each apply; one missed the first (it was down); a
    third joins at the end; the first restarts.  All fill one table."""
    every, missed, new = balancer(), balancer(), balancer()
    for text in (THREE, APPENDED, TWO_APPENDED):
        every.apply(text)
    for text in (THREE, TWO_APPENDED):
        missed.apply(text)
    new.apply(TWO_APPENDED)
    listed = web_order(every)
    assert listed[:2] == ["192.168.100.8", "192.168.100.9"]
    assert web_order(missed) == web_order(new) == listed
    restart(every)
    assert web_order(every) == listed


def test_a_worker_added_back_while_the_table_still_holds_it_is_refused_out_of_place():
    """A worker dropped from the file stays in the table, at weight 0 and at
    its old place, while it has connections.  Added back at the end, a
    reload would leave it at its old place and a restart would not."""
    node = balancer()
    node.apply(THREE)
    for dest, entry in node.adapters.ipvs.dests.items():
        if str(dest.address) == "192.168.100.4":
            entry[2] = 3  # active connections: it leaves slowly
    node.apply(WITHOUT_PI2)
    assert "192.168.100.4" in web_order(node)
    error = refusal(node, WITHOUT_PI2.replace(PI3, PI3 + PI2))
    assert "services.web: worker pi3 is not where this balancer's table has it" in error, error
    assert "pi2 left the service but is still in its table" in error
    # At its old place it is where a start puts it.
    node.apply(THREE)
    assert web_order(node) == ["192.168.100.6", "192.168.100.4", "192.168.100.3"]
    assert not node.warnings


def test_an_order_an_older_lbctl_left_is_warned_of_not_refused():
    """An lbctl before this check reloaded a worker in mid-list: its kernel
    differs from what a start gives, and every apply says so; none refuses."""
    node = balancer(check_order=False)
    node.apply(THREE)
    node.apply(MID_LIST)
    node.check_order = True
    assert node.plan(MID_LIST).empty
    assert node.warnings == [
        "service dns: this balancer's kernel lists its real servers as pi9, pi3, pi2, pi1 "
        "(head first), not as a start of keepalived would: a restart or reboot of this balancer "
        "would fill another mh table than the other balancers', and flows the router moves "
        "between them could reach another worker; `lbctl doctor --all` shows whether the "
        "balancers differ, and how to rebuild",
        "service web: this balancer's kernel lists its real servers as pi9, pi3, pi2, pi1 "
        "(head first), not as a start of keepalived would: a restart or reboot of this balancer "
        "would fill another mh table than the other balancers', and flows the router moves "
        "between them could reach another worker; `lbctl doctor --all` shows whether the "
        "balancers differ, and how to rebuild"]
    node.apply(MID_LIST.replace(PI3, PI3 + PI8))  # an append still goes
    restart(node)  # the file's order
    assert web_order(node) == ["192.168.100.8", "192.168.100.6", "192.168.100.9",
                               "192.168.100.4", "192.168.100.3"]
    assert node.plan(MID_LIST.replace(PI3, PI3 + PI8)).empty and not node.warnings


def test_a_failover_pair_takes_any_order():
    """Its backup takes the synced connections over, not a router's moved
    flows: keepalived's config follows the file, and no order is refused."""
    def as_pair(text):
        return routed(text.replace("mode: ecmp\n", "").replace(
            "bgp:\n  as: 65001\n  router: {address: 192.168.100.1, as: 65000}\n", "").replace(
            "  lb3: {address: 192.168.100.7, interface: eth0}\n", ""))
    node = balancer()
    node.apply(as_pair(THREE))
    node.apply(as_pair(MID_LIST))
    assert not node.warnings
    restart(node)
    assert web_order(node) == ["192.168.100.6", "192.168.100.9", "192.168.100.4",
                               "192.168.100.3"]


def test_a_real_server_deleted_by_hand_is_warned_of_and_the_file_still_applies():
    """Not the file's doing: status, drain and the exporter, which load the
    file as applied, must go on working."""
    node = balancer()
    node.apply(THREE)
    web = [d for d in node.adapters.ipvs.dests if d.service.port == 80]
    del node.adapters.ipvs.dests[next(d for d in web if str(d.address) == "192.168.100.4")]
    assert node.plan(THREE).empty
    assert [w.split(":")[0] for w in node.warnings] == ["service web"]
    assert "lists its real servers as pi3, pi1 (head first)" in node.warnings[0]
