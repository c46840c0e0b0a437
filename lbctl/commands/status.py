"""What this node is doing now: IPVS services and connection sync on a balancer,
VIPs and ARP settings on a worker."""

import json
import os
from dataclasses import asdict

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
    from lbctl.adapters.addrs import AddressNetlink
    from lbctl.adapters.sysctl import SysctlProc

    addresses = AddressNetlink().list()
    report = {"clusters": _reported_on(root, cluster, node), "services": [],
              "vips_on_lo": [], "arp": {}}
    if ipvs is None:
        from lbctl.adapters.ipvs import IpvsNetlink

        ipvs = IpvsNetlink()
    snapshot = ipvs.snapshot()
    report["ipvs_loaded"] = snapshot is not None
    if snapshot is not None:
        report["services"] = [_service_report(svc) for svc in snapshot.services]
        report["timeouts"] = snapshot.timeouts or {}
        report["sync"] = {"daemons": [asdict(d) for d in snapshot.sync_daemons],
                          "learned_connections": learned_connections(conn_sync_table)}
    report["vips_on_lo"] = sorted(str(ip) for ip, prefix, ifname in addresses
                                  if ifname == "lo" and prefix == 32 and not ip.is_loopback)
    report["keepalived"] = keepalived_states(root)
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
    from lbctl.adapters.protocols import OWNERSHIP_DIR
    from lbctl.ownership import applied_here

    return [{"cluster": name, "node": applied_node, "role": None}
            for name, applied_node in applied_here(root, OWNERSHIP_DIR)]


def _service_report(svc):
    stats = svc.stats
    return {
        "service": svc.label, "scheduler": svc.scheduler, "flags": list(svc.flags),
        "persistence": svc.persistence,
        "connections": svc.stats.conns, "conns_per_s": stats.cps,
        "in_packets": stats.inpkts, "in_bytes": stats.inbytes,
        "in_packets_per_s": stats.inpps, "in_bytes_per_s": stats.inbps,
        "real_servers": [{
            "address": f"{d.address}:{d.port}", "forward": FORWARD_NAMES.get(d.forward, str(d.forward)),
            "weight": d.weight, "active": d.active, "inactive": d.inactive,
            "connections": d.stats.conns,
        } for d in svc.dests],
    }


def learned_connections(path=CONN_SYNC_TABLE):
    """How many connections the sync daemon brought from the peer: the kernel marks
    them SYNC in the Origin column, and the ones this node made itself LOCAL."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            header = fh.readline().split()
            rows = fh.read().splitlines()
    except OSError:
        return 0
    if not {"Origin", "State", "FPrt"} <= set(header):
        return 0
    origin, state, client_port = (header.index(k) for k in ("Origin", "State", "FPrt"))
    # Persistence templates are not connections: state NONE, client port 0.
    return sum(1 for fields in map(str.split, rows)
               if len(fields) > origin and fields[origin] == "SYNC"
               and fields[state] != "NONE" and fields[client_port] != "0000")


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


def keepalived_states(root):
    """{cluster: {"vrrp": ..., "health": [...]}} from the notify hooks' state folders."""
    from lbctl.health import read_state_dir, workers_health

    base = os.path.join(root, "run/lbctl")
    found = {}
    for cluster in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        reported = read_state_dir(os.path.join(base, cluster, "state"))
        vrrp = reported.get("vrrp")
        found[cluster] = {
            "vrrp": None if vrrp is None else {"state": vrrp.state, "since": vrrp.since},
            "health": [{"service": service, "worker": worker, "state": r.state,
                        "since": r.since} for service, worker, r in workers_health(reported)],
        }
    return found


def _format_keepalived(states, now):
    from lbctl.health import for_how_long

    lines = []
    for cluster, info in states.items():
        vrrp = info["vrrp"]
        role = "no VRRP state reported" if vrrp is None else \
            f"VRRP {vrrp['state']} {for_how_long(now, vrrp['since'])}"
        lines.append(f"keepalived for cluster {cluster}: {role}")
        for h in info["health"]:
            lines.append(f"  health {h['service']}/{h['worker']}: {h['state']} "
                         f"{for_how_long(now, h['since'])}")
    return lines


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
            lines.append(f"    -> {d['address']:<21} {d['forward']:<6} weight {d['weight']:<5}"
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
    lines += _format_keepalived(report.get("keepalived", {}), time.time() if now is None else now)
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
        return "\n".join(lines)  # a balancer: the worker view would only be noise
    lines.append("VIPs on lo: " + (", ".join(report["vips_on_lo"]) or "none"))
    lines.append("ARP settings in effect, the larger of `all` and the interface's own "
                 "(direct-routing workers need arp_ignore=1, arp_announce=2):")
    for ifname, values in report["arp"].items():
        lines.append(f"  {ifname:<10} " + "  ".join(f"{k}={v}" for k, v in values.items()))
    return "\n".join(lines)


def run(args, out):
    cluster = node = None
    if args.file is not None:
        from lbctl.adapters.addrs import local_ipv4_addresses
        from lbctl.config import load_cluster
        from lbctl.desired import find_node

        cluster = load_cluster(args.file)
        node = find_node(cluster, local_ipv4_addresses(), args.node)
    report = collect(args.root, cluster, node)
    out.write((json.dumps(report, indent=2) if args.json else format_status(report)) + "\n")
    return 0
