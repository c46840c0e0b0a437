"""The validated cluster, in the domain's own terms.

Everything here is checked already: addresses are ipaddress objects, names
are safe to render into other files, and references resolve.
"""

import re
from dataclasses import dataclass, field
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network

SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq",
              "fo", "ovf", "mh", "twos")
PROTOCOLS = ("tcp", "udp")
# Cluster, node and service names: they end up in file, unit and keepalived names.
NAME_PATTERN = "[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
# Scheduler flags by scheduler: the kernel's IP_VS_SVC_F_SCHED1/2 bits, which
# only sh and mh read (keepalived and ipvsadm use the same names).
SCHEDULER_FLAGS = {"sh": ("sh-fallback", "sh-port"), "mh": ("mh-fallback", "mh-port")}
# The schedulers that pick a real server by a table filled from the real
# servers in the kernel's list order: balancers of mode ecmp must list them
# alike, or a flow the router moves between them changes worker.
TABLE_SCHEDULERS = ("mh", "sh")
# The IPVS timeouts a file may set (ipvsadm --set), as the kernel's defaults:
# an established TCP connection, one closing, and a UDP flow, in seconds.
IPVS_TIMEOUTS = {"tcp": 900, "tcp_fin": 120, "udp": 300}


@dataclass(frozen=True)
class Balancer:
    name: str
    address: IPv4Address
    interface: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class Worker:
    name: str
    address: IPv4Address
    weight: int = 1


@dataclass(frozen=True)
class RealServer:
    """A worker as one service sees it: its address and weight there."""

    worker: str
    address: IPv4Address
    weight: int


HEALTH_KINDS = ("http", "tcp", "udp", "exec")


# Named sets of timing defaults; explicit interval/timeout/retries override them.
HEALTH_PROFILES = {
    "steady": {"interval": 2.0, "timeout": 1.0, "retries": 2},
    "fast": {"interval": 1.0, "timeout": 0.5, "retries": 1},
}


@dataclass(frozen=True)
class HealthCheck:
    """How keepalived checks each real server of a service.

    The defaults survive one slow reply from a busy Pi: a worker leaves the
    pool only after `retries` checks in a row fail (about retries x
    (interval + timeout), 6 s), and comes back only after `rise` checks in a
    row pass.  `profile: fast` (HEALTH_PROFILES) detects in about 1.5 s but
    acts on a single stall.  A failed worker stays in IPVS at weight 0
    (keepalived's inhibit_on_failure), so its established connections finish.
    """

    kind: str  # one of HEALTH_KINDS
    interval: float = HEALTH_PROFILES["steady"]["interval"]  # seconds between checks
    timeout: float = HEALTH_PROFILES["steady"]["timeout"]  # seconds one check may take
    retries: int = HEALTH_PROFILES["steady"]["retries"]  # failed checks in a row before removal
    rise: int = 2  # passed checks in a row before return
    path: str = "/"  # http
    status: int = 200  # http
    command: tuple = ()  # exec: argv, run without a shell
    payload: str = ""  # udp: hex bytes sent as the probe
    reply: str = ""  # udp: hex bytes the reply must start with ("" = silence passes)

    @property
    def in_process(self):
        """Whether keepalived's own TCP_CHECK/UDP_CHECK keep this check's meaning.

        They have no rise count (a server is back after one pass), so rise > 1
        and exec go through keepalived/lbctl-check instead.
        """
        return self.kind in ("tcp", "udp") and self.rise == 1


@dataclass(frozen=True)
class Vrrp:
    """The failover pair's VRRP settings (VRRPv3, so adverts may be sub-second)."""

    router_id: int
    advert_interval: float = 0.2
    # Off by default: a failback is a second interruption, and idle
    # connections the returning balancer never learned would break on it.
    preempt: bool = False
    unicast: bool = True


@dataclass(frozen=True)
class Bfd:
    """BFD to the router: a dead link noticed in interval x multiplier, not a hold time."""

    interval: float = 0.1  # seconds between BFD packets, both ways
    # Packets missed before the session is down: BIRD's own default.  Three
    # in a row go missing on a busy link or CPU, and withdraw a healthy
    # balancer (docs/cluster-file.md, BFD).
    multiplier: int = 5


@dataclass(frozen=True)
class Bgp:
    """How ECMP balancers announce the VIPs: one BGP session each to the router.

    Every balancer speaks from its own address (its router id) in the same
    AS; the router spreads flows over all the balancers announcing a VIP.
    """

    local_as: int
    router: IPv4Address
    router_as: int
    hold: int = 9  # seconds without a message before the session is down
    keepalive: int = 3  # seconds between keepalives: a third of the hold time
    bfd: Bfd | None = None


class Mode(StrEnum):
    """How the balancers share the work, decided by Cluster.mode alone."""

    SINGLE = "single"  # one balancer alone
    FAILOVER = "failover"  # a VRRP pair: one active, the other ready
    ECMP = "ecmp"  # all active behind the router's ECMP, announced by BGP



@dataclass(frozen=True)
class VirtualService:
    name: str
    vip: IPv4Address
    port: int
    protocol: str = "tcp"
    scheduler: str = "wlc"
    persistence: int = 0
    real_servers: tuple = ()
    health: HealthCheck | None = None  # None: no checks, every real server is in
    scheduler_flags: tuple = ()  # names from SCHEDULER_FLAGS[scheduler], sorted
    # UDP only: schedule every datagram on its own and keep no connection
    # entry, so a DNS client's queries spread over the workers.
    one_packet: bool = False
    # A VIP off the LAN that the site's router sends to the balancers (mode
    # ecmp's are all routed, by BGP).  Nothing lbctl renders changes.
    routed: bool = False

    @property
    def flags(self):
        """Every IPVS service flag the file sets, by keepalived's keyword for it."""
        return tuple(sorted((("ops",) if self.one_packet else ()) + self.scheduler_flags))

    @property
    def key(self):
        return ServiceKey(self.protocol, self.vip, self.port)


@dataclass(frozen=True, order=True)
class ServiceKey:
    protocol: str
    vip: IPv4Address
    port: int

    def __str__(self):
        return f"{self.protocol} {self.vip}:{self.port}"

    # The hashes dataclass would make call IPv4Address's own, in Python, for
    # each key of the tables plan and apply hold by the ten thousand.  Equal
    # keys have equal addresses, so hashing the addresses' numbers is as good.
    def __hash__(self):
        try:
            return hash((self.protocol, self.vip._ip, self.port))
        except AttributeError:  # not an address: hashed as dataclass would
            return hash((self.protocol, self.vip, self.port))


@dataclass(frozen=True, order=True)
class DestKey:
    service: ServiceKey
    address: IPv4Address
    port: int

    def __str__(self):
        return f"{self.service} -> {self.address}:{self.port}"

    def __hash__(self):
        try:
            service = self.service
            return hash((service.protocol, service.vip._ip, service.port, self.address._ip,
                         self.port))
        except AttributeError:  # a foreign service's (key None), or no address
            return hash((self.service, self.address, self.port))


@dataclass(frozen=True)
class Ssh:
    """How `--all` reaches the nodes.  None leaves the choice to ssh and its config."""

    user: str | None = None
    port: int | None = None
    # Run lbctl through `sudo -n` on the node; by default unless the file
    # names root as the user (the login may come from ~/.ssh/config).
    sudo: bool | None = None
    hosts: dict = field(default_factory=dict)  # {node: host name}; default: its address

    @property
    def uses_sudo(self):
        return self.sudo if self.sudo is not None else self.user != "root"


DEFAULT_EXPORTER_LISTEN = "127.0.0.1:9588"  # this host only, as Prometheus exporters do


def split_listen(text):
    """(IPv4Address, port) from "ADDRESS:PORT"; ValueError if it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not ADDRESS:PORT")
    return IPv4Address(host), int(port)


@dataclass(frozen=True)
class Cluster:
    name: str
    network: IPv4Network
    balancers: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)
    services: dict = field(default_factory=dict)
    source: str = ""
    text: str = ""  # the file as read, kept by a balancer for its boot unit
    vrrp: Vrrp | None = None  # set whenever keepalived runs the balancers
    # The IPVS timeouts the file sets ({name in IPVS_TIMEOUTS: seconds}); the
    # ones it leaves out stay as the kernel has them.
    ipvs_timeouts: dict = field(default_factory=dict)
    ssh: Ssh = Ssh()
    # Where each balancer's `lbctl exporter` listens ("127.0.0.1:9588"), run
    # by a unit apply installs; None: no exporter unit.
    exporter: str | None = None
    # `public: true`: anyone may scrape it; otherwise only this host and the
    # file's network (the unit's IPAddressAllow=).
    exporter_public: bool = False
    bgp: Bgp | None = None  # set in mode ecmp, and only there

    @property
    def mode(self):
        """How the balancers share the work (a Mode), decided here only."""
        if self.bgp is not None:
            return Mode.ECMP
        return Mode.FAILOVER if len(self.balancers) > 1 else Mode.SINGLE

    @property
    def engine(self):
        """Who programs IPVS on the balancers.

        "netlink": lbctl itself, for one balancer without health checks.
        "keepalived": a failover pair or any health check needs a daemon that
        keeps running after apply, so keepalived owns the VIPs and the table.
        In mode ecmp it also decides, by its checks, which VIPs BIRD offers.
        """
        return "keepalived" if self.vrrp is not None or self.bgp is not None else "netlink"

    @property
    def health_settle_seconds(self):
        """How long fresh checks take to bring every healthy worker in: `rise` passes."""
        return max((s.health.rise * s.health.interval + s.health.timeout
                    for s in self.services.values() if s.health is not None), default=0)

    @property
    def vips(self):
        return sorted({s.vip for s in self.services.values()})

    def node_names_by_address(self):
        nodes = {b.address: name for name, b in self.balancers.items()}
        nodes.update({w.address: name for name, w in self.workers.items()})
        return nodes
