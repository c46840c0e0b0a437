"""`lbctl status` as text: a NodeStatus, shown."""

import time
from dataclasses import dataclass

from lbctl.config.model import Mode

NO_OUTGOING = ("(direct routing: replies go from the workers straight to the clients, "
               "so the balancer counts no outgoing packets or bytes)")


@dataclass(frozen=True)
class Names:
    """What the file calls what a NodeStatus shows (status --watch, status
    --all): services by their label ("tcp 192.168.100.10:80"), workers by
    their address."""

    services: dict  # {label: name}
    workers: dict  # {"192.168.100.3": name}

    @classmethod
    def of(cls, clusters):
        services, workers = {}, {}
        for cluster in clusters:
            services.update({str(svc.key): name for name, svc in cluster.services.items()})
            workers.update({str(w.address): name for name, w in cluster.workers.items()})
        return cls(services, workers)


def format_status(status, now=None):
    """The text of `lbctl status` for `status` (a NodeStatus)."""
    lines = _header(status.clusters)
    now = time.time() if now is None else now
    lines += _keepalived(status.keepalived, now)
    lines += _drains(status.drains, now)
    if status.ipvs_loaded:
        lines += _services(status.services)
        if status.timeouts and status.services:
            lines.append("IPVS timeouts: " + "  ".join(
                f"{name} {seconds}s" for name, seconds in status.timeouts.items()))
        if status.sync is not None:
            lines += _sync(status.sync)
    elif status.clusters and all(c.role == "worker" for c in status.clusters):
        lines.append("IPVS: not loaded (the ip_vs kernel module), as a worker needs none")
    else:
        lines.append("IPVS: not loaded (the ip_vs kernel module), so no services run here; "
                     "`lbctl apply` loads it on a balancer")
    if status.services and not status.vips_on_lo:
        # A balancer: the worker view would only be noise.
        return "\n".join(lines + _drift(status))
    lines.append("VIPs on lo: " + (", ".join(status.vips_on_lo) or "none"))
    lines.append("ARP settings in effect, the larger of `all` and the interface's own "
                 "(direct-routing workers need arp_ignore=1, arp_announce=2):")
    for ifname, values in status.arp.items():
        lines.append(f"  {ifname:<10} " + "  ".join(f"{k}={v}" for k, v in values.items()))
    return "\n".join(lines + _drift(status))


def role_line(info, now):
    """A cluster's keepalived in a few words: its VRRP role and since when, or
    why it has none (`info`: a KeepalivedStatus)."""
    from lbctl.status.health import for_how_long

    if info.running is False:
        # What its hooks recorded last is no role any more.
        last = "" if info.vrrp is None or info.vrrp.state == "STOP" else (
            f" (VRRP {info.vrrp.state} when last recorded, "
            f"{for_how_long(now, info.vrrp.since).removeprefix('for ')} ago)")
        return "keepalived not running" + last
    if info.vrrp is not None:
        return f"VRRP {info.vrrp.state} {for_how_long(now, info.vrrp.since)}"
    if info.mode == Mode.ECMP:
        return "no VRRP (mode ecmp: every balancer active)"
    return "no VRRP (a single balancer)" if info.pair is False else "no VRRP state reported"


def _keepalived(states, now):
    from lbctl.status.health import for_how_long

    lines = []
    for cluster, info in states.items():
        role = role_line(info, now).removeprefix("keepalived ")
        lines.append(f"keepalived for cluster {cluster}: {role}")
        if info.bgp is not None:
            from lbctl.status.bgp import format_bgp

            lines += format_bgp(info.bgp, now)
        for h in info.health:
            lines.append(f"  health {h.service}/{h.worker}: " + (
                "no report yet (its check has not passed or failed since keepalived "
                "took it in)" if h.state is None else
                f"{h.state} {for_how_long(now, h.since)}"))
    return lines


def describe_drains(ctx, now):
    """Lines for plan and apply: what to know of this node (the drain record
    unreadable, another cluster here wanting the kernel's settings
    otherwise), then who is drained, where, since when."""
    problems = [ctx.drain_problem] * bool(ctx.drain_problem) + list(ctx.warnings)
    return [f"WARNING: {p}" for p in problems] + [drain_line(d.worker, d.describe(), d.since, now)
                      for d in sorted(ctx.drains.values(), key=lambda d: d.worker)]


def drain_line(worker, services, since, now):
    from lbctl.status.health import for_how_long

    return (f"drained: {worker} on {services} {for_how_long(now, since)} "
            f"(weight 0 until `lbctl undrain {worker}`)")


def _drains(drains, now):
    return [f"drain record of cluster {d.cluster}: {d.error}" if d.error is not None else
            drain_line(d.worker, d.services, d.since, now) for d in drains]


def _header(clusters):
    if not clusters:
        return ["lbctl status: no cluster has been applied on this host "
                "(`lbctl status FILE` names the cluster and this node)"]
    named = []
    for c in clusters:
        node = c.node or "unknown (`lbctl status FILE` names it)"
        role = f" ({c.role})" if c.role else ""
        named.append(f"cluster {c.cluster}, node {node}{role}")
    return ["lbctl status: " + "; ".join(named)]


def _services(services):
    if not services:
        return ["IPVS services: none"]
    lines = ["IPVS services, incoming " + NO_OUTGOING + ":"]
    for s in services:
        persist = f" persistence {s.persistence}s" if s.persistence else ""
        flags = f" flags {','.join(s.flags)}" if s.flags else ""
        lines.append(f"  {s.service} {s.scheduler}{flags}{persist}  connections {s.connections}"
                     f" ({s.conns_per_s}/s)  in {s.in_packets} packets"
                     f" ({s.in_packets_per_s}/s)  {s.in_bytes} bytes"
                     f" ({s.in_bytes_per_s} B/s)")
        for d in s.real_servers:
            weight = f"{d.weight}{' drained' if d.drained else ''}"
            lines.append(f"    -> {d.address:<21} {d.forward:<6} weight {weight:<5}"
                         f" active {d.active:<5} inactive {d.inactive:<5}"
                         f" connections {d.connections}")
    return lines


def _sync(sync):
    if not sync.daemons:
        return ["connection sync: no sync daemon running"]
    lines = ["connection sync:"]
    for d in sync.daemons:
        lines.append(f"  {d.role} daemon on {d.interface} syncid {d.syncid}"
                     f" group {d.group} port {d.port}")
    lines.append(f"  connections learned from the peer: {sync.learned_connections}")
    if sync.warning:
        lines.append(f"  WARNING: {sync.warning}")
    return lines


def _drift(status):
    if status.drift_error:
        return [f"drift from the file: not known: {status.drift_error}"]
    if status.drift is None:
        return []
    if not status.drift:
        return ["drift from the file: none"]
    return ["drift from the file (`lbctl apply` would make these changes):"] + [
        f"  {line}" for line in status.drift]
