"""lbctl drain: the record, and what a drained worker means to each engine."""

import json
from ipaddress import IPv4Address

import pytest

from helpers import PI_SINGLE, cluster_from
from lbctl.adapters.files import FilesRoot
from lbctl.adapters.protocols import IpvsDest, IpvsService
from lbctl.config.model import DestKey, ServiceKey
from lbctl.engine.desired import SAVED_COPY_HEADER, BootApply, desired_state
from lbctl.records.drains import drained_dests, read_drains, with_drain, without_drain, write_drains
from lbctl.errors import NodeError
from lbctl.status.health import Reported, ipvs_drift
from lbctl.engine.plan import make_plan
from lbctl.layout import Layout
from lbctl.state import DestSpec, NodeState, Ownership

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
DNS = ServiceKey("udp", IPv4Address("192.168.100.11"), 53)
PI2_WEB = DestKey(WEB, IPv4Address("192.168.100.4"), 80)
PI2_DNS = DestKey(DNS, IPv4Address("192.168.100.4"), 53)
PAIR = PI_SINGLE.replace(
    "  lb1: {address: 192.168.100.2, interface: eth0}\n",
    "  lb1: {address: 192.168.100.2, interface: eth0}\n"
    "  lb2: {address: 192.168.100.5, interface: eth0}\n").replace(
    "scheduler: wrr}", "scheduler: wrr, health: {http: {path: /}}}")


def test_a_drain_covers_every_service_of_the_worker_unless_one_is_named():
    cluster = cluster_from()
    everywhere = with_drain({}, "pi2", None, 100.0)
    assert set(drained_dests(cluster, everywhere)) == {PI2_WEB, PI2_DNS}
    web_only = with_drain({}, "pi2", "web", 100.0)
    assert set(drained_dests(cluster, web_only)) == {PI2_WEB}
    # A second service adds to the first; the time of the first drain stays.
    both = with_drain(web_only, "pi2", "dns", 200.0)
    assert set(drained_dests(cluster, both)) == {PI2_WEB, PI2_DNS}
    assert both["pi2"].since == 100.0


def test_undrain_of_one_service_leaves_the_others_drained():
    cluster = cluster_from()
    drains = with_drain({}, "pi2", None, 100.0)
    left = without_drain(drains, cluster, "pi2", "web")
    assert set(drained_dests(cluster, left)) == {PI2_DNS}
    assert without_drain(left, cluster, "pi2", "dns") == {}
    assert without_drain(drains, cluster, "pi2", None) == {}


def test_the_record_round_trips_and_a_damaged_one_is_refused(tmp_path):
    files = FilesRoot(str(tmp_path))
    drains = with_drain(with_drain({}, "pi2", None, 100.0, {str(PI2_WEB): 3}), "pi3", "web",
                        150.0)
    write_drains(files, "pi-web", drains)
    assert read_drains(files, "pi-web") == drains
    assert read_drains(files, "pi-web")["pi2"].weights == {str(PI2_WEB): 3}
    path = tmp_path / Layout("pi-web").drain_record.lstrip("/")
    assert json.loads(path.read_text())["format"] == 1
    written = json.loads(path.read_text())
    written["drained"]["pi2"]["weights"] = {str(PI2_WEB): "3"}
    path.write_text(json.dumps(written))
    with pytest.raises(NodeError, match="pi2: weights must map real servers to weights"):
        read_drains(files, "pi-web")
    path.write_text("{not json")
    with pytest.raises(NodeError, match="damaged.*delete it to undrain every worker"):
        read_drains(files, "pi-web")
    path.write_text(json.dumps({"format": 9, "drained": {}}))
    with pytest.raises(NodeError, match="newer lbctl"):
        read_drains(files, "pi-web")
    # Undraining the last worker deletes the record.
    write_drains(files, "pi-web", {})
    assert not path.exists()


def test_a_drained_worker_is_at_weight_0_on_the_netlink_engine_and_apply_keeps_it():
    cluster = cluster_from()
    drained = set(drained_dests(cluster, with_drain({}, "pi2", None, 1.0)))
    desired = desired_state(cluster, "lb1", "eth0", drained=drained)
    assert desired.dests[PI2_WEB] == DestSpec(0) and desired.dests[PI2_DNS] == DestSpec(0)
    assert desired.dests[DestKey(WEB, IPv4Address("192.168.100.6"), 80)] == DestSpec(2)
    # A node drained by hand earlier: apply plans nothing for the drained worker.
    observed = NodeState("balancer", "lb1", "pi-web", services=dict(desired.services),
                         dests=dict(desired.dests), addresses=set(desired.addresses),
                         sysctls=dict(desired.sysctls))
    assert make_plan(desired, observed, Ownership.of(desired)).empty


def test_keepalived_config_gives_a_drained_worker_weight_0_and_keeps_its_checks():
    cluster = cluster_from(PAIR)
    drained = set(drained_dests(cluster, with_drain({}, "pi2", "web", 1.0)))
    desired = desired_state(cluster, "lb1", "eth0", layout=Layout("pi-web"),
                            drained=drained, boot=BootApply(PAIR, "/usr/bin/python3"))
    conf = desired.files["/etc/lbctl/pi-web/keepalived.conf"].content
    pi2 = conf.split("real_server 192.168.100.4 80 {")[1].split("real_server")[0]
    assert "weight 0" in pi2 and "HTTP_GET" in pi2
    pi3 = conf.split("real_server 192.168.100.6 80 {")[1]
    assert "weight 2" in pi3
    # The dns service is not drained.
    assert "weight 1" in conf.split("real_server 192.168.100.4 53 {")[1]
    # keepalived starting over an existing table: the drained one starts at 0.
    assert desired.start_dests[PI2_WEB] == DestSpec(0)
    # The file as applied is kept, for drain and status to take names and weights from.
    assert desired.files["/etc/lbctl/pi-web.yaml"].content == SAVED_COPY_HEADER + PAIR


def test_the_table_check_expects_a_healthy_drained_worker_at_weight_0():
    cluster = cluster_from(PAIR)
    up = {f"health.web@{w}": Reported("up", 1.0) for w in ("pi1", "pi2", "pi3")}

    def web(pi2_weight):
        return [IpvsService(WEB, str(WEB), "wrr", 0, (
            IpvsDest(IPv4Address("192.168.100.3"), 80, 1, 3),
            IpvsDest(IPv4Address("192.168.100.4"), 80, pi2_weight, 3),
            IpvsDest(IPv4Address("192.168.100.6"), 80, 2, 3))),
            IpvsService(DNS, str(DNS), "rr", 0, (
                IpvsDest(IPv4Address("192.168.100.3"), 53, 1, 3),
                IpvsDest(IPv4Address("192.168.100.4"), 53, 1, 3)))]

    assert ipvs_drift(cluster, up, web(0), drained={PI2_WEB}) == ([], [])
    problems, _ = ipvs_drift(cluster, up, web(1), drained={PI2_WEB})
    assert problems == ["service web: worker pi2 (192.168.100.4:80) has weight 1, it is drained"]
    problems, _ = ipvs_drift(cluster, up, web(0))
    assert problems == ["service web: worker pi2 (192.168.100.4:80) has weight 0, "
                        "the file says 1"]


def test_a_drain_is_refused_when_it_would_leave_a_service_without_a_worker():
    from lbctl.commands.drain import check_capacity
    from lbctl.errors import UsageError

    cluster = cluster_from(PAIR)
    pi1_dns = DestKey(DNS, IPv4Address("192.168.100.3"), 53)

    def table(pi1, pi3):
        """The kernel's weights now: a failed or unchecked worker is at 0 there."""
        return [IpvsService(WEB, str(WEB), "wrr", 0, (
            IpvsDest(IPv4Address("192.168.100.3"), 80, pi1, 3),
            IpvsDest(IPv4Address("192.168.100.4"), 80, 1, 3),
            IpvsDest(IPv4Address("192.168.100.6"), 80, pi3, 3))),
            IpvsService(DNS, str(DNS), "rr", 0, (
                IpvsDest(IPv4Address("192.168.100.3"), 53, 1, 3),
                IpvsDest(IPv4Address("192.168.100.4"), 53, 1, 3)))]

    # dns has pi1 and pi2: pi2 drained after pi1 leaves it none.
    with pytest.raises(UsageError, match=r"service dns with no worker .*\(pi1 drained, "
                                         r"pi2 drained\).*--force"):
        check_capacity(cluster, {pi1_dns, PI2_DNS}, table(1, 2), "pi2")
    check_capacity(cluster, {PI2_DNS}, table(1, 2), "pi2")
    # web: pi1 and pi3 at weight 0 (failed checks), so draining pi2 leaves nobody.
    with pytest.raises(UsageError, match=r"service web .*\(pi1 at weight 0, pi2 drained, "
                                         r"pi3 at weight 0\)"):
        check_capacity(cluster, {PI2_WEB}, table(0, 0), "pi2")
    check_capacity(cluster, {PI2_WEB}, table(0, 2), "pi2")


def test_a_drain_carries_out_the_workers_weights_and_keepalived_only():
    from lbctl.commands.drain import drain_changes
    from lbctl.engine.plan import Change, Plan

    plan = Plan("lb1", "balancer", "pi-web", changes=[
        Change("change", "real server", PI2_WEB, DestSpec(0), DestSpec(1)),
        Change("change", "real server", PI2_DNS, DestSpec(0), DestSpec(1)),
        Change("add", "address", "192.168.100.12/32 dev eth0"),
        Change("change", "file", "/etc/lbctl/pi-web/keepalived.conf"),
        Change("change", "file", "/etc/lbctl/pi-web/announce.slots"),
        Change("change", "file", "/etc/lbctl/pi-web.yaml"),
        Change("change", "keepalived", "reload")])
    kept = drain_changes(plan, {PI2_WEB, PI2_DNS}, {"/etc/lbctl/pi-web/keepalived.conf",
                                                     "/etc/lbctl/pi-web/announce.slots"})
    assert [c.key for c in kept] == [PI2_WEB, PI2_DNS, "/etc/lbctl/pi-web/keepalived.conf",
                                     "/etc/lbctl/pi-web/announce.slots", "reload"]
