"""drain-balancer and undrain-balancer, run on a balancer of mode ecmp: stop
offering the router the VIPs, so it sends this balancer no more flows, and
offer them again.

The router moves this balancer's flows to the others, where IPVS takes them
up mid-stream (sloppy_tcp) and mh's hash sends them to the same worker.  A
drain waits until no packet for a VIP has arrived here for a while, so the
balancer can then be stopped or rebooted without a failed request.  The
drain is a file, so it holds across keepalived restarts and reboots until
undrain-balancer.
"""

import time

from lbctl.config.model import Mode
from lbctl.errors import LbctlError, NodeError

# No packet for this long: the router sends this balancer none.  The kernel
# sums IPVS's packet counters every 2 s, so a shorter wait could fall between
# two sums of a balancer still in use.
QUIET_SECONDS = 5


def run(args, out):
    from lbctl.adapters.addrs import local_ipv4_addresses
    from lbctl.adapters.files import FilesRoot
    from lbctl.adapters.keepalived import sync_offers
    from lbctl.engine.desired import find_node
    from lbctl.records.lock import node_locked
    from lbctl.layout import Layout
    from lbctl.records.saved import applied_cluster

    drain = args.command == "drain-balancer"
    name = None
    if args.file is not None:
        from lbctl.config import load_cluster

        name = load_cluster(args.file).name
    cluster, _saved = applied_cluster(args.root, name)
    if cluster.mode != Mode.ECMP:
        raise NodeError(f"{args.command}: cluster {cluster.name} is not of mode ecmp; a "
                        "single balancer or a failover pair has no routes to withdraw")
    node = find_node(cluster, local_ipv4_addresses(), args.balancer)
    if node not in cluster.balancers:
        raise NodeError(f"{args.command} runs on the balancer it names, and {node} is a worker")
    layout = Layout(cluster.name, args.root)
    files = FilesRoot(args.root)
    with node_locked(args.root, cluster.name):
        if drain:
            files.write(layout.balancer_drained, f"{time.time():.3f}\n", 0o644)
        else:
            files.remove(layout.balancer_drained)
        refused = sync_offers(layout)
    if refused is not None:
        raise LbctlError(f"{args.command} {node}: the drain is recorded, but BIRD did not "
                         f"take it ({refused}); is keepalived running? `lbctl apply` starts it")
    if not drain:
        out.write(f"{node} offers the router its VIPs again, for each one whose services "
                  "have a healthy worker here\n")
        return 0
    from lbctl.status.bgp import bgp_report

    bird = bgp_report(layout.real(layout.bird_socket))
    if bird["error"] or bird["offered"]:
        still = ", ".join(o["vip"] for o in bird["offered"])
        raise LbctlError(f"drain-balancer {node}: the drain is recorded, but "
                         + (bird["error"] or f"BIRD still offers {still}"))
    out.write(f"{node} offers the router no VIP now; waiting until no packet for one "
              f"arrives for {QUIET_SECONDS}s\n")
    quiet = wait_for_quiet(cluster, args.timeout)
    if quiet is None:
        out.write(f"{node}: packets for the VIPs still arrive after {args.timeout:g}s; does "
                  "the router use this balancer's route still? (`lbctl status` shows the "
                  "session)\n")
        return 1
    out.write(f"{node} is drained: no packet for a VIP since {quiet:.1f}s after the "
              "withdrawal; it may be stopped or rebooted, and `lbctl undrain-balancer` "
              "brings it back\n")
    return 0


def wait_for_quiet(cluster, timeout, poll=0.25):
    """Seconds from now until the last packet for the cluster's services
    arrived, once none has arrived for QUIET_SECONDS; None after `timeout`."""
    from lbctl.adapters.ipvs import IpvsNetlink

    keys = {svc.key for svc in cluster.services.values()}
    ipvs = IpvsNetlink()

    def packets():
        snapshot = ipvs.snapshot()
        if snapshot is None:
            raise NodeError("drain-balancer: IPVS is not loaded here, so there is no traffic "
                            "to watch; is this the balancer that carried it?")
        return sum(svc.stats.inpkts for svc in snapshot.services if svc.key in keys)

    start = time.monotonic()
    seen, last_change = packets(), start
    while time.monotonic() - start < timeout:
        time.sleep(poll)
        now_seen = packets()
        if now_seen != seen:
            seen, last_change = now_seen, time.monotonic()
        elif time.monotonic() - last_change >= QUIET_SECONDS:
            return last_change - start
    return None
