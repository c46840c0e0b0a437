"""The executor against in-memory adapters: order, draining, failures, and convergence."""

import errno
from ipaddress import IPv4Address

import pytest

from fakes import FakeAddresses, FakeFiles, FakeIpvs, FakeSysctls
from helpers import PI_SINGLE, cluster_from
from lbctl.adapters.protocols import Adapters
from lbctl.config.model import DestKey, ServiceKey
from lbctl.engine.desired import desired_state
from lbctl.errors import ApplyError
from lbctl.engine.execute import execute
from lbctl.engine.observe import observe
from lbctl.records.ownership import read_ownership
from lbctl.engine.plan import fingerprint, make_plan
from lbctl.state import ServiceSpec

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
PI2 = DestKey(WEB, IPv4Address("192.168.100.4"), 80)
WITHOUT_PI2 = PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, workers: [pi1, pi3]}")


class Node:
    """One simulated node: fakes for every adapter, and apply as lbctl runs it."""

    def __init__(self, name="lb1"):
        self.name = name
        self.adapters = Adapters(
            ipvs=FakeIpvs() if name == "lb1" else None,
            addresses=FakeAddresses({(IPv4Address("192.168.100.2"), 24, "eth0")}),
            sysctls=FakeSysctls(), files=FakeFiles())

    def plan(self, text=PI_SINGLE, force=False):
        cluster = cluster_from(text)
        desired = desired_state(cluster, self.name, "eth0")
        owned = read_ownership(self.adapters.files, self.adapters.ownership_dir, cluster.name)
        observed = observe(desired, owned, self.adapters, self.adapters.addresses.list())
        return make_plan(desired, observed, owned, force=force)

    def apply(self, text=PI_SINGLE, force=False):
        return execute(self.plan(text, force), self.adapters)


def test_apply_then_reapply_makes_zero_writes():
    node = Node()
    first = node.apply()
    assert first.writes == 2 + 2 + 2 + 5 + 1  # addresses, sysctls, services, real servers, record
    assert node.plan().empty
    assert node.apply().writes == 0


def test_services_are_added_before_real_servers_and_removals_come_last():
    node = Node()
    node.apply()
    node.adapters.ipvs.log.clear()
    text = WITHOUT_PI2.replace("scheduler: wrr,", "scheduler: rr,")
    node.apply(text)
    assert node.adapters.ipvs.log == [
        ("set", "service", "tcp 192.168.100.10:80"),
        ("set", "dest", str(PI2)),  # weight 0 first
        ("del", "dest", str(PI2)),  # idle, so deleted in the same apply
    ]


def test_a_drained_real_server_is_read_back_with_its_service_alone():
    node = Node()
    node.apply()
    node.adapters.ipvs.dumped.clear()
    node.apply(WITHOUT_PI2)
    # The plan read the whole table; whether pi2 is idle, only its service.
    assert node.adapters.ipvs.dumped == [None, {WEB}]
    assert PI2 not in node.adapters.ipvs.dests


def test_a_busy_real_server_stays_at_weight_zero_until_a_later_apply_finds_it_idle():
    node = Node()
    node.apply()
    node.adapters.ipvs.set_active(PI2, 2)
    report = node.apply(WITHOUT_PI2)
    assert [str(c.key) for c in report.pending] == [str(PI2)]
    assert node.adapters.ipvs.dests[PI2][0] == 0
    assert not node.plan(WITHOUT_PI2).empty  # still draining
    assert node.apply(WITHOUT_PI2).writes == 0  # nothing to do while busy
    node.adapters.ipvs.set_active(PI2, 0)
    node.apply(WITHOUT_PI2)
    assert PI2 not in node.adapters.ipvs.dests
    assert node.plan(WITHOUT_PI2).empty


def test_force_deletes_a_busy_real_server_at_once():
    node = Node()
    node.apply()
    node.adapters.ipvs.set_active(PI2, 2)
    node.apply(WITHOUT_PI2, force=True)
    assert PI2 not in node.adapters.ipvs.dests


def test_a_refused_real_server_names_the_object_and_the_next_apply_converges():
    node = Node()
    pi3 = DestKey(WEB, IPv4Address("192.168.100.6"), 80)
    node.adapters.ipvs.fail[("add", "dest", pi3)] = errno.EINVAL
    with pytest.raises(ApplyError) as err:
        node.apply()
    assert str(err.value).startswith(
        "apply: add real server tcp 192.168.100.10:80 -> 192.168.100.6:80: the kernel refused it")
    # Ownership was widened before anything was created.
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, "pi-web")
    assert WEB in owned.services
    node.adapters.ipvs.fail.clear()
    node.apply()
    assert node.plan().empty


def test_a_worker_writes_sysctls_files_and_the_boot_link():
    node = Node("pi1")
    node.adapters.addresses.entries = {(IPv4Address("192.168.100.3"), 24, "eth0")}
    node.apply()
    assert node.adapters.sysctls.values["net.ipv4.conf.all.arp_ignore"] == "1"
    assert "/etc/sysctl.d/90-lbctl-pi-web.conf" in node.adapters.files.files
    assert node.adapters.files.links
    assert (IPv4Address("192.168.100.10"), 32, "lo") in node.adapters.addresses.entries
    assert node.plan().empty


WITH_FLAGS = PI_SINGLE.replace(
    "protocol: udp, scheduler: rr,",
    "protocol: udp, scheduler: sh, scheduler_flags: [sh-port], one_packet: true,")
WITH_TIMEOUTS = "ipvs: {timeouts: {tcp: 600, udp: 20}}\n" + PI_SINGLE


def test_scheduler_flags_and_one_packet_are_planned_and_a_change_shows_both_sides():
    node = Node()
    node.apply()
    plan = node.plan(WITH_FLAGS)
    assert [str(c) for c in plan.changes] == [
        "~ service udp 192.168.100.11:53 scheduler rr -> scheduler sh flags ops,sh-port"]
    node.apply(WITH_FLAGS)
    assert node.plan(WITH_FLAGS).empty
    # Dropping a flag from the file clears it, and the plan says so.
    without_port = WITH_FLAGS.replace("scheduler_flags: [sh-port], ", "")
    assert [str(c) for c in node.plan(without_port).changes] == [
        "~ service udp 192.168.100.11:53 scheduler sh flags ops,sh-port"
        " -> scheduler sh flags ops"]


def test_declared_ipvs_timeouts_are_set_and_undeclared_ones_left_alone():
    node = Node()
    node.adapters.ipvs.kernel_timeouts["tcp_fin"] = 45  # set by hand: not the file's
    node.apply()
    assert node.adapters.ipvs.timeouts() == {"tcp": 900, "tcp_fin": 45, "udp": 300}
    plan = node.plan(WITH_TIMEOUTS)
    assert [str(c) for c in plan.changes] == ["~ ipvs timeout tcp = 600s (now 900s)",
                                              "~ ipvs timeout udp = 20s (now 300s)"]
    node.apply(WITH_TIMEOUTS)
    assert node.adapters.ipvs.timeouts() == {"tcp": 600, "tcp_fin": 45, "udp": 20}
    assert node.plan(WITH_TIMEOUTS).empty


def test_a_timeout_the_file_drops_goes_back_to_the_kernels_value_from_before():
    node = Node()
    node.adapters.ipvs.kernel_timeouts["udp"] = 120  # what this host had before lbctl
    node.apply(WITH_TIMEOUTS)
    # Someone changes udp after lbctl did; the file then stops setting it.
    node.apply(WITH_TIMEOUTS.replace(", udp: 20", ""))
    assert node.adapters.ipvs.timeouts() == {"tcp": 600, "tcp_fin": 120, "udp": 120}
    assert node.plan(WITH_TIMEOUTS.replace(", udp: 20", "")).empty
    # With udp forgotten by the record, a later change by hand stays.
    node.adapters.ipvs.kernel_timeouts["udp"] = 77
    assert [str(c) for c in node.plan(PI_SINGLE).changes] == [
        "~ ipvs timeout tcp = 900s, as before lbctl set it (now 600s)"]
    node.apply(PI_SINGLE)
    assert node.adapters.ipvs.timeouts() == {"tcp": 900, "tcp_fin": 120, "udp": 77}
    assert node.plan(PI_SINGLE).empty


class RemovingNode(Node):
    def remove_plan(self, text=PI_SINGLE):
        from lbctl.state import NodeState

        cluster = cluster_from(text)
        desired = NodeState("worker" if self.name.startswith("pi") else "balancer", self.name,
                            cluster.name)
        owned = read_ownership(self.adapters.files, self.adapters.ownership_dir, cluster.name)
        observed = observe(desired, owned, self.adapters, self.adapters.addresses.list())
        return make_plan(desired, observed, owned)


@pytest.mark.parametrize("name", ["lb1", "pi1"])
def test_remove_takes_back_everything_lbctl_made_and_only_that(name):
    node = RemovingNode(name)
    foreign = ServiceKey("tcp", IPv4Address("192.168.100.99"), 443)
    if node.adapters.ipvs is not None:
        node.adapters.ipvs.services[foreign] = ServiceSpec("wlc")
    # The kernel's values before lbctl: every sysctl lbctl sets, and one it does not.
    for key in desired_state(cluster_from(), name, "eth0").sysctls:
        node.adapters.sysctls.values[key] = "0"
    node.adapters.sysctls.values["net.ipv4.ip_forward"] = "1"
    node.adapters.files.write("/etc/sysctl.d/99-admin.conf", "x=1\n", 0o644)
    sysctls_before = dict(node.adapters.sysctls.values)
    files_before = dict(node.adapters.files.files)
    addresses_before = node.adapters.addresses.list()
    node.apply()
    assert node.adapters.files.files != files_before

    plan = node.remove_plan()
    kinds = [c.kind for c in plan.changes]
    if name == "pi1":
        # The worker stops holding the VIP before it answers ARP for it again.
        assert kinds.index("address") < kinds.index("sysctl")
    execute(plan, node.adapters)

    assert node.adapters.files.files == files_before  # the record, units and sysctl.d file gone
    assert node.adapters.files.links == {}
    assert node.adapters.addresses.list() == addresses_before
    assert node.adapters.sysctls.values == sysctls_before
    if node.adapters.ipvs is not None:
        assert list(node.adapters.ipvs.services) == [foreign]
    assert node.remove_plan().empty


def test_the_ownership_record_names_its_format_and_a_newer_one_is_refused():
    import json

    from lbctl.errors import NodeError

    node = Node()
    node.apply()
    record = json.loads(node.adapters.files.files["/var/lib/lbctl/pi-web.json"][0])
    assert record["format"] == 1
    node.adapters.files.files["/var/lib/lbctl/pi-web.json"] = (
        json.dumps(record | {"format": 2}), 0o644)
    with pytest.raises(NodeError, match="written by a newer lbctl .*upgrade lbctl"):
        node.plan()


def test_keep_leaving_holds_a_worker_s_old_vip_until_the_second_pass():
    node = Node("pi1")
    node.apply()
    without_dns = PI_SINGLE.replace(
        "  dns: {vip: 192.168.100.11, port: 53, protocol: udp, scheduler: rr, workers: [pi1, pi2]}\n",
        "")
    cluster = cluster_from(without_dns)
    desired = desired_state(cluster, "pi1", "eth0")
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, cluster.name)
    observed = observe(desired, owned, node.adapters, node.adapters.addresses.list())
    first = make_plan(desired, observed, owned, keep_leaving=True)
    # The first pass (before the balancers) keeps the VIP and its ownership.
    assert [str(c) for c in first.deferred] == ["- address 192.168.100.11/32 dev lo"]
    execute(first, node.adapters)
    assert (IPv4Address("192.168.100.11"), 32, "lo") in node.adapters.addresses.list()
    # The second pass, after the balancers, removes it: it is still known as lbctl's.
    second = node.plan(without_dns)
    assert [str(c) for c in second.changes] == ["- address 192.168.100.11/32 dev lo"]
    execute(second, node.adapters)
    assert (IPv4Address("192.168.100.11"), 32, "lo") not in node.adapters.addresses.list()


def test_a_worker_s_first_pass_matches_the_fingerprint_of_the_plan_shown():
    """apply --all shows the whole plan, then applies a worker with its
    removals held back: the same plan, by its fingerprint.  A change made on
    the node in between is a different plan."""
    node = Node("pi1")
    node.apply()
    without_dns = cluster_from(PI_SINGLE.replace(
        "  dns: {vip: 192.168.100.11, port: 53, protocol: udp, scheduler: rr, workers: [pi1, pi2]}\n",
        ""))
    desired = desired_state(without_dns, "pi1", "eth0")
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, without_dns.name)

    def plan(**kwargs):
        observed = observe(desired, owned, node.adapters, node.adapters.addresses.list())
        return make_plan(desired, observed, owned, **kwargs)

    shown = fingerprint(plan())
    assert fingerprint(plan(keep_leaving=True)) == shown
    # Someone sets arp_ignore back by hand before the answer: one more change.
    node.adapters.sysctls.values["net.ipv4.conf.all.arp_ignore"] = "0"
    assert fingerprint(plan(keep_leaving=True)) != shown


def remove_plan_of(node, shared=()):
    from lbctl.state import NodeState

    cluster = cluster_from()
    desired = NodeState("worker", node.name, cluster.name)
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, cluster.name)
    observed = observe(desired, owned, node.adapters, node.adapters.addresses.list())
    return make_plan(desired, observed, owned, shared_sysctls=shared)


def test_remove_leaves_alone_a_sysctl_another_cluster_here_also_sets():
    node = Node("pi1")
    node.adapters.sysctls.values.update({"net.ipv4.conf.all.arp_ignore": "0",
                                         "net.ipv4.conf.all.arp_announce": "0"})
    node.apply()
    plan = remove_plan_of(node, shared={"net.ipv4.conf.all.arp_ignore",
                                        "net.ipv4.conf.all.arp_announce"})
    assert [c for c in plan.changes if c.kind == "sysctl"] == []
    assert [c.kind for c in remove_plan_of(node).changes].count("sysctl") == 2


def test_a_record_from_before_0_2_never_restores_lbctl_s_own_values_as_the_node_s():
    import json

    node = Node("pi1")
    node.adapters.sysctls.values.update({"net.ipv4.conf.all.arp_ignore": "0",
                                         "net.ipv4.conf.all.arp_announce": "0"})
    node.apply()
    path = "/var/lib/lbctl/pi-web.json"
    old = json.loads(node.adapters.files.files[path][0])
    for key in ("format", "sysctls"):  # as lbctl 0.1 wrote it
        old.pop(key)
    node.adapters.files.files[path] = (json.dumps(old), 0o644)
    node.apply()  # the first apply after the upgrade
    record = json.loads(node.adapters.files.files[path][0])
    assert record["format"] == 1
    assert record["sysctls"] == {"net.ipv4.conf.all.arp_announce": None,
                                 "net.ipv4.conf.all.arp_ignore": None}
    # 1 and 2 are lbctl's values, not the node's: remove leaves them rather than "restore" them.
    assert [c for c in remove_plan_of(node).changes if c.kind == "sysctl"] == []


def test_a_balancer_announces_each_vip_it_adds_once_ipvs_serves_it_and_a_worker_none():
    node = Node()
    announce = node.adapters.addresses.announce
    served_by_then = []

    def announce_and_note(addresses):
        served_by_then.append(len(node.adapters.ipvs.dests))
        announce(addresses)
    node.adapters.addresses.announce = announce_and_note
    node.apply()
    assert served_by_then == [5]  # every real server in place first, and one call for all
    announced = [entry for entry in node.adapters.addresses.log if entry[0] == "announce"]
    assert announced == [("announce", "192.168.100.10/32 dev eth0"),
                         ("announce", "192.168.100.11/32 dev eth0")]
    node.adapters.addresses.log.clear()
    node.apply()  # a VIP already held is not announced again
    assert node.adapters.addresses.log == []

    worker = Node("pi1")
    worker.apply()
    assert [e for e in worker.adapters.addresses.log if e[0] == "add"]
    assert not [e for e in worker.adapters.addresses.log if e[0] == "announce"]


def test_a_vip_added_before_a_refused_change_is_still_announced():
    node = Node()
    pi3 = DestKey(WEB, IPv4Address("192.168.100.6"), 80)
    node.adapters.ipvs.fail[("add", "dest", pi3)] = errno.EINVAL
    with pytest.raises(ApplyError):
        node.apply()
    # The next apply finds the VIPs held and adds nothing: this was their one chance.
    assert [e for e in node.adapters.addresses.log if e[0] == "announce"] == [
        ("announce", "192.168.100.10/32 dev eth0"), ("announce", "192.168.100.11/32 dev eth0")]


def test_an_announcement_that_cannot_be_sent_is_a_warning_and_the_vip_stays():
    node = Node()

    def down(addresses):
        raise OSError(errno.ENETDOWN, "Network is down")
    node.adapters.addresses.announce = down
    report = node.apply()
    assert len(report.warnings) == 1
    assert report.warnings[0].startswith("could not announce 192.168.100.10, 192.168.100.11 "
                                         "with gratuitous ARP (Network is down)")
    assert (IPv4Address("192.168.100.10"), 32, "eth0") in node.adapters.addresses.entries
    assert node.plan().empty


def test_a_vip_another_host_answers_for_is_left_out_and_the_rest_applied():
    from lbctl.engine.execute import held_elsewhere_error

    node = Node()
    node.adapters.addresses.elsewhere = {IPv4Address("192.168.100.11"): "02:00:00:00:09:09"}
    report = node.apply()
    assert {str(a): mac for a, mac in report.held.items()} == {
        "192.168.100.11/32 dev eth0": "02:00:00:00:09:09"}
    entries = node.adapters.addresses.entries
    assert (IPv4Address("192.168.100.10"), 32, "eth0") in entries
    assert (IPv4Address("192.168.100.11"), 32, "eth0") not in entries
    # Not announced either, and every service and real server is in place.
    assert ("announce", "192.168.100.11/32 dev eth0") not in node.adapters.addresses.log
    assert len(node.adapters.ipvs.services) == 2 and len(node.adapters.ipvs.dests) == 5
    message = str(held_elsewhere_error(report.held))
    assert message.startswith("apply: add 192.168.100.11/32 dev eth0: another host on the LAN "
                              "answers ARP for 192.168.100.11 (by 02:00:00:00:09:09)"), message
    # Once the other host lets go, the next apply takes it.
    node.adapters.addresses.elsewhere = {}
    assert not node.apply().held
    assert (IPv4Address("192.168.100.11"), 32, "eth0") in entries


def test_a_vip_added_where_no_probe_could_go_out_says_so():
    node = Node()
    node.adapters.addresses.unasked = {"eth0": "its link is lowerlayerdown"}
    report = node.apply()
    assert (IPv4Address("192.168.100.10"), 32, "eth0") in node.adapters.addresses.entries
    assert report.warnings == [
        "added 192.168.100.10, 192.168.100.11 without asking whether another host on the LAN "
        "holds them: no ARP Probe went out on eth0 (its link is lowerlayerdown)"]


def test_after_a_pair_lets_go_the_probes_wait_for_its_peer_to_take_over():
    from lbctl.commands.apply import _peer_takeover_seconds
    from lbctl.engine.plan import CHANGE, REMOVE, Change, Kind, Plan
    from lbctl.state import FileSpec

    def plan(old_conf, new_conf=None):
        return Plan("lb1", "balancer", "pi-web", changes=[Change(
            CHANGE if new_conf else REMOVE, Kind.FILE, "/etc/lbctl/pi-web/keepalived.conf",
            new=FileSpec(new_conf) if new_conf else None, old=FileSpec(old_conf))])

    # Four of the old pair's adverts (three missed, and the skew) and a second.
    pair = "vrrp_instance lb {\n    advert_int 1\n}\n"
    assert plan(pair).pair_config_left == pair
    assert _peer_takeover_seconds(plan(pair)) == 5
    assert _peer_takeover_seconds(plan(pair.replace("advert_int 1", "advert_int 0.1"))) == 1.4
    assert _peer_takeover_seconds(plan(pair, "virtual_server 1 {}\n")) == 5  # one checked
    # Still a pair, or none before: no pair is left, lbctl's default interval.
    assert plan(pair, pair.replace("1", "2")).pair_config_left is None
    assert _peer_takeover_seconds(plan("virtual_server 1 {}\n")) == 4 * 0.2 + 1


def test_a_held_vip_is_not_claimed_in_the_ownership_record():
    node = Node()
    node.adapters.addresses.elsewhere = {IPv4Address("192.168.100.11"): "02:00:00:00:09:09"}
    report = node.apply()
    assert report.warnings and "answers ARP for 192.168.100.11" in report.warnings[0]
    from lbctl.records.ownership import read_ownership

    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, "pi-web")
    assert {str(a.ip) for a in owned.addresses} == {"192.168.100.10"}


def test_only_vips_about_to_be_added_on_the_lan_are_probed():
    node = Node()
    node.apply()
    node.adapters.addresses.log.clear()
    node.apply()  # held already: no probe, and no wait for one
    assert node.adapters.addresses.log == []
    worker = Node("pi1")  # on lo, answering no ARP: nothing to ask
    worker.apply()
    assert not [e for e in worker.adapters.addresses.log if e[0] == "probe"]


def test_every_kind_of_change_has_one_way_to_be_carried_out():
    from lbctl.engine.execute import LOCAL_HANDLERS
    from lbctl.engine.plan import DAEMON_KINDS, IPVS_KINDS, Kind

    # One at a time through its handler, IPVS in batches, the daemons through theirs.
    assert set(LOCAL_HANDLERS) | set(IPVS_KINDS) | set(DAEMON_KINDS) == set(Kind)
    assert not set(LOCAL_HANDLERS) & (set(IPVS_KINDS) | {Kind.KEEPALIVED})
