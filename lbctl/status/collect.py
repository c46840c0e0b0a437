"""What this node is doing now, read once into a NodeStatus: IPVS services and
connection sync on a balancer, keepalived's and BIRD's view, drains, and the
VIPs and ARP settings of a worker.  Nothing here prints: render.py does."""

import os
import re

from lbctl.config.model import Mode
from lbctl.layout import RUN_DIR, Layout
from lbctl.state import FWD_DIRECT_ROUTING
from lbctl.status.model import (
    BgpStatus, ClusterOnNode, DrainStatus, HealthStatus, KeepalivedStatus, NodeStatus,
    OfferStatus, RealServerStatus, ServiceStatus, SyncDaemonStatus, SyncStatus, VrrpStatus,
)

FORWARD_NAMES = {0: "masq", 1: "local", 2: "tunnel", FWD_DIRECT_ROUTING: "route"}
ARP_KEYS = ("arp_ignore", "arp_announce")
CONN_SYNC_TABLE = "/proc/net/ip_vs_conn_sync"
SYNC_DOC = "docs/firewall.md#connection-sync-multicast"


def collect(root="/", cluster=None, node=None, ipvs=None, conn_sync_table=CONN_SYNC_TABLE):
    """This node's NodeStatus.  cluster and node name what it reports on; without
    them, the clusters applied here are read from their ownership records."""
    from lbctl.adapters.addrs import AddressIp
    from lbctl.records.saved import saved_clusters

    addresses = AddressIp().list()
    if ipvs is None:
        from lbctl.adapters.ipvs import IpvsNetlink

        ipvs = IpvsNetlink()
    snapshot = ipvs.snapshot()
    running = saved_clusters(root, strict=False)  # what keepalived runs here, if anything
    drained, drains = drains_here(root, running if cluster is None else [cluster])
    clusters = _reported_on(root, cluster, node)
    keepalived = {name: _with_adverts(info, root, name)
                  for name, info in keepalived_states(root, running, bgp=True).items()}
    services, timeouts, sync = (), None, None
    if snapshot is not None:
        services = tuple(service_status(svc, drained) for svc in snapshot.services)
        timeouts = snapshot.timeouts or {}
        daemons = tuple(SyncDaemonStatus(d.role, d.interface, d.syncid, d.group, d.port)
                        for d in snapshot.sync_daemons)
        learned = learned_connections(conn_sync_table)
        sync = SyncStatus(daemons, learned,
                          sync_warning(daemons, learned, keepalived, [c.cluster for c in clusters]))
    # (Not a pair master's VRRP anchor, a link-local address: render.keepalived.vrrp_anchor.)
    vips_on_lo = tuple(sorted(str(ip) for ip, prefix, ifname in addresses
                              if ifname == "lo" and prefix == 32 and not ip.is_loopback
                              and not ip.is_link_local))
    return NodeStatus(clusters=clusters, services=services, vips_on_lo=vips_on_lo,
                      arp=_arp(addresses), ipvs_loaded=snapshot is not None, drains=drains,
                      timeouts=timeouts, sync=sync, keepalived=keepalived)


def _with_adverts(info, root, cluster):
    from dataclasses import replace

    return replace(info, advertised_addresses=advertised_addresses(root, cluster))


def _arp(addresses):
    from lbctl.adapters.sysctl import SysctlProc

    sysctls = SysctlProc()
    raw = {ifname: {k: sysctls.read(f"net.ipv4.conf.{ifname.replace('.', '/')}.{k}")
                    for k in ARP_KEYS}
           for ifname in sorted({"all"} | {name for _, _, name in addresses if name != "lo"})}
    return effective_arp(raw)


def _reported_on(root, cluster, node):
    """The cluster given, or those applied on this host."""
    if cluster is not None:
        from lbctl.engine.desired import role_of

        return (ClusterOnNode(cluster.name, node, role_of(cluster, node)),)
    from lbctl.layout import OWNERSHIP_DIR
    from lbctl.records.ownership import applied_here

    return tuple(ClusterOnNode(name, applied_node, None)
                 for name, applied_node in applied_here(root, OWNERSHIP_DIR))


def drains_here(root, clusters=None):
    """({DestKey} drained, (DrainStatus, ...)) on this balancer, for the
    clusters given or those with a saved copy here."""
    from lbctl.adapters.files import FilesRoot
    from lbctl.records.drains import drained_dests, read_drains
    from lbctl.errors import LbctlError
    from lbctl.records.saved import saved_clusters

    clusters = saved_clusters(root, strict=False) if clusters is None else clusters
    keys, listed = set(), []
    for c in clusters:
        try:
            drains = read_drains(FilesRoot(root), c.name)
        except LbctlError as exc:
            listed.append(DrainStatus(c.name, error=str(exc)))
            continue
        keys |= set(drained_dests(c, drains))
        listed += [DrainStatus(c.name, d.worker, d.describe(), d.since)
                   for d in sorted(drains.values(), key=lambda d: d.worker)]
    return keys, tuple(listed)


def service_status(svc, drained=frozenset()):
    from lbctl.config.model import DestKey

    stats = svc.stats
    return ServiceStatus(
        service=svc.label, scheduler=svc.scheduler, flags=tuple(svc.flags),
        persistence=svc.persistence, connections=stats.conns, conns_per_s=stats.cps,
        in_packets=stats.inpkts, in_bytes=stats.inbytes, in_packets_per_s=stats.inpps,
        in_bytes_per_s=stats.inbps,
        real_servers=tuple(RealServerStatus(
            address=f"{d.address}:{d.port}", forward=FORWARD_NAMES.get(d.forward, str(d.forward)),
            weight=d.weight,
            # (Most nodes have nothing drained: no key made for each of thousands.)
            drained=bool(drained) and svc.key is not None  # (a foreign one: never drained)
            and DestKey(svc.key, d.address, d.port) in drained,
            active=d.active, inactive=d.inactive, connections=d.stats.conns,
            in_bytes=d.stats.inbytes, conns_per_s=d.stats.cps, in_bytes_per_s=d.stats.inbps)
            for d in svc.dests))


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
            # thousands of entries, and the exporter reads it often.
            # Persistence templates are not connections: state NONE, client port 0.
            return sum(1 for fields in map(str.split, fh)
                       if len(fields) > origin and fields[origin] == "SYNC"
                       and fields[state] != "NONE" and fields[client_port] != "0000")
    except OSError:
        return 0


def sync_warning(daemons, learned, keepalived, clusters):
    """The silent failure: a backup whose sync daemon listens but has learned nothing."""
    backup = [d for d in daemons if d.role == "backup"]
    states = [info.vrrp.state for name, info in keepalived.items()
              if info.vrrp is not None and (not clusters or name in clusters)]
    if not backup or "BACKUP" not in states or learned:
        return None
    d = backup[0]
    return (f"this balancer is VRRP BACKUP and holds no connections learned from its peer. "
            f"If the master is serving connections, multicast to the sync group "
            f"{d.group} UDP port {d.port} is being filtered between the balancers "
            f"(IGMP snooping on a switch, or a firewall), and a failover will break every "
            f"connection. Check that both balancers accept UDP to {d.group}:{d.port} "
            f"on {d.interface} and that the switch forwards that group: see {SYNC_DOC}")


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
    """{cluster: KeepalivedStatus} from the notify hooks' state folders, read
    against the config keepalived runs (`clusters`, default the saved copies
    here).  A file stays after what wrote it went (keepalived even runs a
    dropped check's hook after its reload), so only the VRRP role of a pair
    and the checks the config runs are believed.  A checked worker with no
    report yet is listed with state None: keepalived may have added it down
    without a word (a worker a reload brings in).  `bgp`: in mode ecmp, ask
    BIRD too (as root: the exporter's user cannot)."""
    from lbctl.adapters.process import DaemonProcess
    from lbctl.status.health import read_state_dir, read_transitions, workers_health

    if clusters is None:
        from lbctl.records.saved import saved_clusters

        clusters = saved_clusters(root, strict=False)
    running = {c.name: c for c in clusters}
    base = os.path.join(root, RUN_DIR.lstrip("/"))
    found = {}
    for cluster in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not os.path.isdir(os.path.join(base, cluster)):
            continue  # a cluster's lock file (lbctl/records/lock.py)
        layout = Layout(cluster, root)
        state_dir = layout.real(layout.state_dir)
        reported = read_state_dir(state_dir)
        vrrp = reported.get("vrrp")
        health = [HealthStatus(service, worker, r.state, r.since)
                  for service, worker, r in workers_health(reported)]
        config = running.get(cluster)
        if config is not None:
            if config.mode != Mode.FAILOVER:
                vrrp = None  # no VRRP instance: a report left from when it was a pair
            health = _checks_run(config, health)
        found[cluster] = KeepalivedStatus(
            pair=None if config is None else config.mode == Mode.FAILOVER,
            mode=None if config is None else str(config.mode),
            vrrp=None if vrrp is None else VrrpStatus(vrrp.state, vrrp.since),
            transitions=read_transitions(state_dir),
            health=tuple(health),
            running=DaemonProcess(layout, "keepalived", layout.conf).pid() is not None,
            bgp=_bgp(layout, config) if bgp and config is not None and config.mode == Mode.ECMP
            else None)
    return found


def _bgp(layout, config):
    from lbctl.status.bgp import bgp_report

    return bgp_status(bgp_report(layout.real(layout.bird_socket)), str(config.bgp.router))


def bgp_status(said, router):
    """A BgpStatus from bgp.bgp_report()'s answer on the session to `router`."""
    offered = tuple(OfferStatus(o["vip"], o["since"]) for o in said["offered"])
    return BgpStatus(router=router, error=said["error"], state=said["state"],
                     since=said["since"], last_error=said["last_error"], offered=offered)


def _checks_run(cluster, health):
    """The health reports of the checks `cluster` runs, each checked worker once."""
    by_pair = {(h.service, h.worker): h for h in health}
    return sorted((by_pair.get((svc.name, rs.worker))
                   or HealthStatus(svc.name, rs.worker, None, None)
                   for svc in cluster.services.values() if svc.health is not None
                   for rs in svc.real_servers),
                  key=lambda h: (h.service, h.worker))


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
    return None if block is None else tuple(
        sorted(re.findall(r"^\s*([0-9.]+)/32\b", block[1], re.M)))
