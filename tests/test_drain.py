"""A real server leaves the file: it drains first on both engines, and UDP flows count."""

from ipaddress import IPv4Address

from helpers import PI_SINGLE, cluster_from
from lbctl.adapters.protocols import IpvsDest, IpvsService
from lbctl.config.model import DestKey, ServiceKey
from lbctl.engine.desired import desired_state, leaving_real_servers
from lbctl.status.health import Reported, ipvs_drift
from lbctl.engine.plan import DRAIN, DRAINING, KEEPALIVED, REMOVE, fingerprint, make_plan
from lbctl.layout import Layout
from lbctl.state import DaemonSpec, DestSpec, NodeState, Ownership, ServiceSpec

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
DNS = ServiceKey("udp", IPv4Address("192.168.100.11"), 53)
PI1, PI2, PI3 = (IPv4Address(f"192.168.100.{n}") for n in (3, 4, 6))
PAIR = PI_SINGLE.replace(
    "  lb1: {address: 192.168.100.2, interface: eth0}\n",
    "  lb1: {address: 192.168.100.2, interface: eth0}\n"
    "  lb2: {address: 192.168.100.5, interface: eth0}\n")
# pi3 leaves the web service; pi2 leaves the dns service.
PAIR_SMALLER = PAIR.replace("workers: [pi1, pi2]}\n", "workers: [pi1]}\n") \
    .replace("scheduler: wrr}", "scheduler: wrr, workers: [pi1, pi2]}")
CONF = "/etc/lbctl/pi-web/keepalived.conf"


def table(pi3=(1, 0, 0), pi2_dns=(1, 0, 0)):
    """The kernel's table as the pair left it; (weight, active, inactive) of the leavers."""
    web = IpvsService(WEB, str(WEB), "wrr", 0, (
        IpvsDest(PI1, 80, 1, 3), IpvsDest(PI2, 80, 1, 3), IpvsDest(PI3, 80, *pi3[:1], 3, *pi3[1:])))
    dns = IpvsService(DNS, str(DNS), "rr", 0, (
        IpvsDest(PI1, 53, 1, 3), IpvsDest(PI2, 53, pi2_dns[0], 3, *pi2_dns[1:])))
    return [web, dns]


def keepalived_plan(ipvs, force=False, running=True):
    """keepalived's new config and the plan, with keepalived already running (a
    reload) or not yet (a start, over the table the kernel holds)."""
    cluster = cluster_from(PAIR_SMALLER)
    leaving = leaving_real_servers(cluster, ipvs)
    desired = desired_state(cluster, "lb1", "eth0", layout=Layout(cluster.name),
                            leaving=leaving, force=force)
    observed = NodeState("balancer", "lb1", "pi-web")
    observed.daemons = {"keepalived": DaemonSpec("keepalived", "")} if running else {}
    for svc in ipvs:
        observed.services[svc.key] = ServiceSpec(svc.scheduler, svc.persistence, svc.flags)
        for d in svc.dests:
            observed.dests[DestKey(svc.key, d.address, d.port)] = DestSpec(
                d.weight, d.forward, d.active, d.inactive)
    return desired, make_plan(desired, observed, Ownership(), force=force)


def conf_of(desired):
    return desired.files[CONF].content


def server_block(conf, address, port):
    return conf.split(f"real_server {address} {port} {{")[1].split("}")[0]


def test_a_busy_worker_dropped_under_keepalived_stays_at_weight_0_without_checks():
    desired, plan = keepalived_plan(table(pi3=(1, 4, 0)))
    block = server_block(conf_of(desired), PI3, 80)
    assert "weight 0" in block and "HTTP_GET" not in block and "MISC_CHECK" not in block
    (change,) = [c for c in plan.changes if c.kind == "real server"
                 and c.key == DestKey(WEB, PI3, 80)]
    assert (change.action, change.through) == (DRAIN, KEEPALIVED)
    assert "weight 1 -> 0, drain 4 active connections" in str(change)


def test_an_idle_worker_dropped_under_keepalived_leaves_its_config_at_once():
    desired, plan = keepalived_plan(table())
    assert f"real_server {PI3} 80" not in conf_of(desired)
    (change,) = [c for c in plan.changes if c.key == DestKey(WEB, PI3, 80)]
    assert change.action == REMOVE and "(idle)" in str(change)


def test_a_draining_worker_stays_until_idle_and_force_drops_it_at_once():
    desired, plan = keepalived_plan(table(pi3=(0, 2, 0)))
    assert "weight 0" in server_block(conf_of(desired), PI3, 80)
    (change,) = [c for c in plan.changes if c.key == DestKey(WEB, PI3, 80)]
    assert change.action == DRAINING
    forced, plan = keepalived_plan(table(pi3=(0, 2, 0)), force=True)
    assert f"real_server {PI3} 80" not in conf_of(forced)
    (change,) = [c for c in plan.changes if c.key == DestKey(WEB, PI3, 80)]
    assert change.action == REMOVE and "forced" in str(change)


def test_a_worker_that_drains_or_goes_at_once_is_the_same_plan_to_agree_to():
    """apply --all: the plan shown said pi3 leaves, busy (drain); by the answer
    its last connection has ended (delete).  Still the plan agreed to; a weight
    changed by hand in between is not."""
    busy, idle = keepalived_plan(table(pi3=(1, 2, 0)))[1], keepalived_plan(table(pi3=(1, 0, 0)))[1]
    assert [c.action for c in busy.changes if getattr(c.key, "address", None) == PI3] != \
        [c.action for c in idle.changes if getattr(c.key, "address", None) == PI3]
    assert fingerprint(busy) == fingerprint(idle)
    assert fingerprint(keepalived_plan(table(pi3=(0, 2, 0)))[1]) == fingerprint(busy)


def test_udp_flows_count_as_inactive_yet_keep_their_real_server_busy():
    assert DestSpec(0, active=0, inactive=3).in_use("udp") == 3
    assert DestSpec(0, active=0, inactive=3).in_use("tcp") == 0
    desired, plan = keepalived_plan(table(pi2_dns=(1, 0, 5)))
    assert "weight 0" in server_block(conf_of(desired), PI2, 53)
    (change,) = [c for c in plan.changes if c.key == DestKey(DNS, PI2, 53)]
    assert change.action == DRAIN and "drain 5 connections" in str(change)


def test_the_netlink_engine_keeps_a_udp_real_server_with_flows_draining():
    old = desired_state(cluster_from(PI_SINGLE), "lb1", "eth0")
    new = desired_state(cluster_from(PI_SINGLE.replace("workers: [pi1, pi2]}", "workers: [pi1]}")),
                        "lb1", "eth0")
    observed = NodeState("balancer", "lb1", "pi-web", set(old.addresses), dict(old.services),
                         dict(old.dests), dict(old.sysctls), dict(old.files), dict(old.links))
    observed.dests[DestKey(DNS, PI2, 53)] = DestSpec(0, active=0, inactive=2)
    (change,) = make_plan(new, observed, Ownership.of(old)).changes
    assert change.action == DRAINING


def test_the_health_comparison_expects_a_draining_server_at_weight_0():
    cluster = cluster_from(PAIR_SMALLER)
    up = {f"health.{s}@{w}": Reported("up", 1.0) for s in ("web", "dns") for w in ("pi1", "pi2")}
    draining = {DestKey(WEB, PI3, 80), DestKey(DNS, PI2, 53)}
    assert ipvs_drift(cluster, up, table(pi3=(0, 2, 0), pi2_dns=(0, 0, 1)), draining) == ([], [])
    problems, _ = ipvs_drift(cluster, up, table(pi3=(1, 2, 0), pi2_dns=(0, 0, 1)), draining)
    assert problems == ["service web: 192.168.100.6:80 is leaving but still has weight 1"]
    problems, _ = ipvs_drift(cluster, up, table(pi3=(0, 2, 0), pi2_dns=(0, 0, 1)))
    assert "service web: 192.168.100.6:80 is in IPVS but not in the file" in problems
