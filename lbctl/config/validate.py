"""Plain YAML data to a Cluster, reporting every problem at once.

Each check names the path in the file, what was found and what is allowed.
Strings that other files will carry (names, interface names) are held to
tight patterns, so nothing from the config can inject text into generated
sysctl, systemd or keepalived files.
"""

import re
import zlib
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network, ip_address

from lbctl.config.model import (
    HEALTH_KINDS, HEALTH_PROFILES, IPVS_TIMEOUTS, PROTOCOLS, SCHEDULER_FLAGS, SCHEDULERS, Balancer, Bfd, Bgp, Cluster, HealthCheck,
    DEFAULT_EXPORTER_LISTEN, NAME_PATTERN, RealServer, Ssh, VirtualService, Vrrp, Worker, split_listen,
)
from lbctl.errors import ConfigError

NAME_RE = re.compile(NAME_PATTERN)
IFNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")

TOP_KEYS = {"cluster", "network", "balancers", "workers", "services", "vrrp", "ipvs", "ssh",
            "exporter", "mode", "bgp"}
IPVS_KEYS = {"timeouts"}
# keepalived's limit for lvs_timeouts (LVS_MAX_TIMEOUT): 31 days.
MAX_IPVS_TIMEOUT = 86400 * 31
BALANCER_KEYS = {"address", "interface", "priority"}
WORKER_KEYS = {"address", "weight"}
SERVICE_KEYS = {"vip", "port", "protocol", "scheduler", "persistence", "workers", "health",
                "scheduler_flags", "one_packet"}
VRRP_KEYS = {"router_id", "advert_interval", "preempt", "unicast"}
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
FILE_MODES = ("failover", "ecmp")  # what `mode:` may say; one balancer needs none
MAX_ECMP_BALANCERS = 16
HEALTH_KEYS = set(HEALTH_KINDS) | {"interval", "timeout", "retries", "rise", "profile"}
KIND_KEYS = {"http": {"path", "status"}, "tcp": set(), "udp": {"payload", "reply"},
             "exec": {"command"}}
# Strings that reach keepalived.conf: no whitespace, quotes, braces, backslashes,
# or keepalived's comment characters '#' and '!'.
HTTP_PATH_RE = re.compile(r"/[A-Za-z0-9._~%/?&=+:@,-]*")
# UDP probe and reply bytes, as even-length hex (keepalived reads them as hex).
HEX_RE = re.compile(r"(?:[0-9A-Fa-f]{2}){1,255}")
COMMAND_ARG_RE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
SSH_KEYS = {"user", "port", "sudo", "hosts"}
# What ssh takes as a login and a host: never an option (a leading '-') or
# anything a shell or ssh_config would read twice.
SSH_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
SSH_HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s)")
PAIR_PRIORITIES = (150, 100)  # first and second balancer, when the file gives none


class _Checker:
    def __init__(self, doc):
        self.doc = doc
        self.errors = []

    def error(self, path, message, key=False):
        self.errors.append(self.doc.diagnostic(path, message, key=key))

    def where(self, path):
        return ".".join(str(p) for p in path) or "top level"

    def mapping(self, value, path, allowed, required=()):
        if not isinstance(value, dict):
            self.error(path, f"{self.where(path)}: expected a mapping, found {_kind(value)}")
            return None
        for key in value:
            if key not in allowed:
                self.error(path + (key,), f"{self.where(path)}: unknown key {key!r}; "
                           f"allowed keys: {', '.join(sorted(allowed))}", key=True)
        for key in required:
            if key not in value:
                self.error(path, f"{self.where(path)}: missing required key {key!r}")
        return value

    def entries(self, value, section, what, allowed, required):
        """(name, spec, path) of each well-formed NAME: {mapping} entry of a section."""
        path = (section,)
        if not isinstance(value, dict) or not value:
            self.error(path, f"{section}: expected a mapping of {what} names to their settings")
            return
        for name, spec in value.items():
            p = path + (name,)
            ok = self.name(name, p, f"{what} name")
            spec = self.mapping(spec, p, allowed, required=required)
            if spec is not None and ok:
                yield name, spec, p

    def name(self, value, path, what, key=True):
        if not isinstance(value, str):
            self.error(path, f"{what}: YAML reads this as {_kind(value)} ({value!r}), not as a "
                       "name; names are text: put it in quotes", key=key)
            return False
        if not NAME_RE.fullmatch(value):
            self.error(path, f"{what} {value!r} is not a valid name: use letters, digits, "
                       "'_', '.' and '-' (up to 63, starting with a letter or digit)", key=key)
            return False
        return True

    def integer(self, value, path, low, high, what):
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"{self.where(path)}: {what} must be a whole number from "
                       f"{low} to {high}, found {_kind(value)} {value!r}")
            return None
        if not low <= value <= high:
            self.error(path, f"{self.where(path)}: {what} {value} is out of range "
                       f"({low} to {high})")
            return None
        return value

    def address(self, value, path):
        text = value if isinstance(value, str) else None
        try:
            addr = ip_address(text) if text is not None else None
        except ValueError:
            addr = None
        if not isinstance(addr, IPv4Address):
            self.error(path, f"{self.where(path)}: {value!r} is not an IPv4 address")
            return None
        if addr.is_unspecified or addr.is_loopback or addr.is_multicast or addr.is_link_local \
                or addr == IPv4Address("255.255.255.255"):
            self.error(path, f"{self.where(path)}: {addr} cannot be a node or service address "
                       "(unspecified, loopback, multicast, link-local or broadcast)")
            return None
        return addr

    def boolean(self, value, path):
        if not isinstance(value, bool):
            self.error(path, f"{self.where(path)}: expected true or false, found "
                       f"{_kind(value)} {value!r}")
            return None
        return value

    def duration(self, value, path, low, high):
        """Seconds, from a number or a string such as 1s, 0.5s or 200ms."""
        seconds = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str) and DURATION_RE.fullmatch(value):
            number, unit = DURATION_RE.fullmatch(value).groups()
            seconds = float(number) / (1000 if unit == "ms" else 1)
        if seconds is None:
            self.error(path, f"{self.where(path)}: expected a duration such as 1s, 0.5s or "
                       f"200ms, found {_kind(value)} {value!r}")
            return None
        if not low <= seconds <= high:
            self.error(path, f"{self.where(path)}: {value!r} is out of range "
                       f"({_seconds(low)} to {_seconds(high)})")
            return None
        return seconds

    def choice(self, value, path, choices, what):
        if value not in choices:
            self.error(path, f"{self.where(path)}: unknown {what} {value!r}; "
                       f"known: {', '.join(choices)}")
            return None
        return value


def _kind(value):
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "nothing"}.get(type(value), "a value")


def _seconds(value):
    return f"{value:g}s"


def validate(doc):
    c = _Checker(doc)
    top = c.mapping(doc.data, (), TOP_KEYS, required=("cluster", "balancers", "workers", "services"))
    if top is None:
        raise ConfigError(c.errors)
    cluster_name = top.get("cluster")
    if "cluster" in top:
        c.name(cluster_name, ("cluster",), "cluster name", key=False)

    mode = _mode(c, top)
    ecmp = mode == "ecmp"
    # A missing section was reported above; checking it again would only repeat that.
    balancers = _balancers(c, top["balancers"], ecmp) if "balancers" in top else {}
    if mode == "failover" and isinstance(top.get("balancers"), dict) \
            and len(top["balancers"]) != 2:
        c.error(("mode",), "mode: failover is a VRRP pair and needs two balancers; this "
                f"file has {len(top['balancers'])}")
    workers = _workers(c, top["workers"]) if "workers" in top else {}
    network = _network(c, top, balancers)
    services = _services(c, top["services"], workers) if "services" in top else {}
    _cross_checks(c, balancers, workers, services, network)
    bgp = _bgp(c, top, ecmp, balancers, workers, services, network)
    if ecmp:
        _ecmp_checks(c, top, services, network)
        services = _with_mh_fallback(services)
    vrrp = None if ecmp else _vrrp(c, top, cluster_name, balancers, services)
    timeouts = _ipvs_timeouts(c, top["ipvs"]) if "ipvs" in top else {}
    ssh = _ssh(c, top["ssh"], balancers, workers) if "ssh" in top else Ssh()
    exporter = _exporter(c, top["exporter"], balancers) if "exporter" in top else None
    if c.errors:
        raise ConfigError(c.errors)
    return Cluster(name=cluster_name, network=network, balancers=balancers,
                   workers=workers, services=services, source=doc.path, text=doc.text,
                   vrrp=vrrp, ipvs_timeouts=timeouts, ssh=ssh, exporter=exporter, bgp=bgp)


def _mode(c, top):
    """`mode:` as the file gives it, or None."""
    if "mode" not in top:
        return None
    return c.choice(top["mode"], ("mode",), FILE_MODES, "mode")


def _ecmp_checks(c, top, services, network):
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


def _with_mh_fallback(services):
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


def _bgp(c, top, ecmp, balancers, workers, services, network):
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
    hold = _whole_seconds(c, spec.get("hold", Bgp.hold), p + ("hold",), 3, 65535)
    keepalive = None
    if hold is not None:
        # RFC 4271 suggests a third of the hold time: two keepalives may be lost.
        keepalive = _whole_seconds(c, spec.get("keepalive", max(1, hold // 3)),
                                   p + ("keepalive",), 1, max(1, hold // 3))
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


def _whole_seconds(c, value, path, low, high):
    seconds = c.duration(value, path, low, high)
    if seconds is not None and seconds != int(seconds):
        c.error(path, f"{c.where(path)}: {value!r} is not a whole number of seconds; BGP "
                "counts its timers in seconds")
        return None
    return None if seconds is None else int(seconds)


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


def _ipvs_timeouts(c, value):
    """{name: whole seconds} of the timeouts under `ipvs: timeouts:`."""
    if c.mapping(value, ("ipvs",), IPVS_KEYS) is None or "timeouts" not in value:
        return {}
    p = ("ipvs", "timeouts")
    spec = c.mapping(value["timeouts"], p, set(IPVS_TIMEOUTS))
    found = {}
    for name in IPVS_TIMEOUTS:
        if spec is None or name not in spec:
            continue
        seconds = c.duration(spec[name], p + (name,), 1, MAX_IPVS_TIMEOUT)
        if seconds is not None and seconds != int(seconds):
            c.error(p + (name,), f"{c.where(p + (name,))}: {spec[name]!r} is not a whole "
                    "number of seconds; IPVS counts its timeouts in seconds")
            seconds = None
        if seconds is not None:
            found[name] = int(seconds)
    return found


def _ssh(c, value, balancers, workers):
    """How `--all` reaches each node (see model.Ssh)."""
    p = ("ssh",)
    if c.mapping(value, p, SSH_KEYS) is None:
        return Ssh()
    user = value.get("user")
    if user is not None and (not isinstance(user, str) or not SSH_USER_RE.fullmatch(user)):
        c.error(p + ("user",), f"ssh.user: {user!r} is not a login name (letters, digits, "
                "'_', '.', '-', starting with a letter or '_')")
        user = None
    port = c.integer(value["port"], p + ("port",), 1, 65535, "port") if "port" in value else None
    sudo = c.boolean(value["sudo"], p + ("sudo",)) if "sudo" in value else None
    hosts = {}
    if "hosts" in value:
        ph = p + ("hosts",)
        spec = c.mapping(value["hosts"], ph, set(balancers) | set(workers))
        for node, host in (spec or {}).items():
            if node not in balancers and node not in workers:
                continue  # reported as an unknown key
            if not isinstance(host, str) or not SSH_HOST_RE.fullmatch(host):
                c.error(ph + (node,), f"ssh.hosts.{node}: {host!r} is not a host name or "
                        "address (letters, digits, '.', '-')")
                continue
            hosts[node] = host
    return Ssh(user, port, sudo, hosts)


def _exporter(c, value, balancers):
    """`exporter: {listen: ADDRESS:PORT}`: each balancer runs `lbctl exporter` there;
    ADDRESS `node` is each balancer's own address from the file."""
    p = ("exporter",)
    if value is None:
        value = {}  # `exporter:` alone: the defaults
    if c.mapping(value, p, {"listen"}) is None:
        return None
    listen = value.get("listen", DEFAULT_EXPORTER_LISTEN)
    text = listen if isinstance(listen, str) else ""
    try:
        address, _ = split_listen(text.replace("node:", "127.0.0.1:", 1)
                                  if text.startswith("node:") else text)
    except ValueError:
        c.error(p + ("listen",), f"exporter.listen: {listen!r} is not ADDRESS:PORT (an IPv4 "
                "address to bind, 127.0.0.1 for this host only or `node` for each balancer's "
                "own, and a port from 1 to 65535)")
        return None
    shared = {IPv4Address("127.0.0.1"), IPv4Address("0.0.0.0")}
    if len(balancers) > 1 and not text.startswith("node:") and address not in shared:
        c.error(p + ("listen",), f"exporter.listen: {listen!r} names one address, and each "
                "balancer of the pair binds its own: use node:PORT")
        return None
    return text


def _balancers(c, value, ecmp=False):
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


def _vrrp(c, top, cluster_name, balancers, services):
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


def _workers(c, value):
    result = {}
    for name, spec, p in c.entries(value, "workers", "worker", WORKER_KEYS, ("address",)):
        addr = c.address(spec["address"], p + ("address",)) if "address" in spec else None
        weight = c.integer(spec.get("weight", 1), p + ("weight",), 0, 65535, "weight")
        if addr is not None and weight is not None:
            result[name] = Worker(name, addr, weight)
    return result


def _network(c, top, balancers):
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


def _services(c, value, workers):
    result = {}
    for name, spec, p in c.entries(value, "services", "service", SERVICE_KEYS, ("vip", "port")):
        # A missing vip or port is reported already; check the rest all the same.
        vip = c.address(spec["vip"], p + ("vip",)) if "vip" in spec else None
        port = c.integer(spec["port"], p + ("port",), 1, 65535, "port") if "port" in spec else None
        protocol = c.choice(spec.get("protocol", "tcp"), p + ("protocol",), PROTOCOLS, "protocol")
        scheduler = c.choice(spec.get("scheduler", "wlc"), p + ("scheduler",), SCHEDULERS, "scheduler")
        persistence = c.integer(spec.get("persistence", 0), p + ("persistence",), 0, 86400 * 31,
                                "persistence (seconds)")
        real_servers = _real_servers(c, spec.get("workers"), p + ("workers",), workers)
        health, health_ok = _health(c, spec.get("health", "none"), p + ("health",), protocol)
        flags = _scheduler_flags(c, spec.get("scheduler_flags", []), p + ("scheduler_flags",),
                                 scheduler)
        one_packet = c.boolean(spec.get("one_packet", False), p + ("one_packet",))
        if one_packet and protocol == "tcp":
            c.error(p + ("one_packet",), f"services.{name}.one_packet: one-packet scheduling "
                    "is for UDP services; a TCP connection's packets must all reach the same "
                    "worker")
            one_packet = None
        if real_servers and not any(rs.weight for rs in real_servers):
            c.error(p + ("workers",), f"services.{name}: every worker of the service has weight "
                    "0, so it would take no traffic; give a worker a weight above 0, or remove "
                    "the service (removing a worker from it drains that worker)", key=True)
            real_servers = None
        if None in (vip, port, protocol, scheduler, persistence, real_servers, flags,
                    one_packet) or not health_ok:
            continue
        result[name] = VirtualService(name, vip, port, protocol, scheduler, persistence,
                                      real_servers, health, flags, one_packet)
    return result


def _scheduler_flags(c, value, path, scheduler):
    """The sorted scheduler flag names, or None when one is wrong."""
    if value == []:
        return ()
    known = SCHEDULER_FLAGS.get(scheduler, ())
    if not isinstance(value, list):
        c.error(path, f"{c.where(path)}: expected a list of flag names, found {_kind(value)}")
        return None
    if scheduler is not None and not known:
        c.error(path, f"{c.where(path)}: scheduler {scheduler} takes no flags; only sh "
                f"({', '.join(SCHEDULER_FLAGS['sh'])}) and mh "
                f"({', '.join(SCHEDULER_FLAGS['mh'])}) do")
        return None
    ok = True
    for i, flag in enumerate(value):
        if flag not in known:
            c.error(path + (i,), f"{c.where(path)}[{i}]: unknown flag {flag!r} for scheduler "
                    f"{scheduler}; known: {', '.join(known)}")
            ok = False
    if ok and len(set(value)) != len(value):
        c.error(path, f"{c.where(path)}: a flag is listed twice")
        ok = False
    return tuple(sorted(value)) if ok else None


def _health(c, value, path, protocol):
    """(HealthCheck or None for `none`, whether it was valid)."""
    if value == "none":
        return None, True
    spec = c.mapping(value, path, HEALTH_KEYS)
    if spec is None:
        return None, False
    kinds = [k for k in HEALTH_KINDS if k in spec]
    if len(kinds) != 1:
        found = ", ".join(kinds) or "none"
        c.error(path, f"{c.where(path)}: give exactly one check kind of "
                f"{', '.join(HEALTH_KINDS)} (or `health: none`); found {found}", key=bool(kinds))
        return None, False
    kind = kinds[0]
    kp = path + (kind,)
    fields = c.mapping(spec[kind] if spec[kind] is not None else {}, kp, KIND_KEYS[kind],
                       required=("command",) if kind == "exec" else ())
    if fields is None:
        return None, False
    fits = {"http": "tcp", "tcp": "tcp", "udp": "udp"}.get(kind)
    ok = True
    if fits is not None and protocol is not None and fits != protocol:
        c.error(kp, f"{c.where(path)}: a {kind} check cannot check a {protocol} service; "
                f"use {'udp' if protocol == 'udp' else 'http or tcp'} or exec", key=True)
        ok = False
    defaults = HealthCheck(kind)
    profile = _profile(c, spec.get("profile", "steady"), path + ("profile",))
    if profile is None:
        return None, False
    values = {
        "interval": c.duration(spec.get("interval", profile["interval"]), path + ("interval",),
                               0.1, 3600),
        "timeout": c.duration(spec.get("timeout", profile["timeout"]), path + ("timeout",),
                              0.1, 300),
        "retries": c.integer(spec.get("retries", profile["retries"]), path + ("retries",), 1, 10,
                             "retries"),
        "rise": c.integer(spec.get("rise", defaults.rise), path + ("rise",), 1, 10, "rise"),
    }
    if None not in (values["interval"], values["timeout"]) \
            and values["timeout"] > values["interval"]:
        # A check still running when the next is due would overlap it, and a
        # dead worker would take longer than `interval` per failed check.
        at = path + ("timeout",) if "timeout" in spec else path + ("interval",)
        c.error(at, f"{c.where(path)}: timeout {values['timeout']:g}s is longer than the "
                f"interval {values['interval']:g}s; a check must end before the next begins")
        ok = False
    if kind == "udp":
        for key in ("payload", "reply"):
            values[key] = _hex(c, fields.get(key, ""), kp + (key,))
        given = [key for key in ("payload", "reply") if key in fields]
        if given and values["rise"] != 1:
            c.error(kp + (given[0],), f"{c.where(kp)}: a udp check with a {given[0]} needs "
                    "rise 1 (keepalived's UDP_CHECK matches replies but has no rise count); "
                    f"found rise {values['rise']}")
            ok = False
    if kind == "http":
        values["path"] = _http_path(c, fields.get("path", defaults.path), kp + ("path",))
        values["status"] = c.integer(fields.get("status", defaults.status), kp + ("status",),
                                     100, 599, "status")
    if kind == "exec":
        # A missing command was reported by mapping() above.
        values["command"] = _command(c, fields["command"], kp + ("command",)) \
            if "command" in fields else None
    if not ok or any(v is None for v in values.values()):
        return None, False
    return HealthCheck(kind, **values), True


def _profile(c, value, path):
    if not isinstance(value, str) or value not in HEALTH_PROFILES:
        c.error(path, f"{c.where(path)}: unknown profile {value!r}; use "
                f"{' or '.join(HEALTH_PROFILES)}")
        return None
    return HEALTH_PROFILES[value]


def _hex(c, value, path):
    if value == "":
        return ""
    if not isinstance(value, str) or not HEX_RE.fullmatch(value):
        c.error(path, f"{c.where(path)}: {value!r} is not usable: give 1 to 255 bytes as "
                "hex digits, two per byte, e.g. 0a1b (no spaces or 0x)")
        return None
    if value.lower().endswith("ff"):
        # keepalived 2.2.7's hex reader (read_hex_str) takes a last byte of
        # 0xff for its end-of-input marker and rejects the whole string.
        c.error(path, f"{c.where(path)}: {value!r} ends in the byte ff, which keepalived "
                "cannot read as the last byte; drop or change it")
        return None
    return value.lower()


def _http_path(c, value, path):
    if not isinstance(value, str) or not HTTP_PATH_RE.fullmatch(value) or len(value) > 1024:
        c.error(path, f"{c.where(path)}: {value!r} is not a usable URL path: it must start "
                "with '/' and use only letters, digits and . _ ~ % / ? & = + : @ , -")
        return None
    return value


def _command(c, value, path):
    if not isinstance(value, list) or not 1 <= len(value) <= 32:
        c.error(path, f"{c.where(path)}: expected a list of 1 to 32 words, the program "
                f"first, found {_kind(value)}")
        return None
    ok = True
    for i, word in enumerate(value):
        if not isinstance(word, str) or not COMMAND_ARG_RE.fullmatch(word):
            c.error(path + (i,), f"{c.where(path)}[{i}]: {word!r} is not allowed: command "
                    "words are passed to keepalived as they are and may use only letters, "
                    "digits and _ @ % + = : , . / -")
            ok = False
    if ok and not value[0].startswith("/"):
        c.error(path + (0,), f"{c.where(path)}[0]: {value[0]!r} must be an absolute path; "
                "checks run without a shell or a search path")
        ok = False
    return tuple(value) if ok else None


def _real_servers(c, value, path, workers):
    if value is None:
        return tuple(RealServer(w.name, w.address, w.weight) for w in workers.values())
    if isinstance(value, list):
        pairs = [(item, None, path + (i,)) for i, item in enumerate(value)]
    elif isinstance(value, dict):
        pairs = [(k, v, path + (k,)) for k, v in value.items()]
    else:
        c.error(path, f"{c.where(path)}: expected a list of worker names or a mapping of "
                f"worker name to weight, found {_kind(value)}")
        return None
    if not pairs:
        c.error(path, f"{c.where(path)}: no workers, so the service would take no traffic; "
                "name at least one (leave `workers` out for all of them), or remove the service")
        return None
    result, seen, ok = [], set(), True
    for name, weight, p in pairs:
        if not isinstance(name, str):
            c.error(p, f"{c.where(path)}: YAML reads this as {_kind(name)} ({name!r}), not as a "
                    "worker name; names are text: put it in quotes", key=isinstance(value, dict))
            ok = False
            continue
        if name not in workers:
            known = ", ".join(sorted(workers)) or "none"
            c.error(p, f"{c.where(path)}: worker {name!r} is not defined under workers "
                    f"(defined: {known})", key=isinstance(value, dict))
            ok = False
            continue
        if name in seen:
            c.error(p, f"{c.where(path)}: worker {name!r} is listed twice")
            ok = False
            continue
        seen.add(name)
        if weight is not None:
            weight = c.integer(weight, p, 0, 65535, "weight")
            if weight is None:
                ok = False
                continue
        worker = workers[name]
        result.append(RealServer(name, worker.address, worker.weight if weight is None else weight))
    return tuple(result) if ok else None


def _cross_checks(c, balancers, workers, services, network):
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
        if svc.key in keys:
            c.error(p, f"services.{name}: {svc.key} is already defined by service {keys[svc.key]}",
                    key=True)
        keys[svc.key] = name


def _shared_address(kind, name, address, other_kind, other):
    where = f"{kind}.{name}.address: {address}"
    if kind == other_kind:
        return f"{where} is already the address of {other}"
    # Balancers are listed first, so `other` is the balancer.
    return (f"{where} is also the address of balancer {other}; one host as both balancer and "
            "worker is not supported in direct routing: lbctl gives each host one role, and in "
            "a pair the other balancer's IPVS would take the packets forwarded to this host as "
            "a worker and balance them again instead of serving them; use separate hosts")
