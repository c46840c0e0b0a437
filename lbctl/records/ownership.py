"""Reading and writing the ownership record (see state.Ownership)."""

import json
import os
import re
from contextlib import suppress
from ipaddress import IPv4Address

from lbctl.config.model import IPVS_TIMEOUTS, ServiceKey
from lbctl.errors import NodeError
from lbctl.layout import UNIT_DIR, WANTS_DIR, Layout, unit_name
from lbctl.state import Address, Ownership

# The record's layout.  A later lbctl that changes it raises this and reads
# older formats; this one refuses a newer record instead of misreading it.
RECORD_FORMAT = 1

_SERVICE_RE = re.compile(r"(tcp|udp) ([0-9.]+):(\d+)")
_ADDRESS_RE = re.compile(r"([0-9.]+)/(\d+) dev ([A-Za-z0-9_.-]{1,15})")
# A key under /proc/sys/net; '/' stands for a dot inside a name (eth0/100), so
# no part can become '..'.
_SYSCTL_RE = re.compile(r"net(?:\.[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*)+")


def record_path(ownership_dir, cluster_name):
    return f"{ownership_dir}/{cluster_name}.json"


def encode(owned, node=None):
    # The node is kept so that `lbctl status` without the file can name it.
    named = {"format": RECORD_FORMAT} | ({"node": node} if node else {})
    return json.dumps(named | {
        "services": sorted(str(k) for k in owned.services),
        "addresses": sorted(str(a) for a in owned.addresses),
        "files": sorted(owned.files),
        "links": sorted(owned.links),
    } | ({"timeouts": dict(sorted(owned.timeouts.items()))} if owned.timeouts else {})
      | ({"sysctls": dict(sorted(owned.sysctls.items()))} if owned.sysctls else {}),
        indent=2) + "\n"


def owned_paths_pattern(cluster_name):
    """The paths lbctl writes for a cluster (desired.py, saved.py, the keepalived
    layout).  A record naming anything else was not written by lbctl, and root
    must not unlink it on the record's word."""
    layout = Layout(cluster_name)
    unit = re.escape(unit_name(cluster_name, "")).replace(r"\.service", r"[a-z]+\.service")
    units = rf"{re.escape(UNIT_DIR)}/{unit}"
    wanted = rf"{re.escape(WANTS_DIR)}/{unit}"
    return re.compile("|".join([
        re.escape(layout.sysctl_conf), units, wanted, re.escape(layout.saved_copy),
        rf"{re.escape(layout.etc_dir)}/[A-Za-z0-9][A-Za-z0-9_.-]*",
    ]))


def decode(text, cluster_name, path="the ownership record"):
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    written = data.get("format", 1)  # records before 0.2 had no format: they are format 1
    if not isinstance(written, int) or written > RECORD_FORMAT:
        raise NodeError(f"{path} was written by a newer lbctl (record format {written}; this "
                        f"lbctl reads up to {RECORD_FORMAT}): upgrade lbctl on this node")
    ours = owned_paths_pattern(cluster_name)
    services, addresses = set(), set()
    for item in _entries(data, "services", list):
        m = _SERVICE_RE.fullmatch(item) if isinstance(item, str) else None
        if m:
            with suppress(ValueError):  # not an address: not lbctl's, left alone
                services.add(ServiceKey(m[1], IPv4Address(m[2]), int(m[3])))
    for item in _entries(data, "addresses", list):
        m = _ADDRESS_RE.fullmatch(item) if isinstance(item, str) else None
        if m:
            with suppress(ValueError):
                addresses.add(Address(IPv4Address(m[1]), m[3], int(m[2])))
    timeouts = {name: value for name, value in _entries(data, "timeouts", dict).items()
                if name in IPVS_TIMEOUTS and type(value) is int and value > 0}
    sysctls = {name: value for name, value in _entries(data, "sysctls", dict).items()
               if isinstance(name, str) and _SYSCTL_RE.fullmatch(name)
               and (value is None or isinstance(value, str))}
    files = {p for p in _entries(data, "files", list) if isinstance(p, str) and ours.fullmatch(p)}
    links = {p for p in _entries(data, "links", list) if isinstance(p, str) and ours.fullmatch(p)}
    return Ownership(services, addresses, files, links, timeouts, sysctls,
                     legacy="format" not in data)


def _entries(data, key, kind):
    """A section of the record; one of the wrong kind is damage, not a crash."""
    value = data.get(key, kind())
    if not isinstance(value, kind):
        raise ValueError(f"{key!r} is not a JSON {'list' if kind is list else 'object'}")
    return value


def read_ownership(files, ownership_dir, cluster_name, strict=False):
    """`strict` (apply --remove): a damaged record is an error, since without it
    lbctl would find nothing to remove and say it had removed everything."""
    path = record_path(ownership_dir, cluster_name)
    found = files.read(path)
    if found is None:
        return Ownership()
    try:
        return decode(found[0], cluster_name, path)
    except ValueError as exc:
        if strict:
            raise NodeError(f"{path} is damaged ({exc}), so what lbctl made here is not "
                            "known: remove it by hand, or restore the record") from None
        # A damaged record must not stop an apply; lbctl then owns only what
        # the file declares, the safe direction.
        return Ownership()


def sysctls_of_other_clusters(files, root, ownership_dir, cluster_name):
    """Sysctls that other clusters applied here also set (the ARP settings on
    `all`): taking one cluster away must leave them to the others."""
    keys = set()
    for name, _node in applied_here(root, ownership_dir):
        if name != cluster_name:
            keys |= set(read_ownership(files, ownership_dir, name).sysctls)
    return keys


def applied_here(root, ownership_dir):
    """[(cluster, node)] of the clusters applied on this host, from their records;
    node is None in a record written before records named it."""
    folder = os.path.join(root, ownership_dir.lstrip("/"))
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                node = json.load(fh).get("node")
        except (OSError, ValueError, AttributeError):
            node = None
        found.append((name[:-len(".json")], node))
    return found


def write_ownership(files, ownership_dir, cluster_name, owned, node=None):
    """Write the record if it changed; returns True when it wrote."""
    path = record_path(ownership_dir, cluster_name)
    current = files.read(path)
    if owned.empty:
        # Nothing of the cluster's is left here (apply --remove): nor is its record.
        if current is None:
            return False
        files.remove(path)
        return True
    text = encode(owned, node)
    if current is not None and current[0] == text:
        return False
    files.write(path, text, 0o644)
    return True
