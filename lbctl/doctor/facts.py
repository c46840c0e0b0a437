"""What doctor reads on this host, gathered once into plain data.

Everything here is readable without root, so doctor run by an ordinary
user still checks what it can; only the wire checks need CAP_NET_RAW.
"""

import json
import os
import socket
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from lbctl.adapters.programs import IP, run

# The per-interface settings that decide whether direct routing works.
CONF_KEYS = ("arp_ignore", "arp_announce", "rp_filter")
# /proc/net/tcp's state column: 0A is LISTEN.
TCP_LISTEN = "0A"


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
    routes: list = field(default_factory=list)  # [(destination, ifname)]: "default" or a CIDR

    def effective(self, ifname, key):
        """What the kernel acts on: the larger of `all` and the interface's own
        value (so for arp_ignore, arp_announce and rp_filter alike)."""
        values = [v for v in (self.conf.get(("all", key)), self.conf.get((ifname, key)))
                  if v is not None]
        return max(values) if values else None

    def addresses_on(self, ifname):
        return {(ip, prefix) for ip, prefix, name in self.addresses if name == ifname}


def gather(interfaces, proc="/proc", sys="/sys"):
    """The facts of this host, with the conf keys of `interfaces` (and `all`)."""
    links = json.loads(_ip("-json", "link", "show") or "[]")
    addrs = json.loads(_ip("-4", "-json", "address", "show") or "[]")
    facts = Facts(
        addresses=[(IPv4Address(a["local"]), a["prefixlen"], link["ifname"])
                   for link in addrs for a in link.get("addr_info", [])
                   if a.get("family") == "inet" and "local" in a],
        links={link["ifname"]: {"mtu": link.get("mtu"), "mac": link.get("address", ""),
                                "up": "UP" in link.get("flags", [])} for link in links},
        conf={(scope, key): _read_int(os.path.join(proc, "sys/net/ipv4/conf", scope, key))
              for scope in ("all", *interfaces) for key in CONF_KEYS},
        listeners=read_listeners(os.path.join(proc, "net")),
        ipvs_loaded=os.path.exists(os.path.join(proc, "net/ip_vs")),
        raw_frames=raw_frames_allowed(),
        routes=[(r.get("dst", "default"), r["dev"]) for r in json.loads(
            _ip("-4", "-json", "route", "show", "table", "main") or "[]") if "dev" in r],
    )
    module_dir = os.path.join(sys, "module")
    facts.modules_loaded = set(os.listdir(module_dir)) if os.path.isdir(module_dir) else set()
    facts.modules_available = kernel_modules(f"/lib/modules/{os.uname().release}")
    return facts


def raw_frames_allowed():
    """Whether the wire checks can run: an AF_PACKET socket needs CAP_NET_RAW."""
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
    except PermissionError:
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


def read_listeners(net_dir):
    """{(protocol, address, port)} of the sockets that take connections (TCP in
    LISTEN) or datagrams (bound UDP).  A wildcard address is "*"; an IPv6
    wildcard counts as one, since it takes IPv4 too unless the socket is
    v6-only, which /proc does not show."""
    found = set()
    for table, protocol, v6 in (("tcp", "tcp", False), ("tcp6", "tcp", True),
                                ("udp", "udp", False), ("udp6", "udp", True)):
        try:
            with open(os.path.join(net_dir, table)) as fh:
                next(fh, None)  # the header
                for line in fh:
                    fields = line.split()
                    if len(fields) < 4 or (protocol == "tcp" and fields[3] != TCP_LISTEN):
                        continue
                    address, port = _local_address(fields[1], v6)
                    if address is not None:
                        found.add((protocol, address, port))
        except OSError:
            continue
    return found


def _local_address(text, v6):
    """/proc/net's "0100007F:0050" as ("127.0.0.1", 80); None for an IPv6 address
    that is neither the wildcard nor an IPv4-mapped one."""
    hexaddr, _, hexport = text.partition(":")
    port = int(hexport, 16)
    if v6:
        if set(hexaddr) == {"0"}:
            return "*", port
        # ::ffff:a.b.c.d is stored as four little-endian words; the last is the address.
        if hexaddr[:16] == "0" * 16 and hexaddr[16:24] == "FFFF0000":
            hexaddr = hexaddr[24:]
        else:
            return None, port
    address = IPv4Address(int.from_bytes(bytes.fromhex(hexaddr), "little"))
    return ("*" if int(address) == 0 else str(address)), port
