"""`lbctl status`: what this node is doing now (collected by status/collect.py,
shown by status/render.py), live with --watch, or its connections."""

import json
import sys


def run(args, out):
    if args.connections:
        return run_connections(args, out)
    if args.watch:
        return run_watch(args, out)
    cluster = node = None
    if args.file is not None:
        from lbctl.adapters.addrs import local_ipv4_addresses
        from lbctl.config import load_cluster
        from lbctl.engine.desired import find_node

        cluster = load_cluster(args.file)
        node = find_node(cluster, local_ipv4_addresses(), args.node)
    from dataclasses import replace

    from lbctl.status.collect import collect
    from lbctl.status.render import format_status

    status = collect(args.root, cluster, node)
    if cluster is not None and not args.no_drift:
        changes, why_not = drift(args, cluster, node)
        status = replace(status, drift=None if changes is None else tuple(changes),
                         drift_error=why_not)
    out.write((json.dumps(status.to_json(), indent=2) if args.json else format_status(status))
              + "\n")
    if args.detailed_exitcode:
        return drift_exit_code(status)
    return 0


def drift_exit_code(status):
    """status --detailed-exitcode, as plan's: 2 when apply would change
    something, 1 when what it would change is not known (said on stderr)."""
    import sys

    from lbctl.errors import EXIT_CHANGES

    if status.drift is None:
        sys.stderr.write(f"lbctl: drift not known: {status.drift_error or 'not reported'}\n")
        return 1
    return EXIT_CHANGES if status.drift else 0


def run_watch(args, out):
    """The live view: the node's status each interval, named from FILE or the
    saved copies here."""
    import time

    from lbctl.adapters.ipvs import IpvsNetlink
    from lbctl.status.collect import collect
    from lbctl.status.render import Names
    from lbctl.status.watch import frame, watch

    names = Names.of(_clusters_named(args))
    ipvs = IpvsNetlink(load_module=False, keep_open=True)

    def render(status, previous, seconds):
        return frame(status, previous, seconds, names, time.time())

    try:
        return watch(lambda: collect(args.root, ipvs=ipvs), render, args.interval, out)
    finally:
        ipvs.close()


def _clusters_named(args):
    if args.file is not None:
        from lbctl.config import load_cluster

        return [load_cluster(args.file)]
    from lbctl.records.saved import saved_clusters

    return saved_clusters(args.root, strict=False)


def run_connections(args, out):
    """The connection table with names: from FILE, else the saved copies here."""
    from lbctl.status.connections import (NOT_LOADED, Filter, Names, entries, kernel_settings,
                                          table_exists, write_json, write_text)
    from lbctl.errors import KernelError, UsageError
    from lbctl.status.collect import keepalived_states

    clusters = _clusters_named(args)
    names = Names.of(clusters)
    source = args.file or "the cluster files applied here"
    if args.service is not None and args.service not in names.services.values():
        raise UsageError(f"--service: no service {args.service!r} in {source}")
    if args.worker is not None and args.worker not in names.workers.values():
        raise UsageError(f"--worker: no worker {args.worker!r} in {source}")
    try:
        wanted = Filter.of(names, args.service, args.worker, args.client)
    except ValueError as exc:
        raise UsageError(f"--client: {exc}") from None
    if args.json:
        if not table_exists():  # the JSON stays what a script expects: no entries
            print(f"lbctl: {NOT_LOADED}", file=sys.stderr)
        from lbctl.adapters.ipvs import IpvsNetlink

        ipvs = IpvsNetlink(load_module=False, keep_open=True)  # one socket for both reads
        try:
            kernel = kernel_settings(ipvs, wanted, names)
        except KernelError:
            kernel = None  # not root: /proc lists the connections, netlink says nothing
        finally:
            ipvs.close()
        write_json(entries(wanted), names, out, kernel)
        return 0
    backup = [name for name, info in keepalived_states(args.root, clusters).items()
              if info.held_vrrp is not None and info.held_vrrp.state == "BACKUP"]
    if backup:
        out.write(f"this balancer is VRRP BACKUP ({', '.join(backup)}): these are copies of the "
                  "master's connections, learned from its sync daemon, and lag behind it\n")
    write_text(wanted, names, out)
    return 0


def drift(args, cluster, node):
    """(what apply would change here, None), or (None, why that is not known)."""
    from lbctl.errors import LbctlError
    from lbctl.engine.node import load_node

    try:
        ctx = load_node(args.file, node, args.root, cluster=cluster, read_only=True)
    except LbctlError as exc:
        return None, str(exc)
    return [str(change).strip() for change in ctx.plan.changes], None
