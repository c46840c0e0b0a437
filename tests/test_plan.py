"""The diff: add before remove, ownership, draining, and the plan text."""

from ipaddress import IPv4Address

from helpers import PI_SINGLE, cluster_from
from lbctl.config.model import DestKey, ServiceKey
from lbctl.engine.desired import desired_state
from lbctl.engine.plan import ADD, CHANGE, DRAIN, DRAINING, REMOVE, format_plan, make_plan
from lbctl.state import Address, DestSpec, NodeState, Ownership, ServiceSpec

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
HAND = ServiceKey("tcp", IPv4Address("192.168.100.99"), 8080)


def balancer(text=PI_SINGLE):
    return desired_state(cluster_from(text), "lb1", "eth0")


def observed_like(state):
    """What the kernel holds right after applying `state`."""
    return NodeState(state.role, state.node, state.cluster, set(state.addresses),
                     dict(state.services), dict(state.dests), dict(state.sysctls),
                     dict(state.files), dict(state.links))


def test_a_fresh_balancer_gets_sysctls_then_addresses_then_services_then_real_servers():
    desired = balancer()
    plan = make_plan(desired, NodeState("balancer", "lb1", "pi-web"), Ownership())
    kinds = [c.kind for c in plan.changes]
    assert kinds == ["sysctl"] * 2 + ["address"] * 2 + ["service"] * 2 + ["real server"] * 5
    assert all(c.action == ADD for c in plan.changes if c.kind != "sysctl")
    assert plan.owned_before.services == set(desired.services)


def test_a_converged_node_has_an_empty_plan():
    desired = balancer()
    plan = make_plan(desired, observed_like(desired), Ownership.of(desired))
    assert plan.empty
    assert format_plan(plan) == "balancer lb1 of cluster pi-web: no changes"


def test_hand_made_services_and_addresses_are_never_touched():
    desired = balancer()
    observed = observed_like(desired)
    observed.services[HAND] = ServiceSpec("rr")
    observed.dests[DestKey(HAND, IPv4Address("192.168.100.3"), 8080)] = DestSpec(1)
    observed.addresses.add(Address(IPv4Address("192.168.100.77"), "eth0"))
    plan = make_plan(desired, observed, Ownership.of(desired))
    assert plan.empty


def test_removed_service_and_vip_are_removed_only_because_lbctl_owns_them():
    old = balancer()
    new = balancer(PI_SINGLE.replace(
        "  dns: {vip: 192.168.100.11, port: 53, protocol: udp, scheduler: rr, workers: [pi1, pi2]}\n", ""))
    plan = make_plan(new, observed_like(old), Ownership.of(old))
    assert [(c.action, c.kind, str(c.key)) for c in plan.changes] == [
        (REMOVE, "service", "udp 192.168.100.11:53"),
        (REMOVE, "address", "192.168.100.11/32 dev eth0"),
    ]
    # Without the ownership record nothing is removed: the safe direction.
    assert make_plan(new, observed_like(old), Ownership()).empty


def test_edits_come_before_removals():
    old = balancer()
    text = PI_SINGLE.replace("scheduler: wrr}", "scheduler: rr, workers: [pi1, pi3]}")
    plan = make_plan(balancer(text), observed_like(old), Ownership.of(old))
    actions = [c.action for c in plan.changes]
    assert actions == [CHANGE, DRAIN]
    assert "scheduler wrr -> scheduler rr" in str(plan.changes[0])


def test_a_removed_real_server_drains_when_busy_and_goes_when_idle():
    old = balancer()
    text = PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, workers: [pi1, pi3]}")
    new = balancer(text)
    pi2 = DestKey(WEB, IPv4Address("192.168.100.4"), 80)
    observed = observed_like(old)

    observed.dests[pi2] = DestSpec(1, active=3)
    (change,) = make_plan(new, observed, Ownership.of(old)).changes
    assert (change.action, change.key) == (DRAIN, pi2)
    assert "drain 3 active connections" in str(change)

    observed.dests[pi2] = DestSpec(0, active=3)
    (change,) = make_plan(new, observed, Ownership.of(old)).changes
    assert change.action == DRAINING
    assert str(change).startswith("~ real server tcp 192.168.100.10:80 -> 192.168.100.4:80 draining")

    observed.dests[pi2] = DestSpec(0, active=0, inactive=5)
    (change,) = make_plan(new, observed, Ownership.of(old)).changes
    assert change.action == REMOVE

    observed.dests[pi2] = DestSpec(1, active=3)
    (change,) = make_plan(new, observed, Ownership.of(old), force=True).changes
    assert change.action == REMOVE


def test_weight_and_sysctl_changes_show_old_and_new_values():
    old = balancer()
    new = balancer(PI_SINGLE.replace("pi1: {address: 192.168.100.3}", "pi1: {address: 192.168.100.3, weight: 4}"))
    plan = make_plan(new, observed_like(old), Ownership.of(old))
    assert [str(c) for c in plan.changes] == [
        "~ real server tcp 192.168.100.10:80 -> 192.168.100.3:80 weight 1 -> 4",
        "~ real server udp 192.168.100.11:53 -> 192.168.100.3:53 weight 1 -> 4",
    ]
    worker = desired_state(cluster_from(), "pi1", "eth0")
    observed = observed_like(worker)
    observed.sysctls["net.ipv4.conf.all.arp_ignore"] = "0"
    (change,) = make_plan(worker, observed, Ownership.of(worker)).changes
    assert str(change) == "~ sysctl net.ipv4.conf.all.arp_ignore = 1 (now 0)"


def test_a_fresh_worker_ignores_arp_for_the_vip_before_it_holds_the_vip():
    worker = desired_state(cluster_from(), "pi1", "eth0")
    plan = make_plan(worker, NodeState("worker", "pi1", "pi-web"), Ownership())
    kinds = [c.kind for c in plan.changes]
    first_address = kinds.index("address")
    assert set(kinds[:first_address]) == {"sysctl"}
    assert [c.key for c in plan.changes[:first_address]] == [
        "net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce"]


def test_plan_text_counts_changes():
    desired = balancer()
    text = format_plan(make_plan(desired, NodeState("balancer", "lb1", "pi-web"), Ownership()))
    assert text.splitlines()[-1] == "9 to add, 2 to change, 0 to remove."
