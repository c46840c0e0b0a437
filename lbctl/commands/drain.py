"""drain and undrain on this balancer: a worker out of rotation, and back.

The drain record is written first, then the change is made from the cluster
file as last applied here (the balancer's saved copy), so an interrupted
drain is finished by the next apply, and a drain never carries out edits of
the file that were not applied yet.
"""

import sys
import time

from lbctl.errors import LbctlError, NodeError, UsageError


def run(args, out):
    from lbctl.adapters.addrs import local_ipv4_addresses
    from lbctl.adapters.files import FilesRoot
    from lbctl.engine.desired import find_node, role_of
    from lbctl.records.drains import (
        drained_dests, read_drains, table_weights, with_drain, without_drain, worker_dests,
        write_drains,
    )
    from lbctl.records.lock import node_locked
    from lbctl.engine.node import load_node
    from lbctl.records.saved import applied_cluster

    undrain = args.command == "undrain"
    name = None
    if args.file is not None:
        from lbctl.config import load_cluster

        given = load_cluster(args.file)
        check_names(given, args.worker, args.service)
        name = given.name
    else:
        name = applied_cluster(args.root, None, args.worker)[0].name
    files = FilesRoot(args.root)
    with node_locked(args.root, name):
        # Read under the lock: an apply that ran meanwhile saved a newer copy,
        # and a drain rendered from the older one would undo it.
        cluster, saved = applied_cluster(args.root, name, args.worker)
        check_names(cluster, args.worker, args.service)
        node = find_node(cluster, local_ipv4_addresses(), args.node)
        if role_of(cluster, node) != "balancer":
            raise NodeError(f"{args.command} runs on a balancer, and {node} is a worker; from "
                            f"any machine, `lbctl {args.command} {args.worker} FILE --all` "
                            "reaches every balancer")
        before = read_drains(files, cluster.name)
        if undrain:
            after = without_drain(before, cluster, args.worker, args.service)
        else:
            from lbctl.adapters.ipvs import IpvsNetlink

            table = IpvsNetlink().dump()
            after = with_drain(before, args.worker, args.service, time.time(),
                               table_weights(cluster, args.worker, args.service, table, before))
        drained_after = set(drained_dests(cluster, after))
        changed = set(drained_dests(cluster, before)) ^ drained_after
        if changed and not undrain and not args.force:
            check_capacity(cluster, drained_after, table, args.worker)
        if getattr(args, "check", False):
            out.write(f"{args.worker} can be drained on {node}\n")
            return 0
        write_drains(files, cluster.name, after)
        verb = "undrained" if undrain else "drained"
        out.write(f"{args.worker} {verb} on {node}" + ("" if changed else " already") + ":\n")
        ctx = load_node(saved, node, args.root, cluster=cluster)
        # Every real server of the worker, not only the ones this run changes:
        # a drain interrupted half way is finished by running it again.
        _make_weights_follow(ctx, {key for _, key, _ in worker_dests(cluster, args.worker)},
                             out)
    dests = worker_dests(cluster, args.worker, args.service)
    table = {(d.address, d.port, svc.key): d for svc in ctx.adapters.ipvs.dump() if svc.key
             for d in svc.dests}
    for svc, key, weight in dests:
        found = table.get((key.address, key.port, key.service))
        now = "not in IPVS" if found is None else \
            f"weight {found.weight}, {found.active} active connection(s)"
        out.write(f"  service {svc.name} {key.address}:{key.port}: {now}"
                  f" (the file's weight: {weight})\n")
    if undrain or not args.wait:
        return 0
    return wait_until_idle(ctx.adapters.ipvs, [key for _, key, _ in dests], args.worker,
                           args.timeout, out)


def check_names(cluster, worker, service):
    if worker not in cluster.workers:
        raise UsageError(f"no worker {worker!r} in {cluster.source} "
                         f"(workers: {', '.join(sorted(cluster.workers))})")
    if service is None:
        return
    svc = cluster.services.get(service)
    if svc is None:
        raise UsageError(f"no service {service!r} in {cluster.source} "
                         f"(services: {', '.join(sorted(cluster.services))})")
    if not any(rs.worker == worker for rs in svc.real_servers):
        raise UsageError(f"worker {worker} does not serve {service} in {cluster.source}")


def check_capacity(cluster, drained, table, worker):
    """Refuse a drain that would leave a service with no real server taking new
    connections.  `drained`: DestKeys drained once this drain is made; `table`:
    the IPVS dump, whose weights say who takes connections right now (a failed
    or not yet checked worker is at 0 there, whatever any file says)."""
    from lbctl.config.model import DestKey
    from lbctl.records.drains import dest_weights

    weights = dest_weights(table)
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        if not any(rs.worker == worker for rs in svc.real_servers):
            continue
        state = {}
        for rs in svc.real_servers:
            key = DestKey(svc.key, rs.address, svc.port)
            state[rs.worker] = "drained" if key in drained else \
                "taking connections" if weights.get(key, 0) > 0 else "at weight 0"
        if "taking connections" not in state.values():
            why = ", ".join(f"{name} {s}" for name, s in state.items())
            raise UsageError(f"draining {worker} would leave service {svc.name} with no worker "
                             f"taking new connections ({why}); undrain or repair another "
                             "first, or drain anyway with --force")


def drain_changes(plan, keys, files):
    """The part of a plan a drain carries out: the weights of `keys` (netlink
    engine), or the `files` that say who is drained (keepalived's config,
    the announce hook's mh slots) and keepalived's reload."""
    from lbctl.engine.plan import CHANGE, Kind

    return [c for c in plan.changes
            if (c.kind == Kind.REAL_SERVER and c.action == CHANGE and c.key in keys)
            or (c.kind == Kind.FILE and c.key in files)
            or (c.kind == Kind.KEEPALIVED and c.key == "reload")]


def _make_weights_follow(ctx, keys, out):
    """Carry out drain_changes(); other differences from the file are left to
    `lbctl apply`, and so is the ownership record."""
    from lbctl.engine.execute import execute

    files = set()
    if ctx.desired.keepalived:
        from lbctl.layout import Layout

        files = {ctx.desired.keepalived.config, Layout(ctx.cluster.name).announce_slots}
    ours = drain_changes(ctx.plan, keys, files)
    others = len(ctx.plan.changes) - len(ours)
    ctx.plan.changes = ours
    ctx.plan.owned_after = ctx.plan.owned_before  # a drain takes nothing away
    if ours:
        execute(ctx.plan, ctx.adapters)
    if ctx.desired.keepalived is not None:
        if ctx.observed.keepalived is None:
            raise LbctlError("keepalived is not running here: the drain is recorded and "
                             "`lbctl apply` starts keepalived with it")
        from lbctl.commands.apply import check_keepalived_table

        # keepalived sets the weights as it reloads: wait until its table shows
        # them (and reload it, should an earlier drain have stopped short of that).
        check_keepalived_table(ctx, out, waited=bool(ours))
    if others:
        out.write(f"  {others} other difference(s) from the file as last applied were left "
                  "alone: `lbctl plan` shows them\n")


def wait_until_idle(ipvs, keys, worker, timeout, out, poll=0.5, clock=time.monotonic,
                    sleep=time.sleep, err=None):
    """Until the drained real servers hold no connection that keeps them busy
    (DestSpec.in_use), showing the count fall; 1 if `timeout` passes first."""
    from lbctl.state import DestSpec

    err = err or sys.stderr
    wanted = {(k.service, k.address, k.port) for k in keys}
    bar = ProgressBar(err, f"draining {worker}")
    started = clock()
    while True:
        dests = [(svc.key, d) for svc in ipvs.dump() if svc.key is not None
                 for d in svc.dests if (svc.key, d.address, d.port) in wanted]
        weighted = sorted({str(d.weight) for _, d in dests if d.weight > 0})
        if weighted:
            # Idle means nothing if new connections still arrive.
            bar.done()
            raise LbctlError(f"{worker} has weight {', '.join(weighted)} here again: something "
                             "undid the drain (an apply of another file?); not waiting")
        busy = sum(DestSpec(d.weight, d.forward, d.active, d.inactive).in_use(key.protocol)
                   for key, d in dests)
        waited = clock() - started
        bar.show(busy, waited)
        if busy == 0:
            bar.done()
            out.write(f"{worker} is idle after {waited:.0f}s: it can be taken down\n")
            return 0
        if waited >= timeout:
            bar.done()
            out.write(f"{worker} still has {busy} connection(s) after {timeout:g}s; it stays "
                      "drained (`lbctl undrain` puts it back)\n")
            return 1
        sleep(poll)


class ProgressBar:
    """Connections left, as a bar redrawn in place on a terminal, or a line per
    change elsewhere (a log, or --all's ssh)."""

    WIDTH = 30

    def __init__(self, stream, label):
        self.stream, self.label = stream, label
        self.tty = stream.isatty()
        self.first = self.last = None

    def show(self, busy, seconds):
        if self.first is None:
            self.first = max(busy, 1)
        if self.tty:
            filled = round(self.WIDTH * (self.first - min(busy, self.first)) / self.first)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                              f"{busy} connection(s) left, {seconds:.0f}s\x1b[K")
        elif busy != self.last:
            self.stream.write(f"{self.label}: {busy} connection(s) left, {seconds:.0f}s\n")
        self.last = busy
        self.stream.flush()

    def done(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
