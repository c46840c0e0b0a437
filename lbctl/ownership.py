"""Reading and writing the ownership record (see state.Ownership)."""

import json
import os
import re
from ipaddress import IPv4Address

from lbctl.config.model import IPVS_TIMEOUTS, ServiceKey
from lbctl.state import Address, Ownership

_SERVICE_RE = re.compile(r"^(tcp|udp) ([0-9.]+):(\d+)$")
_ADDRESS_RE = re.compile(r"^([0-9.]+)/(\d+) dev (\S+)$")


def record_path(ownership_dir, cluster_name):
    return f"{ownership_dir}/{cluster_name}.json"


def encode(owned, node=None):
    # The node is kept so that `lbctl status` without the file can name it.
    named = {"node": node} if node else {}
    return json.dumps(named | {
        "services": sorted(str(k) for k in owned.services),
        "addresses": sorted(str(a) for a in owned.addresses),
        "files": sorted(owned.files),
        "links": sorted(owned.links),
    } | ({"timeouts": dict(sorted(owned.timeouts.items()))} if owned.timeouts else {}),
        indent=2) + "\n"


def decode(text):
    data = json.loads(text)
    services = set()
    for item in data.get("services", []):
        m = _SERVICE_RE.match(item)
        if m:
            services.add(ServiceKey(m[1], IPv4Address(m[2]), int(m[3])))
    addresses = set()
    for item in data.get("addresses", []):
        m = _ADDRESS_RE.match(item)
        if m:
            addresses.add(Address(IPv4Address(m[1]), m[3], int(m[2])))
    timeouts = {name: value for name, value in data.get("timeouts", {}).items()
                if name in IPVS_TIMEOUTS and isinstance(value, int) and value > 0}
    return Ownership(services, addresses, set(data.get("files", [])), set(data.get("links", [])),
                     timeouts)


def read_ownership(files, ownership_dir, cluster_name):
    found = files.read(record_path(ownership_dir, cluster_name))
    if found is None:
        return Ownership()
    try:
        return decode(found[0])
    except ValueError:
        # A damaged record must not stop an apply; lbctl then owns only what
        # the file declares, the safe direction.
        return Ownership()


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
    text = encode(owned, node)
    current = files.read(path)
    if current is not None and current[0] == text:
        return False
    files.write(path, text, 0o644)
    return True
