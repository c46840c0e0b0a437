"""Reading and writing the ownership record (see state.Ownership)."""

import json
import re
from ipaddress import IPv4Address

from lbctl.config.model import ServiceKey
from lbctl.state import Address, Ownership

_SERVICE_RE = re.compile(r"^(tcp|udp) ([0-9.]+):(\d+)$")
_ADDRESS_RE = re.compile(r"^([0-9.]+)/(\d+) dev (\S+)$")


def record_path(ownership_dir, cluster_name):
    return f"{ownership_dir}/{cluster_name}.json"


def encode(owned):
    return json.dumps({
        "services": sorted(str(k) for k in owned.services),
        "addresses": sorted(str(a) for a in owned.addresses),
        "files": sorted(owned.files),
        "links": sorted(owned.links),
    }, indent=2) + "\n"


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
    return Ownership(services, addresses, set(data.get("files", [])), set(data.get("links", [])))


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


def write_ownership(files, ownership_dir, cluster_name, owned):
    """Write the record if it changed; returns True when it wrote."""
    path = record_path(ownership_dir, cluster_name)
    text = encode(owned)
    current = files.read(path)
    if current is not None and current[0] == text:
        return False
    files.write(path, text, 0o644)
    return True
