"""What doctor reads on this host, gathered once into plain data.

Everything here is readable without root, so doctor run by an ordinary
user still checks what it can; only the wire checks need CAP_NET_RAW.
"""

import json
import os
import socket
from dataclasses import dataclass, field
from typing import NamedTuple
from ipaddress import IPv4Address

from lbctl.adapters.programs import IP, SS, run

# The per-interface settings that decide whether direct routing works.
CONF_KEYS = ("arp_ignore", "arp_announce", "rp_filter")


class Route(NamedTuple):
    dst: str  # "default" or a CIDR
    dev: str
    metric: int = 0  # of two routes to one place, the kernel takes the lower
    connected: bool = False  # the network of an address on `dev` (proto kernel, scope link)


@dataclass
class Facts:
    addresses: list  # [(IPv4Address, prefixlen, ifname)]
    links: dict  # {ifname: {"mtu": int, "mac": str, "up": bool}}
    conf: dict  # {(ifname or "all", key): int or None} for CONF_KEYS
    listeners: set  # {(protocol, address or "*", port)}: "*" is every address
    ipvs_loaded: bool = False
    modules_loaded: set = field(default_factory=set)  # names under /sys/module
    modules_available: set = field(default_factory=set)  # in the kernel's modules.dep/builtin
    raw_frames: bool = False  # this process may send raw frames (root, CAP_NET_RAW)
    routes: list = field(default_factory=list)  # [Route] of the main table

    def effective(self, ifname, key):
        """What the kernel acts on: the larger of `all` and the interface's own
        value (so for arp_ignore, arp_announce and rp_filter alike)."""
        values = [v for v in (self.conf.get(("all", key)), self.conf.get((ifname, key)))
                  if v is not None]
        return max(values) if values else None

    def addresses_on(self, ifname):
        return {(ip, prefix) for ip, prefix, name in self.addresses if name == ifname}

    def lan_interfaces(self, cluster, ifname):
        """The node's LAN interface and any other with an address of its own
        (not a VIP) in the cluster's network, such as Wi-Fi next to Ethernet:
        ARP is answered on each."""
        return sorted({ifname} | {name for ip, _p, name in self.addresses
                                  if name != "lo" and ip in cluster.network
                                  and ip not in cluster.vips})


def gather(proc="/proc", sys="/sys"):
    """The facts of this host: every interface's, and `all`'s, conf keys."""
    links = json.loads(_ip("-json", "link", "show") or "[]")
    interfaces = [link["ifname"] for link in links]
    addrs = json.loads(_ip("-4", "-json", "address", "show") or "[]")
    facts = Facts(
        addresses=[(IPv4Address(a["local"]), a["prefixlen"], link["ifname"])
                   for link in addrs for a in link.get("addr_info", [])
                   if a.get("family") == "inet" and "local" in a],
        links={link["ifname"]: {"mtu": link.get("mtu"), "mac": link.get("address", ""),
                                "up": "UP" in link.get("flags", [])} for link in links},
        conf={(scope, key): _read_int(os.path.join(proc, "sys/net/ipv4/conf", scope, key))
              for scope in ("all", *interfaces) for key in CONF_KEYS},
        listeners=read_listeners(),
        ipvs_loaded=os.path.exists(os.path.join(proc, "net/ip_vs")),
        raw_frames=raw_frames_allowed(),
        routes=[Route(r.get("dst", "default"), r["dev"], r.get("metric", 0),
                      r.get("protocol") == "kernel" and r.get("scope") == "link")
                for r in json.loads(_ip("-4", "-json", "route", "show", "table", "main")
                                    or "[]") if "dev" in r],
    )
    module_dir = os.path.join(sys, "module")
    facts.modules_loaded = set(os.listdir(module_dir)) if os.path.isdir(module_dir) else set()
    facts.modules_available = kernel_modules(f"/lib/modules/{os.uname().release}")
    return facts


def raw_frames_allowed():
    """Whether the wire checks can run: an AF_PACKET socket needs CAP_NET_RAW."""
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
    except OSError:  # EPERM without the capability; EAFNOSUPPORT in some containers
        return False
    return True


def _ip(*args):
    done = run([IP, *args])
    return done.stdout if done.returncode == 0 else ""


def _read_int(path):
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def kernel_modules(release_dir):
    """The module names the running kernel can load or has built in."""
    names = set()
    for index in ("modules.dep", "modules.builtin"):
        try:
            with open(os.path.join(release_dir, index)) as fh:
                for line in fh:
                    path = line.partition(":")[0].strip()
                    if path:
                        names.add(os.path.basename(path).split(".ko")[0].replace("-", "_"))
        except OSError:
            continue
    return names


def read_listeners():
    """{(protocol, address, port)} of the sockets that take connections (TCP in
    LISTEN) or datagrams (bound UDP), from ss(8), which alone shows whether an
    IPv6 wildcard also takes IPv4 (nginx's `listen [::]:80` does not)."""
    found = set()
    for protocol, flag in (("tcp", "-Hltne"), ("udp", "-Hlune")):
        done = run([SS, flag])
        if done.returncode == 0:
            found |= parse_ss(done.stdout, protocol)
    return found


def parse_ss(text, protocol):
    """`ss -Hl[tu]ne` lines as {(protocol, address or "*", port)}.  "*:80" and
    "0.0.0.0:80" take every IPv4 address; "[::]:80" is IPv6 only (v6only:1);
    an address bound to a device ("0.0.0.0%eth0:53") counts as the address."""
    found = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        address = address.partition("%")[0]
        if address.startswith("[") and address.endswith("]"):
            inner = address[1:-1]
            if inner.startswith("::ffff:"):
                address = inner.removeprefix("::ffff:")
            else:
                continue  # an IPv6 address, or the IPv6-only wildcard
        if address in ("*", "0.0.0.0"):
            address = "*"
        found.add((protocol, address, int(port)))
    return found
