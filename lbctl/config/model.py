"""The validated cluster, in the domain's own terms.

Everything here is checked already: addresses are ipaddress objects, names
are safe to render into other files, and references resolve.
"""

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq",
              "fo", "ovf", "mh", "twos")
PROTOCOLS = ("tcp", "udp")


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


@dataclass(frozen=True)
class VirtualService:
    name: str
    vip: IPv4Address
    port: int
    protocol: str = "tcp"
    scheduler: str = "wlc"
    persistence: int = 0
    real_servers: tuple = ()

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


@dataclass(frozen=True, order=True)
class DestKey:
    service: ServiceKey
    address: IPv4Address
    port: int

    def __str__(self):
        return f"{self.service} -> {self.address}:{self.port}"


@dataclass(frozen=True)
class Cluster:
    name: str
    network: IPv4Network
    balancers: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)
    services: dict = field(default_factory=dict)
    source: str = ""
    text: str = ""  # the file as read, kept by a balancer for its boot unit

    @property
    def vips(self):
        return sorted({s.vip for s in self.services.values()})

    def node_names_by_address(self):
        nodes = {b.address: name for name, b in self.balancers.items()}
        nodes.update({w.address: name for name, w in self.workers.items()})
        return nodes
