"""The nodes and how they stand together: balancers and workers, the mode
(one balancer, a failover pair, ECMP), VRRP, the LAN, and addresses that
must not be shared."""

import re
import zlib
from ipaddress import IPv4Network

from lbctl.config.model import Balancer, Vrrp, Worker

IFNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")

BALANCER_KEYS = {"address", "interface", "priority"}

WORKER_KEYS = {"address", "weight"}

VRRP_KEYS = {"router_id", "advert_interval", "preempt", "unicast"}

FILE_MODES = ("failover", "ecmp")  # what `mode:` may say; one balancer needs none

MAX_ECMP_BALANCERS = 16

PAIR_PRIORITIES = (150, 100)  # first and second balancer, when the file gives none


def check_mode(c, top):
    """`mode:` as the file gives it, or None."""
    if "mode" not in top:
        return None
    return c.choice(top["mode"], ("mode",), FILE_MODES, "mode")


def check_balancers(c, value, ecmp=False):
    if isinstance(value, dict) and len(value) > (MAX_ECMP_BALANCERS if ecmp else 2):
        extra = list(value)[MAX_ECMP_BALANCERS if ecmp else 2]
        c.error(("balancers", extra), f"balancers: at most {MAX_ECMP_BALANCERS} balancers in "
                "mode ecmp" if ecmp else "balancers: at most two balancers (one failover pair) "
                "per cluster; for more, all active, use `mode: ecmp`", key=True)
    if ecmp and isinstance(value, dict) and len(value) < 2:
        c.error(("balancers",), "balancers: mode ecmp spreads flows over two or more "
                "balancers; this file has one", key=True)
    result = {}
    for name, spec, p in c.entries(value, "balancers", "balancer", BALANCER_KEYS, ("address",)):
        addr = c.address(spec["address"], p + ("address",)) if "address" in spec else None
        iface = spec.get("interface")
        if iface is not None and (not isinstance(iface, str) or not IFNAME_RE.fullmatch(iface)):
            c.error(p + ("interface",), f"{c.where(p + ('interface',))}: {iface!r} is not a "
                    "valid interface name (up to 15 letters, digits, '_', '.', '-')")
            iface = None
        prio = None
        if ecmp and "priority" in spec:
            c.error(p + ("priority",), f"{c.where(p + ('priority',))}: a VRRP priority, and "
                    "mode ecmp runs no VRRP; remove it", key=True)
        elif "priority" in spec:
            prio = c.integer(spec["priority"], p + ("priority",), 1, 254, "priority")
        if addr is not None:
            result[name] = Balancer(name, addr, iface, prio)
    if len(result) == 2 and not ecmp:
        result = _pair_priorities(c, result)
    return result


def _pair_priorities(c, pair):
    """Both balancers get a priority; the first listed wins when the file gives none."""
    named = {}
    for (name, b), default in zip(pair.items(), PAIR_PRIORITIES):
        named[name] = Balancer(b.name, b.address, b.interface,
                               b.priority if b.priority is not None else default)
    first, second = named.values()
    if first.priority == second.priority:
        c.error(("balancers", second.name, "priority"), f"balancers.{second.name}.priority: "
                f"{second.priority} is also the priority of {first.name}; the pair needs "
                "different priorities so one of them is clearly master")
    return named


def check_vrrp(c, top, cluster_name, balancers, services):
    """VRRP settings whenever keepalived runs the balancers, else None."""
    needs_keepalived = ("vrrp" in top or len(balancers) > 1
                        or any(s.health is not None for s in services.values()))
    if not needs_keepalived:
        return None
    spec = top.get("vrrp", {})
    p = ("vrrp",)
    if c.mapping(spec, p, VRRP_KEYS) is None:
        return None
    default_id = 1 + zlib.crc32(str(cluster_name).encode()) % 255
    router_id = c.integer(spec.get("router_id", default_id), p + ("router_id",), 1, 255,
                          "router_id")
    # VRRPv3 counts the advert interval in centiseconds, up to 40.95 s.
    advert = c.duration(spec.get("advert_interval", Vrrp.advert_interval),
                        p + ("advert_interval",), 0.01, 40.95)
    preempt = c.boolean(spec.get("preempt", Vrrp.preempt), p + ("preempt",))
    unicast = c.boolean(spec.get("unicast", True), p + ("unicast",))
    if None in (router_id, advert, preempt, unicast):
        return None
    return Vrrp(router_id, round(advert, 2), preempt, unicast)


def check_workers(c, value):
    result = {}
    for name, spec, p in c.entries(value, "workers", "worker", WORKER_KEYS, ("address",)):
        addr = c.address(spec["address"], p + ("address",)) if "address" in spec else None
        weight = c.integer(spec.get("weight", 1), p + ("weight",), 0, 65535, "weight")
        if addr is not None and weight is not None:
            result[name] = Worker(name, addr, weight)
    return result


def check_network(c, top, balancers):
    """The balancer's L2 network: `network:` when given, else the /24 around the balancer."""
    if "network" in top:
        try:
            net = IPv4Network(str(top["network"]), strict=False)
        except ValueError:
            c.error(("network",), f"network: {top['network']!r} is not an IPv4 network "
                    "such as 192.168.100.0/24")
            return None
        return net
    if balancers:
        first = next(iter(balancers.values()))
        return IPv4Network(f"{first.address}/24", strict=False)
    return None


def cross_checks(c, balancers, workers, services, network, ecmp=False):
    seen = {}  # address -> (section, node name)
    for kind, nodes in (("balancers", balancers), ("workers", workers)):
        for name, node in nodes.items():
            p = (kind, name, "address")
            if kind == "workers" and name in balancers:
                c.error((kind, name), f"workers.{name}: {name} is also the name of a balancer; "
                        "every node needs a name of its own (plan and apply find a node by its "
                        "name, and would take this worker for the balancer)", key=True)
            if node.address in seen:
                c.error(p, _shared_address(kind, name, node.address, *seen[node.address]))
            seen[node.address] = (kind, name)
            if network is not None and node.address not in network:
                c.error(p, f"{kind}.{name}.address: {node.address} is not on the balancer's "
                        f"L2 network {network}; direct routing forwards frames by MAC, so "
                        "workers must share the balancer's LAN (set `network:` if it is wider)")
    keys = {}
    for name, svc in services.items():
        p = ("services", name)
        if svc.vip in seen:
            c.error(p + ("vip",), f"services.{name}.vip: {svc.vip} is the address of node "
                    f"{seen[svc.vip][1]}; a VIP must be an address of its own")
        elif network is not None and network.prefixlen < 31 \
                and svc.vip in (network.network_address, network.broadcast_address):
            which = "broadcast" if svc.vip == network.broadcast_address else "network"
            c.error(p + ("vip",), f"services.{name}.vip: {svc.vip} is the {which} address of "
                    f"the cluster's network {network}, not one host's; a VIP must be a host "
                    "address (set `network:` if the LAN is wider)")
        else:
            _check_routed(c, name, svc, network, ecmp)
        if svc.key in keys:
            c.error(p, f"services.{name}: {svc.key} is already defined by service {keys[svc.key]}",
                    key=True)
        keys[svc.key] = name


def _check_routed(c, name, svc, network, ecmp):
    """Outside mode ecmp a balancer holds each VIP on its LAN interface and
    answers ARP for it there: a VIP off that LAN reaches it only through a
    route the site's router has, which the file must say it has."""
    p = ("services", name)
    if ecmp:
        if svc.routed:
            c.error(p + ("routed",), f"services.{name}.routed: in mode ecmp every VIP is "
                    "routed already (BIRD offers it to the router); leave `routed` out")
        return
    if network is None:
        return
    if svc.vip not in network and not svc.routed:
        c.error(p + ("vip",), f"services.{name}.vip: {svc.vip} is not on the balancer's "
                f"network {network}; the balancer answers ARP for it on the LAN, so no client "
                "would reach it unless a router sends it there.  If your router routes "
                f"{svc.vip} to the balancers, say so with `routed: true` on the service (in a "
                "pair, route it via an address that moves with the master, a VIP on the LAN); "
                "if the LAN is wider, set `network:`")
    elif svc.vip in network and svc.routed:
        c.error(p + ("routed",), f"services.{name}.routed: {svc.vip} is on the balancer's "
                f"network {network}, where clients find it by ARP; `routed: true` is for a VIP "
                "off the LAN: leave it out")


def _shared_address(kind, name, address, other_kind, other):
    where = f"{kind}.{name}.address: {address}"
    if kind == other_kind:
        return f"{where} is already the address of {other}"
    # Balancers are listed first, so `other` is the balancer.
    return (f"{where} is also the address of balancer {other}; one host as both balancer and "
            "worker is not supported in direct routing: lbctl gives each host one role, and in "
            "a pair the other balancer's IPVS would take the packets forwarded to this host as "
            "a worker and balance them again instead of serving them; use separate hosts")
