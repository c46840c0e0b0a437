"""The kernel's IPVS connection table, with the file's names: status --connections.

The table can hold hundreds of thousands of entries on a busy balancer, so it
is read as a stream from /proc/net/ip_vs_conn (what ipvsadm -Lnc reads too;
IPVS has no netlink dump of connections) and written out entry by entry.
Memory holds only the summary's counters, never the table.  Addresses are
matched in the kernel's own hex form, so the names of 100,000 entries cost a
dict lookup each, not an address object.
"""

import gc
import json
import os
import socket
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Network

CONN_TABLE = "/proc/net/ip_vs_conn"
PROTOCOL_NAMES = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp", "IP": "ip"}


def _hex(address):
    return f"{int(address):08X}"


def _kernel_key(service):
    """A service (the file's, or the kernel's ServiceKey) as the table writes
    it: ("TCP", "C0A8640A", "0050")."""
    return service.protocol.upper(), _hex(service.vip), f"{service.port:04X}"


@dataclass(frozen=True)
class Names:
    """The file's names for what the table shows, keyed as the kernel writes it."""

    services: dict  # {("TCP", "C0A8640A", "0050"): "web"}
    workers: dict  # {"C0A86403": "pi1"}
    clusters: dict  # {("TCP", "C0A8640A", "0050"): "pi-web"}, whose service it is

    @classmethod
    def of(cls, clusters):
        services, workers, owners = {}, {}, {}
        for cluster in clusters:
            for name, svc in cluster.services.items():
                services[_kernel_key(svc)] = name
                owners[_kernel_key(svc)] = cluster.name
            workers.update({_hex(w.address): name for name, w in cluster.workers.items()})
        return cls(services, workers, owners)


@dataclass(frozen=True)
class Filter:
    """Which entries to show: by service name, worker name, client network."""

    service_keys: frozenset | None = None  # the Names.services keys of the service
    worker_hex: str | None = None
    client: IPv4Network | None = None

    @classmethod
    def of(cls, names, service=None, worker=None, client=None):
        keys = None if service is None else frozenset(
            key for key, name in names.services.items() if name == service)
        worker_hex = None
        if worker is not None:
            worker_hex = next((h for h, name in names.workers.items() if name == worker), None)
        return cls(keys, worker_hex, None if client is None else IPv4Network(client, strict=False))

    def wants(self, proto, caddr, vaddr, vport, daddr):
        if self.service_keys is not None and (proto, vaddr, vport) not in self.service_keys:
            return False
        if self.worker_hex is not None and daddr != self.worker_hex:
            return False
        if self.client is not None:
            if len(caddr) != 8:
                return False  # an IPv6 client never matches an IPv4 network
            net = self.client
            return int(caddr, 16) & int(net.netmask) == int(net.network_address)
        return True

    def wants_real_server(self, proto, vaddr, vport, daddr):
        """The service and worker filters alone: a real server has no client."""
        return ((self.service_keys is None or (proto, vaddr, vport) in self.service_keys)
                and (self.worker_hex is None or daddr == self.worker_hex))


def _ip(text):
    """The kernel writes IPv4 as 8 hex digits and IPv6 in its usual form."""
    if len(text) == 8:
        return socket.inet_ntoa(bytes.fromhex(text))
    return text


def entries(wanted=Filter(), path=CONN_TABLE):
    """The table's entries the filter lets through, one at a time, as the kernel
    writes them: [proto, caddr, cport, vaddr, vport, daddr, dport, state, expires]."""
    for chunk in _chunks(path):
        for line in chunk.splitlines():
            f = line.split()
            if len(f) >= 9 and wanted.wants(f[0], f[1], f[3], f[4], f[5]):
                yield f[:9]


def _chunks(path, size=1 << 20):
    """The table after its header, in pieces of whole lines, so memory stays flat."""
    try:
        fh = open(path, encoding="ascii", errors="replace")
    except FileNotFoundError:
        return  # ip_vs not loaded: no connections
    with fh:
        fh.readline()
        rest = ""
        while True:
            data = fh.read(size)
            if not data:
                break
            data = rest + data
            cut = data.rfind("\n") + 1
            rest = data[cut:]
            if cut:
                yield data[:cut]
        if rest:
            yield rest


def is_template(state, cport):
    """A persistence template holds a client to a worker: state NONE, no client port."""
    return state == "NONE" and cport == "0000"


def as_dict(entry, names):
    proto, caddr, cport, vaddr, vport, daddr, dport, state, expires = entry
    return {"protocol": PROTOCOL_NAMES.get(proto, proto.lower()),
            "client": _ip(caddr), "client_port": int(cport, 16),
            "vip": _ip(vaddr), "port": int(vport, 16),
            "service": names.services.get((proto, vaddr, vport)),
            "cluster": names.clusters.get((proto, vaddr, vport)),
            "worker": names.workers.get(daddr),
            "worker_address": _ip(daddr), "worker_port": int(dport, 16),
            "state": state, "expires": int(expires), "template": is_template(state, cport)}


class _Memo(dict):
    """A text made once per distinct key: a service's or worker's label, a port."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value


LINE = "%-4s %6s %-12s %15s:%-5s %-30s %s\n"
HEADER = "%-4s %6s %-12s %21s %-30s %s\n" % ("pro", "expire", "state", "client       ",
                                             "service", "worker")


# Where ip_vs is not loaded there is no table at all, which is not the same
# as an empty one: said as `lbctl status` says it.
NOT_LOADED = ("IPVS: not loaded (the ip_vs kernel module), so there is no connection table "
              "here; `lbctl apply` loads it on a balancer")


def table_exists(path=CONN_TABLE):
    return os.path.exists(path)


def write_text(wanted, names, out, path=CONN_TABLE):
    """The table, then counts by state per service and worker; returns how many.
    Without a table (ip_vs not loaded), NOT_LOADED.

    Lines are made a column at a time (C-level map and join over each chunk),
    with labels and ports made once per distinct value: a Python statement
    per entry would cost several times what ipvsadm -Lnc does."""
    if not table_exists(path):
        out.write(NOT_LOADED + "\n")
        return 0

    def service_label(key):
        proto, addr, port = key
        return f"{names.services.get(key) or '?'} {_ip(addr)}:{int(port, 16)}"

    def worker_label(key):
        addr, port = key
        return f"{names.workers.get(addr) or '?'} {_ip(addr)}:{int(port, 16)}"

    with _without_gc():
        return _write_lines(wanted, names, out, path, service_label, worker_label)


@contextmanager
def _without_gc():
    """Every chunk makes a few hundred thousand strings and tuples, none of them
    in a cycle: the collector would only walk them over and over."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _write_lines(wanted, names, out, path, service_label, worker_label):
    services, workers = _Memo(service_label), _Memo(worker_label)
    ports = _Memo(lambda h: str(int(h, 16)))
    expiry = _Memo(lambda s: "%d:%02d" % divmod(int(s), 60))
    protos = _Memo(lambda p: PROTOCOL_NAMES.get(p, p.lower()))
    counts = Counter()
    out.write(HEADER)
    for chunk in _chunks(path):
        fields = chunk.split()
        if len(fields) != 9 * chunk.count("\n") or wanted != Filter() or \
                any(len(a) != 8 for a in fields[1::9]):
            # Persistence-engine data, IPv6 or a filter: the entry-at-a-time path.
            columns = list(zip(*(e for line in chunk.splitlines()
                                 if len(e := line.split()) >= 9
                                 and wanted.wants(e[0], e[1], e[3], e[4], e[5]))))
            if not columns:
                continue
            columns = [list(c) for c in columns[:9]]
            clients = [_ip(a) for a in columns[1]]
        else:
            columns = [fields[i::9] for i in range(9)]
            clients = map(socket.inet_ntoa, map(bytes.fromhex, columns[1]))
        proto, _, cport, vaddr, vport, daddr, dport, state, expires = columns
        states = ["persistence" if s == "NONE" and p == "0000" else s
                  for s, p in zip(state, cport)]
        service = list(map(services.__getitem__, zip(proto, vaddr, vport)))
        worker = list(map(workers.__getitem__, zip(daddr, dport)))
        counts.update(zip(service, worker, states))
        out.write("".join(map(LINE.__mod__, zip(
            map(protos.__getitem__, proto), map(expiry.__getitem__, expires), states, clients,
            map(ports.__getitem__, cport), service, worker))))
    total = sum(counts.values())
    out.write(f"{total} connection entr{'y' if total == 1 else 'ies'}\n")
    for (service, worker), states in _by_pair(counts).items():
        out.write(f"  {service} -> {worker}: "
                  + ", ".join(f"{n} {state}" for state, n in sorted(states.items())) + "\n")
    return total


def write_json(rows, names, out, kernel=None):
    """{"connections": [...], "summary": [...]}, written as the entries come.
    `kernel`: more keys for the end, {"timeouts": ..., "real_servers": ...}
    (kernel_settings())."""
    with _without_gc():
        return _write_json(rows, names, out, kernel or {})


def kernel_settings(ipvs, wanted, names):
    """What a reader needs to weigh the entries: the kernel's IPVS timeouts
    ({"tcp": 900, "tcp_fin": 120, "udp": 300}; an entry's age since its last
    packet is its state's timeout less its `expires`), and the weight of each
    real server the filter keeps.  Both empty without ip_vs."""
    servers = []
    for svc in ipvs.dump():
        if svc.key is None:
            continue
        key = _kernel_key(svc.key)
        for d in svc.dests:
            daddr = _hex(d.address)
            if wanted.wants_real_server(*key, daddr):
                servers.append({"service": names.services.get(key),
                                "cluster": names.clusters.get(key),
                                "vip": str(svc.key.vip), "port": svc.key.port,
                                "worker": names.workers.get(daddr),
                                "worker_address": str(d.address), "worker_port": d.port,
                                "weight": d.weight})
    return {"timeouts": ipvs.timeouts(), "real_servers": servers}


def _write_json(rows, names, out, kernel):
    counts = Counter()
    out.write('{"connections": [')
    first = True
    for entry in rows:
        r = as_dict(entry, names)
        out.write(("\n  " if first else ",\n  ") + json.dumps(r))
        first = False
        state = "persistence" if r["template"] else r["state"]
        counts[(r["service"], f"{r['vip']}:{r['port']}", r["worker"], r["worker_address"],
                state)] += 1
    summary = {}
    for (service, vip, worker, address, state), n in counts.items():
        entry = summary.setdefault((service, vip, worker, address), {
            "service": service, "vip": vip, "worker": worker, "worker_address": address,
            "states": {}})
        entry["states"][state] = n
    out.write("\n], \"summary\": " + json.dumps(list(summary.values()), indent=2)
              + "".join(f", {json.dumps(key)}: {json.dumps(value)}" for key, value in kernel.items())
              + "}\n")
    return sum(counts.values())


def _by_pair(counts):
    pairs = {}
    for (service, worker, state), n in sorted(counts.items()):
        pairs.setdefault((service, worker), {})[state] = n
    return pairs
