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
from lbctl.engine.table_order import configured_real_servers
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

    configured = set()  # the DestKeys of keepalived's config as last read

    def fill(fresh):
        if fresh:
            ipvs.services.clear()
            ipvs.dests.clear()
            configured.clear()
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
                if dest not in configured:  # not one it believes in (deleted by hand)
                    ipvs.dests.setdefault(dest, [1, FWD_DIRECT_ROUTING, 0])  # at the head
            configured.difference_update(d for d in list(configured) if d.service == key)
            configured.update(wanted)

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
    restart(node)  # a reboot (a crash leaves the kernel's list as it was: no flush)
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


def pi2_leaving_slowly():
    """A balancer that applied the file without pi2 while pi2 had connections."""
    node = balancer()
    node.apply(THREE)
    for dest, entry in node.adapters.ipvs.dests.items():
        if str(dest.address) == "192.168.100.4":
            entry[2] = 3  # active connections: it leaves slowly
    node.apply(WITHOUT_PI2)
    return node


def test_a_worker_added_back_while_the_table_still_holds_it_is_refused_out_of_place():
    """A worker dropped from the file stays in the table, at weight 0 and at
    its old place, while it has connections.  Added back at the end, a
    reload would leave it at its old place and a restart would not."""
    node = pi2_leaving_slowly()
    assert "192.168.100.4" in web_order(node)
    error = refusal(node, WITHOUT_PI2.replace(PI3, PI3 + PI2))
    assert "services.web: worker pi3 is not where this balancer's table has it" in error, error
    assert "pi2 left the service but is still in this balancer's table" in error
    assert "wait until every balancer has dropped it (`lbctl status --all`)" in error
    assert "`apply --force` of the file without it" in error
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
        "balancers differ, and how to rebuild (where every balancer lists them so, the file's "
        "workers put in that order mend it with no restart)",
        "service web: this balancer's kernel lists its real servers as pi9, pi3, pi2, pi1 "
        "(head first), not as a start of keepalived would: a restart or reboot of this balancer "
        "would fill another mh table than the other balancers', and flows the router moves "
        "between them could reach another worker; `lbctl doctor --all` shows whether the "
        "balancers differ, and how to rebuild (where every balancer lists them so, the file's "
        "workers put in that order mend it with no restart)"]
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


def delete_by_hand(node, address, port=80):
    """`ipvsadm -d` of a real server of web: keepalived still believes it in."""
    web = [d for d in node.adapters.ipvs.dests if d.service.port == 80]
    del node.adapters.ipvs.dests[next(d for d in web if str(d.address) == address
                                      and d.port == port)]


def test_a_worker_appended_after_a_real_server_deleted_by_hand_still_applies():
    """keepalived does not add back the one deleted (it is in both configs),
    so only the new one heads the list: not a change of this apply's."""
    node = balancer()
    node.apply(THREE)
    delete_by_hand(node, "192.168.100.4")
    node.apply(APPENDED)
    assert web_order(node) == ["192.168.100.9", "192.168.100.6", "192.168.100.3"]
    assert node.plan(APPENDED).empty
    assert [w.split(":")[0] for w in node.warnings] == ["service web"]
    assert "lists its real servers as pi9, pi3, pi1 (head first)" in node.warnings[0]


def test_a_worker_added_mid_list_is_refused_on_a_balancer_that_differed_already():
    node = balancer(check_order=False)
    node.apply(THREE)
    node.apply(MID_LIST)  # an older lbctl's reload
    node.check_order = True
    error = refusal(node, MID_LIST.replace(PI2, PI2 + PI8))
    assert "services.web: worker pi8 is new to this balancer's table and stands before " \
           "pi3, which the table has" in error, error


@pytest.mark.parametrize("saved_copy", ["missing", "unloadable"])
def test_a_worker_added_mid_list_is_refused_without_a_saved_copy(saved_copy):
    node = balancer()
    node.apply(THREE)
    if saved_copy == "missing":
        del node.adapters.files.files[LAYOUT.saved_copy]
    else:
        node.adapters.files.files[LAYOUT.saved_copy] = "services: [\n"
    node.applied_before = lambda: None  # as engine/node.py's _applied_here gives it
    error = refusal(node, MID_LIST)
    assert "services.web: worker pi9 is new to this balancer's table" in error, error


def test_real_servers_are_told_apart_by_port():
    """A real server added by hand at the worker's address on another port is
    another real server: the worker appended is still new, and heads the list."""
    node = balancer()
    node.apply(THREE)
    web = next(s for s in node.adapters.ipvs.services if s.port == 80)
    dests = node.adapters.ipvs.dests
    by_hand = {DestKey(web, IPv4Address("192.168.100.9"), 8080): [1, FWD_DIRECT_ROUTING, 0]}
    node.adapters.ipvs.dests = {**by_hand, **dests}  # at the tail of the kernel's list
    node.apply(APPENDED)
    assert web_order(node)[:4] == ["192.168.100.9", "192.168.100.6", "192.168.100.4",
                                   "192.168.100.3"]


def test_a_workers_new_address_in_mid_list_is_named_as_such():
    node = balancer()
    node.apply(THREE)
    error = refusal(node, THREE.replace("pi2: {address: 192.168.100.4}",
                                        "pi2: {address: 192.168.100.14}"))
    assert "services.web: worker pi2 moves from 192.168.100.4 to 192.168.100.14: to this " \
           "balancer's table that is a new real server, and it stands before pi3" in error, error
    assert "move pi2 after the others (here after pi3) as its address changes" in error
    # So it goes in one apply: the new address heads the list, the old one leaves.
    moved = THREE.replace(PI2, "").replace(PI3, PI3 + "  pi2: {address: 192.168.100.14}\n")
    node.apply(moved)
    assert web_order(node) == ["192.168.100.14", "192.168.100.6", "192.168.100.3"]
    assert node.plan(moved).empty and not node.warnings


def test_a_balancer_that_missed_the_removal_is_told_to_apply_it_first():
    """The others took pi2 out, then in again at the end; this one missed
    the first apply and still holds pi2 at its old place."""
    node = balancer()
    node.apply(THREE)
    error = refusal(node, WITHOUT_PI2.replace(PI3, PI3 + PI2))
    assert "services.web: worker pi3 is not where this balancer's table has it" in error, error
    assert "this balancer missed the apply that took it out: apply that file here first" \
        in error
    node.apply(WITHOUT_PI2)
    node.apply(WITHOUT_PI2.replace(PI3, PI3 + PI2))
    assert web_order(node) == ["192.168.100.4", "192.168.100.6", "192.168.100.3"]


def test_the_saved_copy_is_read_from_the_balancers_layout_and_an_unloadable_one_is_none(tmp_path):
    from lbctl.engine.node import _applied_here

    assert _applied_here("pi-web", str(tmp_path)) is None
    saved = tmp_path / LAYOUT.saved_copy.lstrip("/")
    saved.parent.mkdir(parents=True)
    saved.write_text(THREE)
    applied = _applied_here("pi-web", str(tmp_path))
    assert [w for w in applied.workers] == ["pi1", "pi2", "pi3"]
    saved.write_text("services: [\n")
    assert _applied_here("pi-web", str(tmp_path)) is None


def without_saved_copy(node):
    del node.adapters.files.files[LAYOUT.saved_copy]
    node.applied_before = lambda: None


def test_without_a_saved_copy_a_real_server_deleted_by_hand_is_warned_of_not_refused():
    """keepalived's config on disk still lists it: keepalived will not add it
    on a reload, so it is no new worker, and status goes on working."""
    node = balancer()
    node.apply(THREE)
    delete_by_hand(node, "192.168.100.4")
    without_saved_copy(node)
    node.plan(THREE)  # no ConfigError
    assert [w.split(":")[0] for w in node.warnings] == ["service web"]


def test_without_a_saved_copy_a_reorder_is_refused_from_keepalived_s_config():
    node = balancer()
    node.apply(THREE)
    without_saved_copy(node)
    error = refusal(node, ECMP.replace(PI2, PI3 + PI2))
    assert "services.web: worker pi3 is not where this balancer's table has it" in error, error


def test_keepalived_s_config_is_read_back_in_its_order_with_the_leaving_real_servers():
    node = pi2_leaving_slowly()
    read = configured_real_servers(node.adapters.files.read(LAYOUT.conf)[0])
    web = next(k for k in read if k.port == 80)
    assert web.protocol == "tcp" and str(web.vip) == "10.200.0.10"
    assert [(str(a), p) for a, p in read[web]] == [
        ("192.168.100.3", 80), ("192.168.100.6", 80), ("192.168.100.4", 80)]
    dns = next(k for k in read if k.port == 53)
    assert dns.protocol == "udp" and [str(a) for a, _p in read[dns]] == [
        "192.168.100.3", "192.168.100.6", "192.168.100.4"]


def test_every_checked_real_server_of_an_ecmp_balancer_is_inhibited_not_deleted_on_failure():
    """Without inhibit_on_failure keepalived deletes a failing real server
    and adds it back at the head of the kernel's list: every check flap
    would reorder the mh table on that balancer alone."""
    from helpers import cluster_from
    from lbctl.engine.desired import desired_state

    checked = THREE.replace("scheduler_flags: [mh-port]}",
                            "scheduler_flags: [mh-port], health: {http: {path: /}}}").replace(
        "protocol: udp, scheduler: mh}", "protocol: udp, scheduler: mh, "
        "health: {exec: {command: [/bin/true]}}}")
    state = desired_state(cluster_from(checked), "lb1", "eth0", layout=LAYOUT)
    conf = state.files[LAYOUT.conf].content
    servers = conf.split("real_server ")[1:]
    assert len(servers) == 6
    assert all("inhibit_on_failure" in block.split("\n    }")[0] for block in servers), conf


def test_an_older_lbctl_s_order_is_mended_by_giving_the_file_that_order():
    """Every balancer reloaded the same mid-list add: put the file's workers in
    the kernel's order and the warning goes, with no restart."""
    node = balancer(check_order=False)
    node.apply(THREE)
    node.apply(MID_LIST)  # pi9, pi3, pi2, pi1 (head first)
    node.check_order = True
    kernel_order = ECMP.replace(PI2, PI2 + PI3 + PI9)  # the file's last heads the list
    node.apply(kernel_order)
    assert node.plan(kernel_order).empty and not node.warnings
    restart(node)
    assert web_order(node) == ["192.168.100.9", "192.168.100.6", "192.168.100.4",
                               "192.168.100.3"]
