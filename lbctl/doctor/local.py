"""Checks of this node against the file, from the facts read here.

Each check returns findings for this node only; what only the wire shows
(who answers ARP, whether a worker takes a direct-routed SYN) is in wire.py.
"""

from lbctl.config.model import SCHEDULERS, Mode
from lbctl.doctor.facts import Route
from lbctl.doctor.report import Finding

# arp_ignore values under which a worker never answers ARP for the VIP on lo
# but still for its own address: 1 (target address on the incoming
# interface), 2 (and the sender in its subnet).  3 still answers for a global
# address on lo; 8 answers nothing, so the balancer cannot find the worker.
SAFE_ARP_IGNORE = (1, 2)
SILENT_ARP_IGNORE = 8
ARP_ANNOUNCE = 2  # always pick the interface's own address as ARP source


def sysctl_name(ifname, key):
    # sysctl(8) spells a dot inside an interface name (eth0.100) as '/'.
    return f"net.ipv4.conf.{ifname.replace('.', '/')}.{key}"


def served_services(cluster, worker):
    return [svc for svc in sorted(cluster.services.values(), key=lambda s: s.name)
            if any(rs.worker == worker for rs in svc.real_servers)]


def worker_findings(cluster, name, ifname, facts, file_hint):
    services = served_services(cluster, name)
    lan = facts.lan_interfaces(cluster, ifname)
    return (_vips_off_the_lan(name, services, lan, facts, file_hint)
            + [f for each in lan for f in _arp_settings(name, each, facts, file_hint)]
            + _rp_filter(cluster, name, ifname, facts)
            + _listeners(name, services, facts))


def _vips_off_the_lan(name, services, lan, facts, file_hint, sender="the balancer"):
    """Each VIP the worker serves must be local (on lo, or a dummy interface)
    but on no LAN interface, where ARP would be answered for it.  `sender`:
    who sends the node the VIP's requests (an ECMP balancer's is the router)."""
    found = []
    on_lo = sorted(str(ip) for ip, prefix in facts.addresses_on("lo") if prefix == 32)
    for vip in sorted({svc.vip for svc in services}):
        names = ", ".join(s.name for s in services if s.vip == vip)
        held = [(n, p) for ip, p, n in facts.addresses if ip == vip]
        on_lan = [(n, p) for n, p in held if n in lan]
        if on_lan:
            dels = "; ".join(f"sudo ip address del {vip}/{p} dev {n}" for n, p in on_lan)
            found.append(Finding(
                name, "vip-on-lan-interface",
                f"holds VIP {vip} ({names}) on its LAN interface {on_lan[0][0]}, so it answers "
                f"ARP for it and takes the VIP's traffic from {sender}",
                f"{vip}/{on_lan[0][1]} is on {on_lan[0][0]}",
                f"{dels}; then `sudo lbctl apply {file_hint}` on {name} puts it on lo"))
        elif wider := [p for n, p in held if n == "lo" and p != 32]:
            wide = wider[0]
            found.append(Finding(
                name, "vip-prefix-on-lo",
                f"holds VIP {vip} ({names}) on lo as /{wide}: every address of that "
                "network is then local to it, so it cannot reach the LAN's other hosts there",
                f"{vip}/{wide} is on lo",
                f"sudo ip address del {vip}/{wide} dev lo; sudo ip address add {vip}/32 dev lo"))
        elif not held:
            found.append(Finding(
                name, "vip-not-on-lo",
                f"does not hold VIP {vip} ({names}) on lo, so it drops the requests "
                f"{sender} forwards to it",
                f"lo holds {', '.join(on_lo) or 'no /32 address'}",
                f"sudo ip address add {vip}/32 dev lo; `sudo lbctl apply {file_hint}` on "
                f"{name} also restores its boot unit"))
    return found


def _arp_settings(name, ifname, facts, file_hint, bypassed="the balancer"):
    found = []
    ignore = facts.effective(ifname, "arp_ignore")
    announce = facts.effective(ifname, "arp_announce")
    raw = (f"all={facts.conf.get(('all', 'arp_ignore'))} "
           f"{ifname}={facts.conf.get((ifname, 'arp_ignore'))}")
    fix = (f"sudo sysctl -w {sysctl_name('all', 'arp_ignore')}=1 "
           f"{sysctl_name(ifname, 'arp_ignore')}=1; " + _kept_across_reboots(
               facts, ifname, "arp_ignore", 1, name, file_hint))
    if ignore == SILENT_ARP_IGNORE:
        found.append(Finding(
            name, "arp-silent",
            f"answers no ARP at all on {ifname} (arp_ignore 8), not even for its own "
            "address, so the balancer cannot find its MAC to forward requests to it",
            f"arp_ignore {raw}; the kernel acts on the larger", fix))
    elif ignore is not None and ignore not in SAFE_ARP_IGNORE:
        found.append(Finding(
            name, "arp-flux",
            f"answers ARP on {ifname} for the VIPs it holds (arp_ignore {ignore}), so "
            f"clients can reach it directly, bypassing {bypassed}",
            f"arp_ignore {raw}; the kernel acts on the larger", fix))
    if announce is not None and announce != ARP_ANNOUNCE:
        found.append(Finding(
            name, "arp-announce",
            f"may send ARP requests on {ifname} from a VIP it holds (arp_announce "
            f"{announce}), teaching the LAN its MAC for the VIP",
            f"arp_announce all={facts.conf.get(('all', 'arp_announce'))} "
            f"{ifname}={facts.conf.get((ifname, 'arp_announce'))}; the kernel acts on the larger",
            f"sudo sysctl -w {sysctl_name('all', 'arp_announce')}=2 "
            f"{sysctl_name(ifname, 'arp_announce')}=2; " + _kept_across_reboots(
                facts, ifname, "arp_announce", 2, name, file_hint)))
    return found


def _kept_across_reboots(facts, ifname, key, wanted, name, file_hint):
    """How the fix outlives a reboot.  lbctl's sysctl.d file sets only `all`
    (and the kernel acts on the larger of `all` and the interface's value),
    so an interface's own value above it must go wherever it is set."""
    text = f"`sudo lbctl apply {file_hint}` on {name} keeps `all` so across reboots"
    own = facts.conf.get((ifname, key))
    if own is not None and own > wanted:
        text += (f"; {ifname}'s own {own} is set elsewhere: take it out of the file that "
                 f"`grep -r {key} /etc/sysctl.conf /etc/sysctl.d /run/sysctl.d "
                 "/usr/lib/sysctl.d` names")
    return text


def _rp_filter(cluster, name, ifname, facts):
    """Strict reverse-path filtering drops a request arriving on the LAN
    interface when the route back to its client leaves by another one (a
    second NIC, Wi-Fi with the default route, a route to some clients): the
    reply would, so the kernel takes the request for spoofed."""
    if facts.effective(ifname, "rp_filter") != 1:
        return []
    elsewhere = [(r.dst, r.dev) for r in _routes_taken(facts.routes)
                 if r.dev not in (ifname, "lo") and not _beside_the_lan(cluster, r)]
    if not elsewhere:
        return []
    clients = ", ".join(f"{dst} via {dev}" for dst, dev in elsewhere)
    return [Finding(
        name, "rp-filter",
        f"drops requests from clients it routes by another interface than {ifname} "
        f"({clients}): rp_filter on {ifname} is strict",
        f"rp_filter all={facts.conf.get(('all', 'rp_filter'))} "
        f"{ifname}={facts.conf.get((ifname, 'rp_filter'))}; the kernel acts on the larger",
        f"sudo sysctl -w {sysctl_name('all', 'rp_filter')}=2 "
        f"{sysctl_name(ifname, 'rp_filter')}=2 (loose); to keep it across reboots, put "
        f"`{sysctl_name('all', 'rp_filter')} = 2` and `{sysctl_name(ifname, 'rp_filter')} = 2` "
        "in /etc/sysctl.d/99-rp-filter.conf")]


def _listeners(name, services, facts):
    found = []
    for svc in services:
        taking = {(svc.protocol, "*", svc.port), (svc.protocol, str(svc.vip), svc.port)}
        if taking & facts.listeners:
            continue
        others = sorted(f"{addr}:{port}" for proto, addr, port in facts.listeners
                        if proto == svc.protocol and port == svc.port)
        found.append(Finding(
            name, "not-listening-on-vip",
            f"no {svc.protocol.upper()} server takes {svc.vip}:{svc.port} ({svc.name}): "
            "direct-routed requests keep the VIP as their destination",
            f"{svc.protocol} sockets on port {svc.port}: " + (", ".join(others) or "none"),
            "make the server listen on every address ("
            + (f"nginx `listen {svc.port};`, Apache `Listen {svc.port}`" if svc.protocol == "tcp"
               else "a DNS server's listen-on or interface setting")
            + f") or on {svc.vip}:{svc.port}, and restart it"
            + ("; for UDP the VIP itself is safer: a socket on every address may answer "
               "from the worker's own address, which the client drops"
               if svc.protocol == "udp" else "")))
    return found


def balancer_findings(cluster, name, ifname, facts, file_hint):
    return (_ipvs_modules(cluster, name, facts)
            + _balancer_vips(cluster, name, ifname, facts, file_hint)
            + _routed_vips(cluster, name, ifname, facts, file_hint)
            + _workers_on_lan(cluster, name, ifname, facts)
            + _rp_filter(cluster, name, ifname, facts))


def _routes_taken(routes):
    """Of the routes to one destination (a Pi's default by Ethernet and by
    Wi-Fi, with dhcpcd's metrics), the one the kernel takes: the lowest metric."""
    taken = {}
    for route in map(lambda r: Route(*r), routes):
        if route.dst not in taken or route.metric < taken[route.dst].metric:
            taken[route.dst] = route
    return list(taken.values())


def _beside_the_lan(cluster, route):
    """A network of another interface's own that is not the cluster's (docker0,
    a VPN's): its hosts are reached there, and send nothing to the VIP."""
    from ipaddress import IPv4Network

    if not route.connected or route.dst == "default":
        return False
    try:
        return not IPv4Network(route.dst, strict=False).overlaps(cluster.network)
    except ValueError:
        return False


def _ipvs_modules(cluster, name, facts):
    """IPVS and each service's scheduler must be in the kernel or loadable."""
    have = facts.modules_loaded | facts.modules_available
    if not facts.ipvs_loaded and "ip_vs" not in have:
        return [Finding(name, "no-ipvs", "this kernel has no IPVS (ip_vs)",
                        "/proc/net/ip_vs is missing and no ip_vs module is installed",
                        "install a kernel with IPVS (Raspberry Pi OS and Debian kernels have it "
                        "as a module) and reboot into it")]
    found = []
    for scheduler in sorted({s.scheduler for s in cluster.services.values()}):
        module = f"ip_vs_{scheduler}"
        if module in have:
            continue
        users = ", ".join(sorted(s.name for s in cluster.services.values()
                                 if s.scheduler == scheduler))
        usable = sorted(m.removeprefix("ip_vs_") for m in have
                        if m.startswith("ip_vs_") and m[6:] in SCHEDULERS)
        found.append(Finding(
            name, "scheduler-missing",
            f"cannot schedule with {scheduler} ({users}): the kernel has no {module}",
            f"{module} is neither loaded nor among the kernel's modules",
            f"pick another `scheduler:` for {users} in the file (this kernel has: "
            f"{', '.join(usable) or 'none'}), or install the module"))
    return found


def _balancer_vips(cluster, name, ifname, facts, file_hint):
    """A single balancer holds every VIP on its LAN interface.  Of a pair, only
    the master does; which one that is shows on the wire (wire.py)."""
    if cluster.mode != Mode.SINGLE:
        return []
    held = {ip for ip, _p in facts.addresses_on(ifname)}
    return [Finding(name, "vip-not-on-balancer",
                    f"does not hold VIP {vip} on {ifname}, so no request for it arrives",
                    f"{ifname} holds {', '.join(sorted(map(str, held))) or 'no address'}",
                    f"sudo lbctl apply {file_hint} on {name}")
            for vip in cluster.vips if vip not in held]


def _routed_vips(cluster, name, ifname, facts, file_hint):
    """Mode ecmp: the router sends a VIP's packets to each balancer by BGP, so a
    balancer holds every VIP on lo and answers no ARP for them, as a worker
    does.  (The wire check cannot hear the host that probes answer.)"""
    if cluster.mode != Mode.ECMP:
        return []
    services = sorted(cluster.services.values(), key=lambda s: s.name)
    lan = facts.lan_interfaces(cluster, ifname)
    return (_vips_off_the_lan(name, services, lan, facts, file_hint, sender="the router")
            + [f for each in lan
               for f in _arp_settings(name, each, facts, file_hint, bypassed="the router")])


def _workers_on_lan(cluster, name, ifname, facts):
    """Direct routing rewrites only the MAC: every worker must be on a network
    of the balancer's LAN interface."""
    from ipaddress import IPv4Network

    networks = [IPv4Network(f"{ip}/{p}", strict=False) for ip, p in facts.addresses_on(ifname)
                if p < 32]
    return [Finding(worker, "worker-off-lan",
                    f"is not on a network of {name}'s {ifname}, so direct routing cannot "
                    "reach it",
                    f"{w.address} is outside {', '.join(map(str, networks)) or 'every network'}",
                    f"put {worker} on the balancer's LAN (same switch or VLAN), with an "
                    f"address in {networks[0] if networks else 'its network'}")
            for worker, w in sorted(cluster.workers.items())
            if not any(w.address in net for net in networks)]
