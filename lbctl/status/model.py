"""A node's status as one type: what `status` collects, `status --json`
prints, and every reader of that JSON (the `--all` views, the fleet's
rollout order, rollout's health waits) takes back with `from_json`.

`from_json` checks the shape field by field against the annotations below,
so a node's odd answer (`null`, a list, a number where a name belongs) is one
StatusShapeError naming the field, never a KeyError deep in a renderer.
Strings are taken as they come: whoever prints them makes them safe
(remote/view.py shown()).
"""

import dataclasses
import hashlib
import types
import typing
from dataclasses import dataclass, field

from lbctl.config.model import TABLE_SCHEDULERS


class StatusShapeError(ValueError):
    """A status answer that does not have a node status's shape; the message
    names the field: `keepalived.web.health[2].since: a str, not a number`."""


def table_parts(servers, flags):
    """An mh or sh table's digests, {"members": ..., "order": ..., "weights":
    ...}, told apart because they are mended apart: which real servers the
    kernel holds, their order in its list, and each one's weight with the
    scheduler's flags.  `servers`: ("ADDRESS:PORT", weight) each, in the
    kernel's list order."""
    servers = list(servers)

    def digest(text):
        return hashlib.sha256(text.encode()).hexdigest()[:8]
    return {"members": digest(" ".join(sorted(address for address, _weight in servers))),
            "order": digest(" ".join(address for address, _weight in servers)),
            "weights": digest(" ".join(sorted(f"{a}/{w}" for a, w in servers))
                              + f" | {','.join(sorted(flags))}")}


def table_digest(servers, flags):
    """What an mh or sh table is filled from, as 8 hex digits: the real
    servers (("ADDRESS:PORT", weight) each) in the kernel's list order, and
    the scheduler's flags.  Equal digests, equal tables."""
    listed = " ".join(f"{address}/{weight}" for address, weight in servers)
    return hashlib.sha256(f"{listed} | {','.join(sorted(flags))}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ClusterOnNode:
    cluster: str
    node: str | None  # None: no file said which node this host is
    role: str | None  # "balancer" or "worker"; None: not known


@dataclass(frozen=True)
class RealServerStatus:
    address: str  # "192.168.100.3:80"
    forward: str  # "route", "masq", ...
    weight: int
    active: int
    inactive: int
    connections: int
    drained: bool = False
    # Incoming bytes, and the kernel's rate estimates (status --watch's first frame).
    in_bytes: int = 0
    conns_per_s: int = 0
    in_bytes_per_s: int = 0


@dataclass(frozen=True)
class ServiceStatus:
    service: str  # "tcp 192.168.100.10:80" or "fwmark 7"
    scheduler: str
    persistence: int
    connections: int
    conns_per_s: int
    in_packets: int
    in_bytes: int
    in_packets_per_s: int
    in_bytes_per_s: int
    real_servers: tuple[RealServerStatus, ...] = ()
    flags: tuple[str, ...] = ()

    @property
    def fills_a_table(self):
        """mh and sh fill a lookup table from the real servers in the
        kernel's list order: the same servers in another order make another
        table, and the same flow another worker."""
        return self.scheduler in TABLE_SCHEDULERS

    @property
    def table_digest(self):
        return table_digest(((rs.address, rs.weight) for rs in self.real_servers), self.flags)


@dataclass(frozen=True)
class SyncDaemonStatus:
    role: str  # "master" or "backup"
    interface: str
    syncid: int
    group: str
    port: int


@dataclass(frozen=True)
class SyncStatus:
    daemons: tuple[SyncDaemonStatus, ...]
    learned_connections: int
    warning: str | None = None


@dataclass(frozen=True)
class DrainStatus:
    """A worker `lbctl drain` took out, or a drain record that cannot be read."""

    cluster: str
    worker: str | None = None
    services: str | None = None  # "every service", or the names
    since: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class VrrpStatus:
    state: str  # MASTER, BACKUP, FAULT
    since: float


@dataclass(frozen=True)
class HealthStatus:
    service: str
    worker: str
    state: str | None  # "up", "down"; None: no report since keepalived took it in
    since: float | None


@dataclass(frozen=True)
class OfferStatus:
    vip: str
    since: float


@dataclass(frozen=True)
class BgpStatus:
    """What BIRD says (mode ecmp): the session to the router and the VIPs offered."""

    router: str
    error: str | None = None
    state: str | None = None  # BIRD's BGP state: Established, Active, Connect...
    since: float | None = None
    last_error: str | None = None
    offered: tuple[OfferStatus, ...] = ()


@dataclass(frozen=True)
class KeepalivedStatus:
    """One cluster's keepalived on this balancer, from its hooks' state folder."""

    pair: bool | None  # False: no VRRP instance (one balancer); None: no saved copy says
    mode: str | None
    vrrp: VrrpStatus | None
    transitions: int
    health: tuple[HealthStatus, ...]
    bgp: BgpStatus | None = None
    # The addresses its VRRP adverts carry (apply --all takes the master first
    # when they change); None without a VRRP instance.
    advertised_addresses: tuple[str, ...] | None = None
    # Whether keepalived runs now (its pid file names a live keepalived on
    # this cluster's config): a stopped or killed one leaves its last VRRP
    # record behind.  None: not said (an lbctl before this field).
    running: bool | None = None

    @property
    def held_vrrp(self):
        """The VRRP role keepalived holds now: its hooks' last record, unless
        keepalived is not running (a kill leaves MASTER behind)."""
        return None if self.running is False else self.vrrp

    def health_by_pair(self):
        """{(service, worker): HealthStatus}."""
        return {(h.service, h.worker): h for h in self.health}


@dataclass(frozen=True)
class NodeStatus:
    clusters: tuple[ClusterOnNode, ...]
    services: tuple[ServiceStatus, ...]
    vips_on_lo: tuple[str, ...]
    arp: dict[str, dict[str, str | None]]  # {ifname: {"arp_ignore": "1", ...}}, in effect
    ipvs_loaded: bool
    drains: tuple[DrainStatus, ...] = ()
    timeouts: dict[str, int] | None = None  # IPVS's, when it is loaded
    sync: SyncStatus | None = None  # when IPVS is loaded
    keepalived: dict[str, KeepalivedStatus] = field(default_factory=dict)
    # What apply would change here ("drift"), or why that is not known; both
    # None when not asked (--no-drift, or no file).
    drift: tuple[str, ...] | None = None
    drift_error: str | None = None

    def to_json(self):
        data = _to_json(self)
        for key in ("timeouts", "sync"):
            if data[key] is None:
                del data[key]
        if self.drift is None and self.drift_error is None:
            del data["drift"], data["drift_error"]
        return data

    @classmethod
    def from_json(cls, data):
        """The NodeStatus `data` (parsed JSON) describes; StatusShapeError if
        it has not that shape."""
        return _from_json(cls, data, "")


# Fields left out of the JSON when empty: only a few, and the rest must be there.
def _to_json(value):
    if dataclasses.is_dataclass(value):
        data = {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, KeepalivedStatus) and value.bgp is None:
            del data["bgp"]
        if isinstance(value, DrainStatus):
            data = {k: v for k, v in data.items() if v is not None}
        return data
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


_HINTS = {}


def _hints(cls):
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _from_json(kind, data, where):
    """`data` as `kind` (an annotation of the classes above)."""
    if dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise _wrong(where, data, "an object")
        # A field this lbctl does not know is left out: a node a release
        # ahead (a rollout, status --all across an upgrade) adds fields.
        known = {f.name: f for f in dataclasses.fields(kind)}
        values = {}
        for name, spec in known.items():
            inner = f"{where}.{name}" if where else name
            if name not in data:
                if spec.default is dataclasses.MISSING and \
                        spec.default_factory is dataclasses.MISSING:
                    raise StatusShapeError(f"{inner}: missing")
                continue
            values[name] = _from_json(_hints(kind)[name], data[name], inner)
        return kind(**values)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _from_json(inner, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise _wrong(where, data, "a list")
        return tuple(_from_json(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
    if origin is dict:
        if not isinstance(data, dict):
            raise _wrong(where, data, "an object")
        return {key: _from_json(args[1], value, f"{where}.{key}") for key, value in data.items()}
    if kind is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise _wrong(where, data, "a number")
    if kind is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise _wrong(where, data, "a whole number")
    if kind is bool:
        if isinstance(data, bool):
            return data
        raise _wrong(where, data, "true or false")
    if kind is str:
        if isinstance(data, str):
            return data
        raise _wrong(where, data, "a string")
    raise TypeError(f"no JSON shape for {kind!r}")  # a field of an unknown type: a bug here


# What a JSON value is, in the words the errors use.
_FOUND = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
          int: "a number", float: "a number", type(None): "null"}


def _wrong(where, data, wanted):
    found = _FOUND.get(type(data), type(data).__name__)
    return StatusShapeError(f"{where or 'the status'}: {found}, not {wanted}")
