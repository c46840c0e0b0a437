"""What a node holds: the same shape for what the file wants and what is there.

Desired state comes from the cluster file (desired.py); observed state from
the kernel and the filesystem (observe.py).  The plan is the difference.
"""

from dataclasses import dataclass, field
from ipaddress import IPv4Address

FWD_DIRECT_ROUTING = 3  # IP_VS_CONN_F_DROUTE: rewrite the MAC only


@dataclass(frozen=True)
class DaemonEntry:
    """A daemon lbctl may run on a balancer.  Its entry in DAEMONS is the one
    registration a new daemon needs: the plan's change kind, its stop's note
    and the adapter the executor drives come from it."""

    name: str
    # "module:Class" of its adapter (a Daemon), imported only by a command
    # that changes a node; the class's for_balancer() makes it.
    adapter: str
    stops: str  # what stopping it takes away, as the plan says it


# The daemons lbctl runs, in the order they start; they stop in the
# reverse.  BIRD offers the router only what keepalived's checks vouch for:
# it starts once keepalived runs, and closes its session before keepalived
# (and the IPVS table) goes.
# The exporter reads what both leave behind, so it comes last.
KEEPALIVED, BIRD, EXPORTER = "keepalived", "bird", "exporter"
DAEMONS = (
    DaemonEntry(KEEPALIVED, "lbctl.adapters.keepalived:KeepalivedDaemon",
                "its VIPs and services go with it"),
    DaemonEntry(BIRD, "lbctl.adapters.bird:BirdDaemon",
                "the router withdraws this balancer's routes"),
    DaemonEntry(EXPORTER, "lbctl.adapters.exporter:ExporterDaemon",
                "and with it this balancer's metrics"),
)
DAEMON_ORDER = tuple(entry.name for entry in DAEMONS)


@dataclass(frozen=True, order=True)
class Address:
    """An address of ours on an interface: a VIP as /32."""

    ip: IPv4Address
    ifname: str
    prefixlen: int = 32

    def __str__(self):
        return f"{self.ip}/{self.prefixlen} dev {self.ifname}"


@dataclass(frozen=True)
class ServiceSpec:
    scheduler: str
    persistence: int = 0  # seconds; 0 means off
    flags: tuple = ()  # sorted names: "ops" and scheduler flags such as "sh-port"


@dataclass(frozen=True)
class DestSpec:
    weight: int
    forward: int = FWD_DIRECT_ROUTING
    # Only observed state fills these in.
    active: int = 0
    inactive: int = 0

    def same_config(self, other):
        return (self.weight, self.forward) == (other.weight, other.forward)

    def in_use(self, protocol):
        """Connections that keep this real server busy.

        IPVS counts a TCP connection as active while it is established, and a
        UDP flow as inactive for its whole life: for UDP both counts matter, or
        a real server would be deleted while its flows still run.
        """
        return self.active + (self.inactive if protocol == "udp" else 0)


@dataclass(frozen=True)
class FileSpec:
    content: str
    mode: int = 0o644
    owner: int = 0  # uid: every file lbctl writes is root's, so another owner is drift
    # The flock a hook holds while it reads the file and acts on it, held
    # while the file is written (Files.locked); not part of what is compared.
    lock: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class DaemonSpec:
    """A daemon lbctl runs on the node (keepalived, BIRD) and the files it reads.

    A change to `files` needs a reload; `config` is tested by the daemon
    itself before it is written.
    """

    name: str
    config: str
    files: frozenset = frozenset()
    programs: frozenset = frozenset()  # what its checks run as the script user (exec)
    # Wanted: of the files it should run on.  Observed: of what it last (re)loaded,
    # "" when that is not known.
    digest: str = ""


@dataclass
class NodeState:
    role: str  # "balancer" or "worker"
    node: str
    cluster: str
    addresses: set = field(default_factory=set)  # {Address}
    services: dict = field(default_factory=dict)  # {ServiceKey: ServiceSpec}
    dests: dict = field(default_factory=dict)  # {DestKey: DestSpec}
    sysctls: dict = field(default_factory=dict)  # {"net.ipv4...": "1"}
    files: dict = field(default_factory=dict)  # {"/etc/...": FileSpec}
    links: dict = field(default_factory=dict)  # {"/etc/...wants/x": "/etc/.../x"}
    # Desired: the daemons to run.  Observed: those found running.
    daemons: dict = field(default_factory=dict)  # {name: DaemonSpec}
    # Services and VIPs the daemon manages: lbctl neither creates nor removes
    # them, and stops recording them as its own.
    external: set = field(default_factory=set)  # {ServiceKey or Address}
    # keepalived engine: real servers of the file's services that the file no
    # longer lists, as the kernel holds them, and those of them kept in the
    # daemon's config at weight 0 until their connections end.
    leaving: dict = field(default_factory=dict)  # {DestKey: DestSpec}
    draining: set = field(default_factory=set)  # {DestKey}
    # Real servers an operator drained (lbctl drain): weight 0 until undrain.
    drained: set = field(default_factory=set)  # {DestKey}
    # keepalived engine: the IPVS table keepalived builds when it starts.  It
    # adds each entry and takes "already exists" as done, so an entry the
    # kernel still holds (from the netlink engine, or a keepalived that died)
    # keeps its old scheduler and weight: lbctl edits those to this first.
    start_services: dict = field(default_factory=dict)  # {ServiceKey: ServiceSpec}
    start_dests: dict = field(default_factory=dict)  # {DestKey: DestSpec}
    # IPVS timeouts in seconds ({"tcp": 900, ...}): desired, the ones lbctl
    # sets itself; observed, the kernel's.
    timeouts: dict = field(default_factory=dict)
    # Connection sync daemons.  Desired, on a keepalived balancer that is not
    # in a pair: the (interface, syncid) a pair of this cluster runs them
    # with, left behind when the pair became one.  Observed: those running.
    stray_sync: tuple | None = None
    sync_daemons: list = field(default_factory=list)  # [SyncDaemon]

    @property
    def keepalived(self):
        """keepalived's DaemonSpec: it keeps this balancer's IPVS table and
        VIPs (desired), or runs (observed); None otherwise."""
        return self.daemons.get(KEEPALIVED)


@dataclass
class Ownership:
    """What lbctl created on this node for a cluster, so it may remove it later.

    The plan itself is a diff against the kernel; this record only answers
    "is this object ours?" for objects the file no longer declares.  It is
    widened before anything is created and narrowed after things are removed,
    so after any interruption it still covers everything lbctl made.
    """

    services: set = field(default_factory=set)  # {ServiceKey}
    addresses: set = field(default_factory=set)  # {Address}
    files: set = field(default_factory=set)  # {path}
    links: set = field(default_factory=set)  # {path}
    # IPVS timeouts lbctl set, each with the kernel's value before it did, so
    # that a file which stops setting one gives the kernel its own back.
    timeouts: dict = field(default_factory=dict)  # {"tcp": seconds before lbctl}
    # The same for sysctls: each with its value before lbctl first set it, for
    # `apply --remove` (and a file that stops wanting one) to put back.
    sysctls: dict = field(default_factory=dict)  # {"net.ipv4...": "0"}
    # A record from before lbctl 0.2 kept no values from before: the sysctls
    # it set are recorded as unknown rather than as lbctl's own values.
    legacy: bool = False

    def union(self, other):
        return Ownership(self.services | other.services, self.addresses | other.addresses,
                         self.files | other.files, self.links | other.links,
                         other.timeouts | self.timeouts, other.sysctls | self.sysctls)

    @property
    def empty(self):
        return not (self.services or self.addresses or self.files or self.links
                    or self.timeouts or self.sysctls)

    @classmethod
    def of(cls, state):
        return cls(set(state.services), set(state.addresses), set(state.files), set(state.links))
