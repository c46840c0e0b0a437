"""Plain YAML data to a Cluster, reporting every problem at once.

Each check names the path in the file, what was found and what is allowed.
Strings that other files will carry (names, interface names) are held to
tight patterns, so nothing from the config can inject text into generated
sysctl, systemd or keepalived files.
"""

import re
from ipaddress import IPv4Address, IPv4Network, ip_address

from lbctl.config.model import (
    PROTOCOLS, SCHEDULERS, Balancer, Cluster, RealServer, VirtualService, Worker,
)
from lbctl.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")

TOP_KEYS = {"cluster", "network", "balancers", "workers", "services", "vrrp"}
BALANCER_KEYS = {"address", "interface", "priority"}
WORKER_KEYS = {"address", "weight"}
SERVICE_KEYS = {"vip", "port", "protocol", "scheduler", "persistence", "workers", "health"}
NOT_YET = "is not supported yet (health checks and balancer pairs come with keepalived support)"


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
        if not isinstance(value, str) or not NAME_RE.match(value):
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

    def choice(self, value, path, choices, what):
        if value not in choices:
            self.error(path, f"{self.where(path)}: unknown {what} {value!r}; "
                       f"known: {', '.join(choices)}")
            return None
        return value


def _kind(value):
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "nothing"}.get(type(value), "a value")


def validate(doc):
    c = _Checker(doc)
    top = c.mapping(doc.data, (), TOP_KEYS, required=("cluster", "balancers", "workers", "services"))
    if top is None:
        raise ConfigError(c.errors)
    cluster_name = top.get("cluster")
    if "cluster" in top:
        c.name(cluster_name, ("cluster",), "cluster name", key=False)
    if "vrrp" in top:
        c.error(("vrrp",), f"vrrp {NOT_YET}", key=True)

    # A missing section was reported above; checking it again would only repeat that.
    balancers = _balancers(c, top["balancers"]) if "balancers" in top else {}
    workers = _workers(c, top["workers"]) if "workers" in top else {}
    network = _network(c, top, balancers)
    services = _services(c, top["services"], workers) if "services" in top else {}
    _cross_checks(c, balancers, workers, services, network)
    if c.errors:
        raise ConfigError(c.errors)
    return Cluster(name=cluster_name, network=network, balancers=balancers,
                   workers=workers, services=services, source=doc.path, text=doc.text)


def _balancers(c, value):
    if isinstance(value, dict) and len(value) > 1:
        second = list(value)[1]
        c.error(("balancers", second), f"a second balancer {NOT_YET}", key=True)
    result = {}
    for name, spec, p in c.entries(value, "balancers", "balancer", BALANCER_KEYS, ("address",)):
        addr = c.address(spec["address"], p + ("address",)) if "address" in spec else None
        iface = spec.get("interface")
        if iface is not None and (not isinstance(iface, str) or not IFNAME_RE.match(iface)):
            c.error(p + ("interface",), f"{c.where(p + ('interface',))}: {iface!r} is not a "
                    "valid interface name (up to 15 letters, digits, '_', '.', '-')")
            iface = None
        prio = None
        if "priority" in spec:
            prio = c.integer(spec["priority"], p + ("priority",), 1, 254, "priority")
        if addr is not None:
            result[name] = Balancer(name, addr, iface, prio)
    return result


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
        if "health" in spec:
            c.error(p + ("health",), f"{c.where(p + ('health',))} {NOT_YET}", key=True)
        # A missing vip or port is reported already; check the rest all the same.
        vip = c.address(spec["vip"], p + ("vip",)) if "vip" in spec else None
        port = c.integer(spec["port"], p + ("port",), 1, 65535, "port") if "port" in spec else None
        protocol = c.choice(spec.get("protocol", "tcp"), p + ("protocol",), PROTOCOLS, "protocol")
        scheduler = c.choice(spec.get("scheduler", "wlc"), p + ("scheduler",), SCHEDULERS, "scheduler")
        persistence = c.integer(spec.get("persistence", 0), p + ("persistence",), 0, 86400 * 31,
                                "persistence (seconds)")
        real_servers = _real_servers(c, spec.get("workers"), p + ("workers",), workers)
        if None in (vip, port, protocol, scheduler, persistence, real_servers):
            continue
        result[name] = VirtualService(name, vip, port, protocol, scheduler, persistence,
                                      real_servers)
    return result


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
    result, seen, ok = [], set(), True
    for name, weight, p in pairs:
        if not isinstance(name, str) or name not in workers:
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
    seen = {}
    for kind, nodes in (("balancers", balancers), ("workers", workers)):
        for name, node in nodes.items():
            p = (kind, name, "address")
            if node.address in seen:
                c.error(p, f"{kind}.{name}.address: {node.address} is already the address "
                        f"of {seen[node.address]}")
            seen[node.address] = name
            if network is not None and node.address not in network:
                c.error(p, f"{kind}.{name}.address: {node.address} is not on the balancer's "
                        f"L2 network {network}; direct routing forwards frames by MAC, so "
                        "workers must share the balancer's LAN (set `network:` if it is wider)")
    keys = {}
    for name, svc in services.items():
        p = ("services", name)
        if svc.vip in seen:
            c.error(p + ("vip",), f"services.{name}.vip: {svc.vip} is the address of node "
                    f"{seen[svc.vip]}; a VIP must be an address of its own")
        if svc.key in keys:
            c.error(p, f"services.{name}: {svc.key} is already defined by service {keys[svc.key]}",
                    key=True)
        keys[svc.key] = name
