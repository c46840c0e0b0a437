"""What this node is doing now: IPVS services and connection sync on a balancer,
VIPs and ARP settings on a worker."""

import json
import os
import re
from dataclasses import asdict

from lbctl.config.model import Mode
from lbctl.layout import RUN_DIR, Layout
from lbctl.state import FWD_DIRECT_ROUTING

FORWARD_NAMES = {0: "masq", 1: "local", 2: "tunnel", FWD_DIRECT_ROUTING: "route"}
ARP_KEYS = ("arp_ignore", "arp_announce")
CONN_SYNC_TABLE = "/proc/net/ip_vs_conn_sync"
SYNC_DOC = "docs/firewall.md#connection-sync-multicast"
NO_OUTGOING = ("(direct routing: replies go from the workers straight to the clients, "
               "so the balancer counts no outgoing packets or bytes)")


def collect(root="/", cluster=None, node=None, ipvs=None, conn_sync_table=CONN_SYNC_TABLE):
    """The report status prints.  cluster and node name what it reports on; without
    them, the clusters applied here are read from their ownership records."""
    from lbctl.adapters.addrs import AddressIp
    from lbctl.adapters.sysctl import SysctlProc

    addresses = AddressIp().list()
    report = {"clusters": _reported_on(root, cluster, node), "services": [],
              "vips_on_lo": [], "arp": {}}
    if ipvs is None:
        from lbctl.adapters.ipvs import IpvsNetlink

        ipvs = IpvsNetlink()
    snapshot = ipvs.snapshot()
    report["ipvs_loaded"] = snapshot is not None
    from lbctl.saved import saved_clusters

    running = saved_clusters(root, strict=False)  # what keepalived runs here, if anything
    drained, report["drains"] = drains_here(root, running if cluster is None else [cluster])
    if snapshot is not None:
        report["services"] = [_service_report(svc, drained) for svc in snapshot.services]
        report["timeouts"] = snapshot.timeouts or {}
        report["sync"] = {"daemons": [asdict(d) for d in snapshot.sync_daemons],
                          "learned_connections": learned_connections(conn_sync_table)}
    # (Not a pair master's VRRP anchor, a link-local address: render.keepalived.vrrp_anchor.)
    report["vips_on_lo"] = sorted(str(ip) for ip, prefix, ifname in addresses
                                  if ifname == "lo" and prefix == 32 and not ip.is_loopback
                                  and not ip.is_link_local)
    report["keepalived"] = keepalived_states(root, running, bgp=True)
    for name, info in report["keepalived"].items():
        info["advertised_addresses"] = advertised_addresses(root, name)
    if "sync" in report:
        report["sync"]["warning"] = sync_warning(report["sync"], report["keepalived"],
                                                 [c["cluster"] for c in report["clusters"]])
    sysctls = SysctlProc()
    for ifname in sorted({"all"} | {name for _, _, name in addresses if name != "lo"}):
        report["arp"][ifname] = {k: sysctls.read(f"net.ipv4.conf.{ifname.replace('.', '/')}.{k}")
                                 for k in ARP_KEYS}
    report["arp"] = effective_arp(report["arp"])
    return report


def _reported_on(root, cluster, node):
    """[{"cluster", "node", "role"}]: the cluster given, or those applied on this host."""
    if cluster is not None:
        from lbctl.desired import role_of

        return [{"cluster": cluster.name, "node": node, "role": role_of(cluster, node)}]
    from lbctl.layout import OWNERSHIP_DIR
    from lbctl.ownership import applied_here

    return [{"cluster": name, "node": applied_node, "role": None}
            for name, applied_node in applied_here(root, OWNERSHIP_DIR)]


def drains_here(root, clusters=None):
    """({DestKey} drained, [{"cluster", "worker", "services", "since"}]) on this
    balancer, for the clusters given or those with a saved copy here."""
    from lbctl.adapters.files import FilesRoot
    from lbctl.drains import drained_dests, read_drains
    from lbctl.errors import LbctlError

    from lbctl.saved import saved_clusters

    clusters = saved_clusters(root, strict=False) if clusters is None else clusters
    keys, listed = set(), []
    for c in clusters:
        try:
            drains = read_drains(FilesRoot(root), c.name)
        except LbctlError as exc:
            listed.append({"cluster": c.name, "error": str(exc)})
            continue
        keys |= set(drained_dests(c, drains))
        listed += [{"cluster": c.name, "worker": d.worker, "services": d.describe(),
                    "since": d.since} for d in sorted(drains.values(), key=lambda d: d.worker)]
    return keys, listed


def _service_report(svc, drained=frozenset()):
    from lbctl.config.model import DestKey

    stats = svc.stats
    return {
        "service": svc.label, "scheduler": svc.scheduler, "flags": list(svc.flags),
        "persistence": svc.persistence,
        "connections": svc.stats.conns, "conns_per_s": stats.cps,
        "in_packets": stats.inpkts, "in_bytes": stats.inbytes,
        "in_packets_per_s": stats.inpps, "in_bytes_per_s": stats.inbps,
        "real_servers": [{
            "address": f"{d.address}:{d.port}", "forward": FORWARD_NAMES.get(d.forward, str(d.forward)),
            "weight": d.weight, "drained": DestKey(svc.key, d.address, d.port) in drained,
            "active": d.active, "inactive": d.inactive,
            "connections": d.stats.conns,
        } for d in svc.dests],
    }


def learned_connections(path=CONN_SYNC_TABLE):
    """How many connections the sync daemon brought from the peer: the kernel marks
    them SYNC in the Origin column, and the ones this node made itself LOCAL."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            header = fh.readline().split()
            if not {"Origin", "State", "FPrt"} <= set(header):
                return 0
            origin, state, client_port = (header.index(k) for k in ("Origin", "State", "FPrt"))
            # Line by line: a busy balancer's table runs to hundreds of
            # thousands of entries, and the exporter reads it at every scrape.
            # Persistence templates are not connections: state NONE, client port 0.
            return sum(1 for fields in map(str.split, fh)
                       if len(fields) > origin and fields[origin] == "SYNC"
                       and fields[state] != "NONE" and fields[client_port] != "0000")
    except OSError:
        return 0


def sync_warning(sync, keepalived, clusters):
    """The silent failure: a backup whose sync daemon listens but has learned nothing."""
    backup = [d for d in sync["daemons"] if d["role"] == "backup"]
    states = [info["vrrp"]["state"] for name, info in keepalived.items()
              if info["vrrp"] is not None and (not clusters or name in clusters)]
    if not backup or "BACKUP" not in states or sync["learned_connections"]:
        return None
    d = backup[0]
    return (f"this balancer is VRRP BACKUP and holds no connections learned from its peer. "
            f"If the master is serving connections, multicast to the sync group "
            f"{d['group']} UDP port {d['port']} is being filtered between the balancers "
            f"(IGMP snooping on a switch, or a firewall), and a failover will break every "
            f"connection. Check that both balancers accept UDP to {d['group']}:{d['port']} "
            f"on {d['interface']} and that the switch forwards that group: see {SYNC_DOC}")


def effective_arp(raw):
    """What the kernel acts on per interface: the larger of `all` and its own value."""
    every = raw.get("all", {})
    effective = {}
    for ifname, values in raw.items():
        effective[ifname] = {k: _larger(v, every.get(k)) if ifname != "all" else v
                             for k, v in values.items()}
    return effective


def _larger(own, every):
    try:
        return str(max(int(own), int(every)))
    except (TypeError, ValueError):
        return own


def keepalived_states(root, clusters=None, bgp=False):
    """{cluster: {"vrrp": ..., "transitions": N, "health": [...]}} from the notify
    hooks' state folders, read against the config keepalived runs (`clusters`,
    default the saved copies here).  A file stays after what wrote it went
    (keepalived even runs a dropped check's hook after its reload), so only the
    VRRP role of a pair and the checks the config runs are believed.  A checked
    worker with no report yet is listed with state None: keepalived may have
    added it down without a word (a worker a reload brings in).  `bgp`: in
    mode ecmp, ask BIRD too (as root: the exporter's user cannot)."""
    from lbctl.health import read_state_dir, read_transitions, workers_health

    if clusters is None:
        from lbctl.saved import saved_clusters

        clusters = saved_clusters(root, strict=False)
    running = {c.name: c for c in clusters}
    base = os.path.join(root, RUN_DIR.lstrip("/"))
    found = {}
    for cluster in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not os.path.isdir(os.path.join(base, cluster)):
            continue  # a cluster's lock file (lbctl/lock.py)
        layout = Layout(cluster, root)
        state_dir = layout.real(layout.state_dir)
        reported = read_state_dir(state_dir)
        vrrp = reported.get("vrrp")
        health = [{"service": service, "worker": worker, "state": r.state, "since": r.since}
                  for service, worker, r in workers_health(reported)]
        config = running.get(cluster)
        if config is not None:
            if config.mode != Mode.FAILOVER:
                vrrp = None  # no VRRP instance: a report left from when it was a pair
            health = _checks_run(config, health)
        found[cluster] = {
            # False: the config runs no VRRP (one balancer); None: no saved copy says.
            "pair": None if config is None else config.mode == Mode.FAILOVER,
            "mode": None if config is None else config.mode,
            "vrrp": None if vrrp is None else {"state": vrrp.state, "since": vrrp.since},
            "transitions": read_transitions(state_dir),
            "health": health,
        }
        if bgp and config is not None and config.mode == Mode.ECMP:
            from lbctl.bgp import bgp_report

            found[cluster]["bgp"] = bgp_report(layout.real(layout.bird_socket))
            found[cluster]["bgp"]["router"] = str(config.bgp.router)
    return found


def _checks_run(cluster, health):
    """The health reports of the checks `cluster` runs, each checked worker once."""
    by_pair = {(h["service"], h["worker"]): h for h in health}
    return sorted((by_pair.get((svc.name, rs.worker)) or
                   {"service": svc.name, "worker": rs.worker, "state": None, "since": None}
                   for svc in cluster.services.values() if svc.health is not None
                   for rs in svc.real_servers),
                  key=lambda h: (h["service"], h["worker"]))


def advertised_addresses(root, cluster):
    """The addresses this balancer's keepalived.conf puts in its VRRP adverts,
    sorted; None without a VRRP instance.  `apply --all` takes the master
    first when they change (remote/fleet.py advert_changes)."""
    layout = Layout(cluster, root)
    try:
        with open(layout.real(layout.conf), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    block = re.search(r"^\s*virtual_ipaddress \{\n(.*?)^\s*\}", text, re.M | re.S)
    return None if block is None else sorted(re.findall(r"^\s*([0-9.]+)/32\b", block[1], re.M))


def _format_keepalived(states, now):
    from lbctl.health import for_how_long, without_vrrp

    lines = []
    for cluster, info in states.items():
        vrrp = info["vrrp"]
        role = f"VRRP {vrrp['state']} {for_how_long(now, vrrp['since'])}" if vrrp else \
            without_vrrp(info)
        lines.append(f"keepalived for cluster {cluster}: {role}")
        if "bgp" in info:
            from lbctl.bgp import format_bgp

            lines += format_bgp(info["bgp"], info["bgp"]["router"], now)
        for h in info["health"]:
            lines.append(f"  health {h['service']}/{h['worker']}: " + (
                "no report yet (its check has not passed or failed since keepalived "
                "took it in)" if h["state"] is None else
                f"{h['state']} {for_how_long(now, h['since'])}"))
    return lines


def _format_drains(drains, now):
    from lbctl.drains import drain_line

    return [f"drain record of cluster {d['cluster']}: {d['error']}" if "error" in d else
            drain_line(d["worker"], d["services"], d["since"], now) for d in drains]


def _format_header(clusters):
    if not clusters:
        return ["lbctl status: no cluster has been applied on this host "
                "(`lbctl status FILE` names the cluster and this node)"]
    named = []
    for c in clusters:
        node = c["node"] or "unknown (`lbctl status FILE` names it)"
        role = f" ({c['role']})" if c["role"] else ""
        named.append(f"cluster {c['cluster']}, node {node}{role}")
    return ["lbctl status: " + "; ".join(named)]


def _format_services(services):
    if not services:
        return ["IPVS services: none"]
    lines = ["IPVS services, incoming " + NO_OUTGOING + ":"]
    for s in services:
        persist = f" persistence {s['persistence']}s" if s["persistence"] else ""
        flags = f" flags {','.join(s['flags'])}" if s.get("flags") else ""
        lines.append(f"  {s['service']} {s['scheduler']}{flags}{persist}  connections {s['connections']}"
                     f" ({s['conns_per_s']}/s)  in {s['in_packets']} packets"
                     f" ({s['in_packets_per_s']}/s)  {s['in_bytes']} bytes"
                     f" ({s['in_bytes_per_s']} B/s)")
        for d in s["real_servers"]:
            weight = f"{d['weight']}{' drained' if d.get('drained') else ''}"
            lines.append(f"    -> {d['address']:<21} {d['forward']:<6} weight {weight:<5}"
                         f" active {d['active']:<5} inactive {d['inactive']:<5}"
                         f" connections {d['connections']}")
    return lines


def _format_sync(sync):
    if not sync["daemons"]:
        return ["connection sync: no sync daemon running"]
    lines = ["connection sync:"]
    for d in sync["daemons"]:
        lines.append(f"  {d['role']} daemon on {d['interface']} syncid {d['syncid']}"
                     f" group {d['group']} port {d['port']}")
    lines.append(f"  connections learned from the peer: {sync['learned_connections']}")
    if sync.get("warning"):
        lines.append(f"  WARNING: {sync['warning']}")
    return lines


def format_status(report, now=None):
    import time

    lines = _format_header(report.get("clusters", []))
    now = time.time() if now is None else now
    lines += _format_keepalived(report.get("keepalived", {}), now)
    lines += _format_drains(report.get("drains", []), now)
    if report.get("ipvs_loaded", True):
        lines += _format_services(report["services"])
        if report.get("timeouts") and report["services"]:
            lines.append("IPVS timeouts: " + "  ".join(
                f"{name} {seconds}s" for name, seconds in report["timeouts"].items()))
        if "sync" in report:
            lines += _format_sync(report["sync"])
    elif report.get("clusters") and all(c["role"] == "worker" for c in report["clusters"]):
        lines.append("IPVS: not loaded (the ip_vs kernel module), as a worker needs none")
    else:
        lines.append("IPVS: not loaded (the ip_vs kernel module), so no services run here; "
                     "`lbctl apply` loads it on a balancer")
    if report["services"] and not report["vips_on_lo"]:
        # A balancer: the worker view would only be noise.
        return "\n".join(lines + _format_drift(report))
    lines.append("VIPs on lo: " + (", ".join(report["vips_on_lo"]) or "none"))
    lines.append("ARP settings in effect, the larger of `all` and the interface's own "
                 "(direct-routing workers need arp_ignore=1, arp_announce=2):")
    for ifname, values in report["arp"].items():
        lines.append(f"  {ifname:<10} " + "  ".join(f"{k}={v}" for k, v in values.items()))
    return "\n".join(lines + _format_drift(report))


def run(args, out):
    if args.connections:
        return run_connections(args, out)
    if args.watch:
        return run_watch(args, out)
    cluster = node = None
    if args.file is not None:
        from lbctl.adapters.addrs import local_ipv4_addresses
        from lbctl.config import load_cluster
        from lbctl.desired import find_node

        cluster = load_cluster(args.file)
        node = find_node(cluster, local_ipv4_addresses(), args.node)
    report = collect(args.root, cluster, node)
    if cluster is not None and not args.no_drift:
        report["drift"], report["drift_error"] = drift(args, cluster, node)
    out.write((json.dumps(report, indent=2) if args.json else format_status(report)) + "\n")
    return 0


def run_watch(args, out):
    """The live view: names and drains from FILE or the saved copies here."""
    import time

    from lbctl.adapters.ipvs import IpvsNetlink
    from lbctl.watch import Names, frame, watch

    clusters = _clusters_named(args)
    ipvs = IpvsNetlink()

    def read():
        snapshot = ipvs.snapshot()
        return [] if snapshot is None else snapshot.services

    def render(snapshot, previous, seconds):
        drained, _ = drains_here(args.root, clusters)
        return frame(snapshot, previous, seconds, Names.of(clusters, drained),
                     keepalived_states(args.root, clusters), time.time())

    return watch(read, render, args.interval, out)


def _clusters_named(args):
    if args.file is not None:
        from lbctl.config import load_cluster

        return [load_cluster(args.file)]
    from lbctl.saved import saved_clusters

    return saved_clusters(args.root, strict=False)


def run_connections(args, out):
    """The connection table with names: from FILE, else the saved copies here."""
    from lbctl.connections import Filter, Names, entries, write_json, write_text
    from lbctl.errors import UsageError

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
        write_json(entries(wanted), names, out)
        return 0
    backup = [name for name, info in keepalived_states(args.root, clusters).items()
              if (info["vrrp"] or {}).get("state") == "BACKUP"]
    if backup:
        out.write(f"this balancer is VRRP BACKUP ({', '.join(backup)}): these are copies of the "
                  "master's connections, learned from its sync daemon, and lag behind it\n")
    write_text(wanted, names, out)
    return 0


def drift(args, cluster, node):
    """(what apply would change here, None), or (None, why that is not known)."""
    from lbctl.errors import LbctlError
    from lbctl.node import load_node

    try:
        ctx = load_node(args.file, node, args.root, cluster=cluster)
    except LbctlError as exc:
        return None, str(exc)
    return [str(change).strip() for change in ctx.plan.changes], None


def _format_drift(report):
    if report.get("drift_error"):
        return [f"drift from the file: not known: {report['drift_error']}"]
    if report.get("drift") is None:
        return []
    if not report["drift"]:
        return ["drift from the file: none"]
    return ["drift from the file (`lbctl apply` would make these changes):"] + [
        f"  {line}" for line in report["drift"]]
