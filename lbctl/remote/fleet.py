"""Which nodes `--all` runs on, and in what order a rollout takes them."""

import json

from lbctl.config.model import Mode
from lbctl.errors import NodeError
from lbctl.remote.ssh import run_on_each, targets


def select(cluster, names=None):
    """[Target] of the nodes named (NAME[,NAME...]), or of all; unknown names are an
    error before any node is contacted."""
    every = targets(cluster)
    if not names:
        return list(every.values())
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in every]
    if unknown:
        raise NodeError(f"--node: {', '.join(unknown)} not in {cluster.source} "
                        f"(nodes: {', '.join(every)})")
    return [t for name, t in every.items() if name in wanted]


def balancer_order(cluster, balancers, reported):
    """Backup before master, so the master keeps serving while its peer changes.
    `reported` ({node: {"state", "advertised_addresses", "running"}}) is what the
    balancers say now; where they say nothing, the lower priority is taken as
    the backup.

    A pair where no keepalived runs (each balancer answered, none runs it)
    starts the other way, the higher priority first: the first
    keepalived to run becomes master, and without preemption it stays master
    when its peer starts, so backup first would make the file's backup the
    pair's master."""
    if starting_fresh(balancers, reported):
        return sorted(balancers, key=lambda t: -(cluster.balancers[t.node].priority or 0))

    def rank(target):
        said = reported.get(target.node) or {}
        state = said.get("state") if keepalived_runs(said) else None
        if state == "MASTER":
            return (2, 0)
        if state in ("BACKUP", "FAULT"):
            return (0, 0)
        return (1, cluster.balancers[target.node].priority or 0)
    return sorted(balancers, key=rank)


def starting_fresh(balancers, reported):
    """Every balancer of a pair answered, and none runs keepalived: not yet,
    or no longer (a pair stopped on both nodes starts as a fresh one)."""
    said = [reported.get(t.node, None) for t in balancers]
    return len(said) > 1 and all(r is not None and not keepalived_runs(r) for r in said)


def keepalived_runs(reported):
    """Whether a balancer's keepalived runs, from what it `reported`.  An
    lbctl that does not say ("running" None) is believed by its VRRP record,
    which a clean stop leaves saying STOP."""
    if reported.get("running") is not None:
        return reported["running"]
    return reported.get("state") not in (None, "STOP")


def advert_changes(cluster, reported):
    """True when a balancer's VRRP adverts carry other addresses than the file's
    config will (an lbctl that advertised the VIPs themselves, before
    render.keepalived.vrrp_anchor()).

    keepalived 2.2.7 ignores an advert whose addresses differ from its own
    config until it has accepted one from that master (skip_check_adv_addr),
    and forgets that at its own reload: a backup reloaded first would take the
    VIPs over until the master had the new config.  So the master goes first."""
    from lbctl.render.keepalived import vrrp_anchor

    if cluster.mode != Mode.FAILOVER or not reported:
        # Only a pair takes turns by VRRP role: a lone balancer has no peer
        # to hear, and may run no VRRP at all (no vrrp section, no anchor).
        return False
    wanted = {vrrp_anchor(cluster)}
    return any(r and r.get("advertised_addresses") is not None
               and set(r["advertised_addresses"]) != wanted for r in reported.values())


def rollout_stages(cluster, selected, balancers_now, removing=False):
    """(label, [Target]) in the order apply takes them, one stage at a time.

    Workers first: a worker must hold the VIP before a balancer sends it
    traffic.  Then the backup balancer, then the master (the master first
    when what the adverts carry changes: advert_changes(); the master-to-be
    first when no keepalived of the pair runs yet: balancer_order()).  Taking lbctl
    away goes the other way: the balancers stop sending traffic before the
    workers let go of the VIP.  `balancers_now()` is called only when the
    balancers are due, so asking them can overlap the workers' stage.
    """
    workers = [t for t in selected if t.role == "worker"]
    balancers = [t for t in selected if t.role == "balancer"]
    if workers and not removing:
        yield "workers", workers
    if cluster.mode in (Mode.ECMP, Mode.SINGLE):
        # In mode ecmp every balancer is active: one at a time, in the file's
        # order, while the others serve.
        staged = [("balancer", t) for t in balancers]
    else:
        reported = balancers_now() if len(balancers) > 1 else {}
        ordered = balancer_order(cluster, balancers, reported)
        labels = ["backup balancer", "master balancer"] if len(ordered) == 2 else ["balancer"]
        if len(ordered) == 2 and starting_fresh(balancers, reported):
            labels.reverse()
        staged = list(zip(labels, ordered))
        if not removing and advert_changes(cluster, reported):
            staged.reverse()
    yield from ((label, [t]) for label, t in staged)
    if workers and removing:
        yield "workers", workers


def balancers_now(cluster, selected, ssh_config):
    """{balancer: {"state": VRRP state now, "advertised_addresses": [...]}}, asked only
    when a pair is to be taken in turn; None for a balancer that did not say."""
    balancers = [t for t in selected if t.role == "balancer"]
    if len(balancers) < 2 or cluster.mode != Mode.FAILOVER:
        return {}
    found = {}
    for node, status in statuses(cluster, balancers, ssh_config).items():
        info = None if status is None else status.keepalived.get(cluster.name)
        if status is None:
            found[node] = None
        elif info is None:
            found[node] = {"state": None, "advertised_addresses": None, "running": False}
        else:
            found[node] = {"state": None if info.vrrp is None else info.vrrp.state,
                           "advertised_addresses": None if info.advertised_addresses is None
                           else list(info.advertised_addresses),
                           "running": info.running}
    return found


def statuses(cluster, targets, ssh_config):
    """{node: its NodeStatus, or None when it did not answer with one}."""
    outcomes = run_on_each(targets, lambda t: ["status", "-", "--node", t.node, "--json",
                                               "--no-drift"], cluster.text, ssh_config)
    return {node: parse_status(outcome.stdout) if outcome.returncode == 0 else None
            for node, outcome in outcomes.items()}


def parse_status(text):
    """The NodeStatus a node's `status --json` printed, or None for anything else."""
    from lbctl.status.model import NodeStatus

    try:
        return NodeStatus.from_json(json.loads(text))
    except (ValueError, RecursionError):  # not JSON, or not a node's status (StatusShapeError)
        return None


def bgp_offers(cluster, balancers, ssh_config):
    """Mode ecmp: {balancer: (BGP state, {VIPs offered})} as each balancer's BIRD
    says now; (None, set()) for one that did not say."""
    return {node: read_bgp(cluster, status)
            for node, status in statuses(cluster, balancers, ssh_config).items()}


def read_bgp(cluster, status):
    """(BGP state, {VIPs offered}) from a balancer's NodeStatus (or None)."""
    info = None if status is None else status.keepalived.get(cluster.name)
    if info is None or info.bgp is None:
        return None, set()
    return info.bgp.state, {offer.vip for offer in info.bgp.offered}


def back_in_service(cluster, before, now):
    """Whether an ECMP balancer, just applied, serves again as it did: its BGP
    session is up and it offers every VIP of the file it offered before (a
    VIP it did not offer, because no worker was healthy or it was drained,
    is not waited for).  One that was not serving before (a new cluster, a
    router not yet set up) is not waited for: the rollout takes nothing more
    out of service by going on.  `before`, `now`: read_bgp()'s answers."""
    if before[0] != "Established":
        return True
    state, offered = now
    wanted = before[1] & {str(vip) for vip in cluster.vips}
    return state == "Established" and wanted <= offered


def vrrp_states(cluster, selected, ssh_config):
    """{balancer: VRRP state now, or None (no keepalived running, or no answer)}."""
    return {node: report["state"] if report and keepalived_runs(report) else None
            for node, report in balancers_now(cluster, selected, ssh_config).items()}
