"""What this node is doing now: IPVS services on a balancer, VIPs and ARP settings on a worker."""

import json
import os

from lbctl.state import FWD_DIRECT_ROUTING

FORWARD_NAMES = {0: "masq", 1: "local", 2: "tunnel", FWD_DIRECT_ROUTING: "route"}
ARP_KEYS = ("arp_ignore", "arp_announce")


def collect(root="/"):
    from lbctl.adapters.addrs import AddressNetlink
    from lbctl.adapters.sysctl import SysctlProc

    addresses = AddressNetlink().list()
    report = {"services": [], "vips_on_lo": [], "arp": {}}
    if os.path.exists("/proc/net/ip_vs"):
        from lbctl.adapters.ipvs import IpvsNetlink

        for svc in IpvsNetlink().dump():
            report["services"].append({
                "service": svc.label, "scheduler": svc.scheduler,
                "persistence": svc.persistence, "connections": svc.stats.conns,
                "conns_per_s": svc.stats.cps, "in_bytes_per_s": svc.stats.inbps,
                "out_bytes_per_s": svc.stats.outbps,
                "real_servers": [{
                    "address": f"{d.address}:{d.port}", "forward": FORWARD_NAMES.get(d.forward, str(d.forward)),
                    "weight": d.weight, "active": d.active, "inactive": d.inactive,
                    "connections": d.stats.conns,
                } for d in svc.dests],
            })
    report["vips_on_lo"] = sorted(str(ip) for ip, prefix, ifname in addresses
                                  if ifname == "lo" and prefix == 32 and not ip.is_loopback)
    report["keepalived"] = keepalived_states(root)
    sysctls = SysctlProc()
    for ifname in sorted({"all"} | {name for _, _, name in addresses if name != "lo"}):
        report["arp"][ifname] = {k: sysctls.read(f"net.ipv4.conf.{ifname.replace('.', '/')}.{k}")
                                 for k in ARP_KEYS}
    report["arp"] = effective_arp(report["arp"])
    return report


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


def format_status(report, now=None):
    import time

    lines = _format_keepalived(report.get("keepalived", {}), time.time() if now is None else now)
    if report["services"]:
        lines.append("IPVS services:")
        for s in report["services"]:
            persist = f" persistence {s['persistence']}s" if s["persistence"] else ""
            lines.append(f"  {s['service']} {s['scheduler']}{persist}  connections {s['connections']}"
                         f"  {s['conns_per_s']} conn/s  in {s['in_bytes_per_s']} B/s"
                         f"  out {s['out_bytes_per_s']} B/s")
            for d in s["real_servers"]:
                lines.append(f"    -> {d['address']:<21} {d['forward']:<6} weight {d['weight']:<5}"
                             f" active {d['active']:<5} inactive {d['inactive']:<5}"
                             f" connections {d['connections']}")
    else:
        lines.append("IPVS services: none")
    if report["services"] and not report["vips_on_lo"]:
        return "\n".join(lines)  # a balancer: the worker view would only be noise
    lines.append("VIPs on lo: " + (", ".join(report["vips_on_lo"]) or "none"))
    lines.append("ARP settings in effect, the larger of `all` and the interface's own "
                 "(direct-routing workers need arp_ignore=1, arp_announce=2):")
    for ifname, values in report["arp"].items():
        lines.append(f"  {ifname:<10} " + "  ".join(f"{k}={v}" for k, v in values.items()))
    return "\n".join(lines)


def run(args, out):
    report = collect(args.root)
    out.write((json.dumps(report, indent=2) if args.json else format_status(report)) + "\n")
    return 0
