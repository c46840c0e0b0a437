"""The interfaces the executor and observer use; real adapters and fakes both meet them."""

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from lbctl.layout import OWNERSHIP_DIR


@dataclass(frozen=True)
class IpvsStats:
    conns: int = 0
    inpkts: int = 0
    outpkts: int = 0
    inbytes: int = 0
    outbytes: int = 0
    cps: int = 0
    inpps: int = 0
    inbps: int = 0
    outbps: int = 0


@dataclass(frozen=True)
class IpvsDest:
    address: object  # IPv4Address
    port: int
    weight: int
    forward: int
    active: int = 0
    inactive: int = 0
    stats: IpvsStats = IpvsStats()


@dataclass(frozen=True)
class IpvsService:
    """A service as the kernel reports it.  key is None for fwmark services."""

    key: object  # ServiceKey or None
    label: str  # greppable: "tcp 192.168.100.10:80" or "fwmark 7"
    scheduler: str
    persistence: int
    dests: tuple = ()
    stats: IpvsStats = IpvsStats()
    flags: tuple = ()  # sorted names: "ops", "sh-port", ... (see ipvs_wire.FLAG_BITS)


@dataclass(frozen=True)
class SyncDaemon:
    """A running IPVS connection sync daemon: role is "master" (sends) or "backup" (receives)."""

    role: str
    interface: str
    syncid: int
    group: str  # the multicast group it sends to or joins
    port: int


@dataclass(frozen=True)
class IpvsSnapshot:
    """What status reads from the kernel's IPVS: services and sync daemons."""

    services: list
    sync_daemons: list
    timeouts: dict = None  # {"tcp": s, "tcp_fin": s, "udp": s}, as Ipvs.timeouts()


@dataclass(frozen=True)
class IpvsOp:
    """One IPVS change: verb is add/set/del, target is service or dest."""

    verb: str
    target: str
    service: object  # ServiceKey
    spec: object = None  # ServiceSpec for services, (DestKey, DestSpec) for dests
    dest: object = None  # DestKey


@dataclass
class Probed:
    """What ARP Probes for some addresses found."""
    held: dict = field(default_factory=dict)  # {Address: MAC of another host answering}
    unasked: dict = field(default_factory=dict)  # {ifname: why no probe went out}


@dataclass
class OpResult:
    op: IpvsOp
    error: Exception | None = None
    errno: int = 0


@runtime_checkable
class Ipvs(Protocol):
    def dump(self) -> list: ...  # [IpvsService], their stats left at zero

    # {ServiceKey: (IpvsDest, ...)} of those services, stats at zero; () where none.
    def real_servers(self, services) -> dict: ...

    def run(self, ops: list) -> list: ...  # [OpResult], one per op, same order

    def timeouts(self) -> dict: ...  # {"tcp": s, "tcp_fin": s, "udp": s}

    def set_timeouts(self, timeouts: dict) -> None: ...  # only the names given change

    def sync_daemons(self) -> list: ...  # [SyncDaemon]

    def stop_sync_daemon(self, role: str) -> None: ...  # "master" or "backup"


@runtime_checkable
class Addresses(Protocol):
    def list(self) -> list: ...  # [(IPv4Address, prefixlen, ifname)]

    def add(self, address) -> None: ...  # lbctl.state.Address

    def remove(self, address) -> None: ...

    # Gratuitous ARP: hosts that cached another MAC for them learn this one's.
    def announce(self, addresses: list) -> None: ...

    # ARP Probes for the addresses, answers heard for `listen` s after the last.
    def probe(self, addresses: list, listen: float) -> "Probed": ...


@runtime_checkable
class Sysctls(Protocol):
    def read(self, key: str) -> str | None: ...

    def write(self, key: str, value: str) -> None: ...


@runtime_checkable
class Files(Protocol):
    def read(self, path: str) -> tuple | None: ...  # (content, mode, owner uid) or None

    def write(self, path: str, content: str, mode: int) -> None: ...

    # Held around a write of a file a hook reads under the same flock.
    def locked(self, lock: str) -> AbstractContextManager: ...

    def remove(self, path: str) -> None: ...

    def readlink(self, path: str) -> str | None: ...

    def symlink(self, path: str, target: str) -> None: ...


@runtime_checkable
class Daemon(Protocol):
    """A daemon lbctl runs on a balancer (keepalived, BIRD, the exporter), one
    adapter each, registered in state.DAEMONS.  The plan starts, reloads and
    stops them one by one, in that order."""

    name: str

    # The adapter a balancer uses while its cluster is in `mode` (None: apply
    # --remove); None where this daemon cannot run on the node.
    @classmethod
    def for_balancer(cls, layout, systemd, mode) -> "Daemon | None": ...

    def running(self) -> bool: ...

    def test(self, text: str) -> list: ...  # problems the daemon finds in a config; [] when fine

    # What it needs before it can run (keepalived: its script user, its state
    # folder, and that the user can run these programs, the exec checks).
    def prepare(self, programs: frozenset = frozenset()) -> None: ...

    def start(self) -> None: ...

    def reload(self) -> None: ...  # it reads its files again

    def stop(self) -> None: ...


@dataclass
class Adapters:
    ipvs: Ipvs | None
    addresses: Addresses
    sysctls: Sysctls
    files: Files
    ownership_dir: str = OWNERSHIP_DIR
    # {name: Daemon}: on a balancer, every daemon lbctl may run there, wanted
    # or not, so that one the file no longer wants can be stopped.
    daemons: dict = field(default_factory=dict)
    # adapters.systemd.Systemd: lbctl's units; None where nothing may ask systemd.
    systemd: object = None
