"""Mode ecmp: the bgp section (the balancers' AS, the router, timers and
BFD), and what mode ecmp asks of the services."""

from dataclasses import replace

from lbctl.config.model import Bfd, Bgp

BGP_KEYS = {"as", "router", "hold", "keepalive", "bfd"}

BGP_ROUTER_KEYS = {"address", "as"}

BFD_KEYS = {"interval", "multiplier"}

# 4-byte AS numbers.  23456 is AS_TRANS, which stands in for them on 2-byte
# sessions; 65535 and 4294967295 are reserved (RFC 7300).
MAX_AS = 4294967295

RESERVED_AS = {23456: "AS_TRANS, a placeholder of BGP itself", 65535: "reserved (RFC 7300)",
               4294967295: "reserved (RFC 7300)"}

# Software BFD faster than this flaps on a busy Pi; slower than this, BGP's hold
# time would notice first.
MIN_BFD_INTERVAL, MAX_BFD_INTERVAL = 0.05, 10


def check_ecmp(c, top, services, network):
    """What ECMP's all-active balancers rule out: VRRP, any scheduler but mh,
    persistence, and VIPs on the balancers' own LAN."""
    if "vrrp" in top:
        c.error(("vrrp",), "vrrp: mode ecmp runs no VRRP (every balancer is active, and the "
                "router's routes decide who gets a flow); remove this section", key=True)
    for name, svc in services.items():
        if svc.scheduler != "mh":
            given = "scheduler" in top["services"][name]
            c.error(("services", name, "scheduler") if given else ("services", name),
                    f"services.{name}: mode ecmp needs scheduler mh, found {svc.scheduler}"
                    f"{'' if given else ' (the default)'}: a flow the router moves to another "
                    "balancer must reach the same worker, and only mh's consistent hash gives "
                    "every balancer the same choice", key=not given)
        if svc.persistence:
            c.error(("services", name, "persistence"), f"services.{name}.persistence: each "
                    "balancer keeps its own persistence templates, so a client's connections "
                    "that the router sends to different balancers would reach different "
                    "workers; in mode ecmp mh's hash already keeps a client on its worker: "
                    "remove it")
        if network is not None and svc.vip in network:
            c.error(("services", name, "vip"), f"services.{name}.vip: {svc.vip} is on the "
                    f"balancers' LAN {network}; in mode ecmp the router routes each VIP to the "
                    "balancers, and a client on the LAN would ask for it by ARP, which no "
                    "balancer answers: take VIPs from a network of their own")


def with_mh_fallback(services):
    """Every mh service of mode ecmp gets mh-fallback, whatever the file says.

    IPVS keeps a worker whose weight fell to 0 (a failed check, a drain) in
    mh's table, so that its flows go back to it when it returns; without
    mh-fallback, a new flow that hashes to it is dropped.  A failover pair
    can do without it; every balancer of mode ecmp serves at once, and a
    failed worker must cost no new connection on any of them."""
    return {name: replace(svc, scheduler_flags=tuple(sorted({*svc.scheduler_flags,
                                                              "mh-fallback"})))
            if svc.scheduler == "mh" else svc for name, svc in services.items()}


def _as_number(c, value, path):
    number = c.integer(value, path, 1, MAX_AS, "AS number")
    if number in RESERVED_AS:
        c.error(path, f"{c.where(path)}: AS {number} is {RESERVED_AS[number]}; use a private "
                "AS such as 64512 to 65534 or 4200000000 to 4294967294")
        return None
    return number


def check_bgp(c, top, ecmp, balancers, workers, services, network):
    """The BGP settings of mode ecmp (model.Bgp), None in the other modes."""
    p = ("bgp",)
    if not ecmp:
        if "bgp" in top:
            c.error(p, "bgp: BGP announces the VIPs in mode ecmp only; add `mode: ecmp` "
                    "(every balancer active behind the router) or remove this section", key=True)
        return None
    if "bgp" not in top:
        c.error(("mode",), "mode: ecmp needs a `bgp:` section: this balancers' AS (`as`) and "
                "the router they announce the VIPs to (`router: {address: ..., as: ...}`)")
        return None
    spec = c.mapping(top["bgp"], p, BGP_KEYS, required=("as", "router"))
    if spec is None:
        return None
    local_as = _as_number(c, spec["as"], p + ("as",)) if "as" in spec else None
    router, router_as = None, None
    if "router" in spec and c.mapping(spec["router"], p + ("router",), BGP_ROUTER_KEYS,
                                      required=("address", "as")) is not None:
        rp = p + ("router",)
        if "address" in spec["router"]:
            router = _router_address(c, spec["router"]["address"], rp + ("address",),
                                     balancers, workers, services, network)
        if "as" in spec["router"]:
            router_as = _as_number(c, spec["router"]["as"], rp + ("as",))
    if None not in (local_as, router_as) and local_as == router_as:
        c.error(p + ("as",), f"bgp.as: {local_as} is also the router's AS; lbctl speaks eBGP "
                "to the router (iBGP resolves next hops differently): give the balancers an AS "
                "of their own")
        local_as = None
    hold = c.whole_seconds(spec.get("hold", Bgp.hold), p + ("hold",), 3, 65535, "BGP")
    keepalive = None
    if hold is not None:
        # RFC 4271 suggests a third of the hold time: two keepalives may be lost.
        longest = max(1, hold // 3)
        keepalive = c.whole_seconds(
            spec.get("keepalive", longest), p + ("keepalive",), 1, longest, "BGP",
            bound_by=f"at most a third of bgp.hold ({hold}s), so that two keepalives lost "
            f"do not end the session: {longest}s or less, or a longer hold")
    bfd = _bfd(c, spec.get("bfd", False), p + ("bfd",))
    if bfd and hold is not None and bfd.interval * bfd.multiplier >= hold:
        c.error(p + ("bfd",), f"bgp.bfd: {bfd.interval:g}s x {bfd.multiplier} is no sooner "
                f"than the hold time ({hold}s): BFD would notice nothing BGP does not")
        bfd = False
    if None in (local_as, router, router_as, hold, keepalive) or bfd is False:
        return None
    return Bgp(local_as, router, router_as, hold, keepalive, bfd)


def _router_address(c, value, path, balancers, workers, services, network):
    address = c.address(value, path)
    if address is None:
        return None
    nodes = {n.address: name for name, n in {**balancers, **workers}.items()}
    if address in nodes:
        c.error(path, f"{c.where(path)}: {address} is the address of node {nodes[address]}; "
                "the router is the host the balancers announce the VIPs to")
        return None
    if network is not None and network.prefixlen < 31 \
            and address in (network.network_address, network.broadcast_address):
        c.error(path, f"{c.where(path)}: {address} is the network or broadcast address of "
                f"{network}, not a host's")
        return None
    if address in {s.vip for s in services.values()}:
        c.error(path, f"{c.where(path)}: {address} is a VIP; the router needs an address "
                "of its own")
        return None
    if network is not None and address not in network:
        c.error(path, f"{c.where(path)}: {address} is not on the balancers' network "
                f"{network}; each balancer talks BGP to the router over the LAN (set "
                "`network:` if it is wider)")
        return None
    return address


def _bfd(c, value, path):
    """Bfd settings, None for no BFD, False when the value is wrong."""
    if value is True:
        return Bfd()
    if value is False:
        return None
    spec = c.mapping(value, path, BFD_KEYS) if not isinstance(value, bool) else None
    if spec is None:
        return False
    ip = path + ("interval",)
    interval = c.duration(spec.get("interval", Bfd.interval), ip, MIN_BFD_INTERVAL,
                          MAX_BFD_INTERVAL)
    if interval is not None and round(interval * 1000, 6) != round(interval * 1000):
        c.error(ip, f"{c.where(ip)}: {spec['interval']!r} is not a whole number of "
                "milliseconds")
        interval = None
    multiplier = c.integer(spec.get("multiplier", Bfd.multiplier), path + ("multiplier",), 3,
                           50, "multiplier")
    if None in (interval, multiplier):
        return False
    return Bfd(interval, multiplier)
