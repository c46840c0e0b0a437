"""IPVS generic-netlink messages as bytes: batched writes and lean dumps.

pyroute2 builds and parses each message through several layers of Python
objects; at 1000 services x 10 real servers that costs 25 to 60 times what
ipvsadm takes (see bench/ipvs_apply.py).  IPVS uses a handful of fixed-layout
messages, so they are packed and unpacked here with struct.
tests/test_ipvs_wire.py checks both directions against pyroute2's own IPVS
message classes, so the two cannot drift apart.

Layouts: linux/netlink.h, linux/genetlink.h and linux/ip_vs.h.
"""

import errno
import functools
import operator
import socket
import struct
import sys

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
SOL_NETLINK, NETLINK_CAP_ACK = 270, 10
NETLINK_GENERIC = 16
SO_RCVBUFFORCE = 33

IPVS_GENL_VERSION = 1
CMD = {("add", "service"): 1, ("set", "service"): 2, ("del", "service"): 3,
       ("add", "dest"): 5, ("set", "dest"): 6, ("del", "dest"): 7}
IPVS_CMD_GET_SERVICE, IPVS_CMD_GET_DEST = 4, 8
IPVS_CMD_DEL_DAEMON, IPVS_CMD_GET_DAEMON = 10, 11
IPVS_CMD_SET_CONFIG, IPVS_CMD_GET_CONFIG = 12, 13
IPVS_CMD_ATTR_SERVICE, IPVS_CMD_ATTR_DEST, IPVS_CMD_ATTR_DAEMON = 1, 2, 3
# IPVS_CMD_ATTR_TIMEOUT_*: the connection timeouts ipvsadm --set changes, in seconds.
TIMEOUT_ATTRS = {"tcp": 4, "tcp_fin": 5, "udp": 6}
SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT, SVC_FWMARK = 1, 2, 3, 4, 5
SVC_SCHED_NAME, SVC_FLAGS, SVC_TIMEOUT, SVC_NETMASK = 6, 7, 8, 9
SVC_STATS, SVC_STATS64 = 10, 12
SERVICE_KEY_ATTRS = (SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT, SVC_FWMARK)
DEST_ADDR, DEST_PORT, DEST_FWD_METHOD, DEST_WEIGHT = 1, 2, 3, 4
DEST_U_THRESH, DEST_L_THRESH, DEST_ACTIVE_CONNS, DEST_INACT_CONNS = 5, 6, 7, 8
DEST_STATS, DEST_ADDR_FAMILY, DEST_STATS64 = 10, 11, 12
# IPVS_STATS_ATTR_*: conns, inpkts, outpkts, inbytes, outbytes, cps, inpps, outpps, inbps, outbps
STATS_FIELDS = {1: "conns", 2: "inpkts", 3: "outpkts", 4: "inbytes", 5: "outbytes",
                6: "cps", 7: "inpps", 9: "inbps", 10: "outbps"}
# IPVS_DAEMON_ATTR_*: the connection sync daemons' settings.
DAEMON_STATE, DAEMON_MCAST_IFN, DAEMON_SYNC_ID, DAEMON_SYNC_MAXLEN = 1, 2, 3, 4
DAEMON_MCAST_GROUP, DAEMON_MCAST_GROUP6, DAEMON_MCAST_PORT, DAEMON_MCAST_TTL = 5, 6, 7, 8
IP_VS_STATE_MASTER, IP_VS_STATE_BACKUP = 1, 2
IP_VS_SVC_F_PERSISTENT = 0x0001
IP_VS_SVC_F_ONEPACKET, IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2 = 0x0004, 0x0008, 0x0010
# Service flags by the names keepalived and ipvsadm give them.  The scheduler
# bits mean something only to their scheduler: SCHED1 is sh's and mh's
# fallback, SCHED2 their port hashing.
FLAG_BITS = {"ops": IP_VS_SVC_F_ONEPACKET,
             "sh-fallback": IP_VS_SVC_F_SCHED1, "sh-port": IP_VS_SVC_F_SCHED2,
             "mh-fallback": IP_VS_SVC_F_SCHED1, "mh-port": IP_VS_SVC_F_SCHED2}
# The flags a service write sets or clears: persistence, one-packet and the
# three scheduler bits.  Bits outside the mask (the kernel's own HASHED, and
# any a newer kernel defines) stay as they are.
MANAGED_FLAGS = 0x003D
PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}

_NLMSGHDR = struct.Struct("=IHHII")
_GENLHDR = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")


def nla(kind, payload):
    padded = payload + b"\0" * (-len(payload) % 4)
    return _NLA.pack(_NLA.size + len(payload), kind) + padded


def _u16(v):
    return struct.pack("=H", v)


def _u32(v):
    return struct.pack("=I", v)


def _be16(v):
    return struct.pack("!H", v)


def service_attrs(key, spec=None):
    """The service NLA: its key, plus scheduler, flags and timeout when spec is given."""
    body = (nla(SVC_AF, _u16(socket.AF_INET)) + nla(SVC_PROTOCOL, _u16(PROTOCOLS[key.protocol]))
            + nla(SVC_ADDR, key.vip.packed) + nla(SVC_PORT, _be16(key.port)))
    if spec is not None:
        flags = IP_VS_SVC_F_PERSISTENT if spec.persistence else 0
        for name in spec.flags:
            flags |= FLAG_BITS[name]
        body += (nla(SVC_SCHED_NAME, spec.scheduler.encode() + b"\0")
                 + nla(SVC_FLAGS, struct.pack("=II", flags, MANAGED_FLAGS))
                 + nla(SVC_TIMEOUT, _u32(spec.persistence))
                 + nla(SVC_NETMASK, b"\xff\xff\xff\xff"))
    return nla(IPVS_CMD_ATTR_SERVICE, body)


def flag_names(flags, scheduler):
    """The sorted names of a dumped service's flags, as FLAG_BITS gives them.

    Scheduler bits are named after the service's scheduler; under any other
    scheduler they have no name here and are not reported.
    """
    names = ["ops"] if flags & IP_VS_SVC_F_ONEPACKET else []
    names += [name for name, bit in FLAG_BITS.items()
              if name.startswith(f"{scheduler}-") and flags & bit]
    return tuple(sorted(names))


def config_attrs(timeouts):
    """SET_CONFIG attributes for the given timeouts only: the kernel keeps the rest."""
    return b"".join(nla(TIMEOUT_ATTRS[name], _u32(seconds))
                    for name, seconds in sorted(timeouts.items()))


def parse_config(payload):
    """GET_CONFIG's answer as {"tcp": s, "tcp_fin": s, "udp": s}."""
    names = {kind: name for name, kind in TIMEOUT_ATTRS.items()}
    return {names[kind]: _uint(value) for kind, value in iter_attrs(payload[_GENLHDR.size:])
            if kind in names}


def dest_attrs(key, spec=None):
    body = (nla(DEST_ADDR, key.address.packed) + nla(DEST_PORT, _be16(key.port))
            + nla(DEST_ADDR_FAMILY, _u16(socket.AF_INET)))
    if spec is not None:
        body += (nla(DEST_FWD_METHOD, _u32(spec.forward)) + nla(DEST_WEIGHT, _u32(spec.weight))
                 + nla(DEST_U_THRESH, _u32(0)) + nla(DEST_L_THRESH, _u32(0)))
    return nla(IPVS_CMD_ATTR_DEST, body)


def message(family, seq, cmd, attrs, version=IPVS_GENL_VERSION, flags=NLM_F_REQUEST | NLM_F_ACK):
    payload = _GENLHDR.pack(cmd, version, 0) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), family, flags, seq, 0) + payload


def op_message(family, seq, op):
    """One IpvsOp as a netlink request."""
    cmd = CMD[(op.verb, op.target)]
    if op.target == "service":
        return message(family, seq, cmd, service_attrs(op.service, op.spec))
    return message(family, seq, cmd, service_attrs(op.service) + dest_attrs(op.dest, op.spec))


def iter_messages(data):
    """(type, seq, payload) of each netlink message in a received buffer."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        yield kind, seq, data[offset + _NLMSGHDR.size:offset + length]
        offset += (length + 3) & ~3


def ack_errno(payload):
    """The errno of an NLMSG_ERROR payload: 0 for success."""
    return -struct.unpack_from("=i", payload)[0]


def iter_attrs(payload):
    offset = 0
    while offset + _NLA.size <= len(payload):
        length, kind = _NLA.unpack_from(payload, offset)
        if length < _NLA.size:
            break
        yield kind & 0x3FFF, payload[offset + _NLA.size:offset + length]
        offset += (length + 3) & ~3


def _uint(value):
    # Netlink's integers are in the host's order, as _Layout's struct reads them.
    return int.from_bytes(value[:8] if len(value) >= 8 else value[:4] if len(value) >= 4
                          else value[:2], sys.byteorder)


def _stats(value):
    return {STATS_FIELDS[k]: _uint(v) for k, v in iter_attrs(value) if k in STATS_FIELDS}


_STATS_TABLE = {kind: (name, _uint) for kind, name in STATS_FIELDS.items()}


def _ipv4(value):
    """IPVS sends addresses as a 16-byte union; IPv4 is its first four bytes."""
    return _dotted(bytes(value[:4]))


@functools.lru_cache(maxsize=4096)  # a table names the same few real servers again and again
def _dotted(four):
    return ".".join(str(b) for b in four)


def _be16_value(value):
    return struct.unpack_from("!H", value)[0]


def _forward(value):
    return _uint(value) & 0x7  # the bits above are tunnel flags


def _cstring(value):
    return value.split(b"\0", 1)[0].decode()


def _first_u32(value):
    return struct.unpack_from("=I", value)[0]


_SERVICE_FIELDS = {
    SVC_AF: ("af", _uint), SVC_PROTOCOL: ("protocol", _uint), SVC_ADDR: ("addr", _ipv4),
    SVC_PORT: ("port", _be16_value), SVC_FWMARK: ("fwmark", _uint),
    SVC_SCHED_NAME: ("scheduler", _cstring), SVC_FLAGS: ("flags", _first_u32),
    SVC_TIMEOUT: ("timeout", _uint), SVC_STATS: ("stats32", _stats), SVC_STATS64: ("stats", _stats),
}
_DEST_FIELDS = {
    DEST_ADDR: ("addr", _ipv4), DEST_PORT: ("port", _be16_value),
    DEST_FWD_METHOD: ("forward", _forward), DEST_WEIGHT: ("weight", _uint),
    DEST_ACTIVE_CONNS: ("active", _uint), DEST_INACT_CONNS: ("inactive", _uint),
    DEST_STATS: ("stats32", _stats), DEST_STATS64: ("stats", _stats),
}


# What apply, plan and drain read: the table without its counters.  Decoding
# each real server's two stats blocks was most of a dump's cost.
_STATS_KINDS = {SVC_STATS, SVC_STATS64}
_SERVICE_FIELDS_BARE = {k: v for k, v in _SERVICE_FIELDS.items() if k not in _STATS_KINDS}
_DEST_FIELDS_BARE = {k: v for k, v in _DEST_FIELDS.items()
                     if k not in (DEST_STATS, DEST_STATS64)}


_DAEMON_FIELDS = {
    DAEMON_STATE: ("state", _uint), DAEMON_MCAST_IFN: ("interface", _cstring),
    DAEMON_SYNC_ID: ("syncid", _uint), DAEMON_MCAST_GROUP: ("group", _ipv4),
    DAEMON_MCAST_PORT: ("port", _uint),
}


def _fields(attrs, fields, **defaults):
    """The attributes named in `fields`, decoded.

    A dump of 10,000 real servers runs this for every one of them, and the
    kernel lays each entry of a kind out alike.  So the layout of the first
    is compiled into one struct that reads every attribute header and wanted
    value at once (_layout); an entry whose headers differ from its layout's
    is walked attribute by attribute instead."""
    layout = _layout(fields, attrs)
    found = layout.decode(attrs, defaults) if layout is not None else None
    if found is not None:
        return found
    return _walk(attrs, fields, defaults)


def _walk(attrs, fields, defaults):
    found = dict(defaults)
    offset, end, unpack = 0, len(attrs), _NLA.unpack_from
    while offset + 4 <= end:
        length, kind = unpack(attrs, offset)
        if length < 4:
            break
        wanted = fields.get(kind & 0x3FFF)
        if wanted is not None:
            found[wanted[0]] = wanted[1](attrs[offset + 4:offset + length])
        offset += (length + 3) & ~3
    return found


# {(id of a fields table, entry length): _Layout or None}.  The tables are
# this module's constants, so their ids stay theirs.
_LAYOUTS = {}
_MAX_LAYOUTS = 64  # a handful of kinds and kernels; the cache never grows past it


def _layout(fields, attrs):
    """The _Layout of entries of `fields`' kind as long as `attrs`, made from
    `attrs`; None where its attributes do not tile it, or where the cache is
    full (a layout used once costs more than a walk)."""
    key = (id(fields), len(attrs))
    if key not in _LAYOUTS:
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            return None
        layout = _Layout(attrs, fields)
        _LAYOUTS[key] = layout if layout.tiled else None
    return _LAYOUTS[key]


def _uint_codes(size):
    """The struct codes that read _uint's value of `size` bytes as an integer."""
    width = 8 if size >= 8 else 4 if size >= 4 else 2 if size >= 2 else 1
    return {8: "Q", 4: "I", 2: "H", 1: "B"}[width] + (f"{size - width}x" if size > width else "")


# The decoders whose value a struct reads as an integer: {decoder: (its
# codes for a value of `size` bytes, what makes the field of that integer)}.
# Most of an entry then needs no Python call at all.
# None: a value of that size is left to the decoder itself.
_INTEGERS = {
    _uint: lambda size: (_uint_codes(size), None),
    _first_u32: lambda size: (_uint_codes(4) + (f"{size - 4}x" if size > 4 else ""), None)
    if size >= 4 else None,
    _forward: lambda size: (_uint_codes(size), lambda value: value & 0x7),
}
# The same for values a struct reads as bytes: {decoder: (codes, post)}.
_BYTES = {
    _ipv4: lambda size: ("4s" + (f"{size - 4}x" if size > 4 else ""), _dotted)
    if size >= 4 else None,
}


class _Layout:
    """One struct that reads every attribute header and wanted value of an
    entry at once, the header values an entry of this layout must have, and
    how each wanted field is made of what the struct read.  `tiled` is
    False where the attributes did not tile the entry it was made from."""

    def __init__(self, attrs, fields):
        self.codes, self.headers, self.count = [], [], 0
        picks = []
        self.tiled = self._read(attrs, fields, picks) and bool(self.headers)
        if self.tiled:
            self.struct = struct.Struct("=" + "".join(self.codes))
            self.header_values = operator.itemgetter(*[i for i, _value in self.headers])
            self.expected = tuple(value for _index, value in self.headers)
            self.picks = [(name, operator.itemgetter(*indexes), post)
                          for name, indexes, post in picks]

    def _add(self, codes, values):
        self.codes.append(codes)
        self.count += values
        return self.count - values

    def _read(self, attrs, fields, picks):
        offset, end = 0, len(attrs)
        while offset + 4 <= end:
            length, kind = _NLA.unpack_from(attrs, offset)
            if length < 4 or offset + length > end:
                return False
            first = self._add("HH", 2)
            self.headers += [(first, length), (first + 1, kind)]
            wanted = fields.get(kind & 0x3FFF)
            size = length - 4
            if wanted is not None and wanted[1] is _stats:
                nested = []
                # Counters read as integers make the dict as they are; any
                # other (an empty one) is left to a walk.
                if not self._read(attrs[offset + 4:offset + length], _STATS_TABLE, nested) \
                        or len(nested) < 2 or any(post for _n, _i, post in nested):
                    return False
                names = tuple(name for name, _indexes, _post in nested)
                picks.append((wanted[0], tuple(i for _n, (i,), _p in nested),
                              lambda values, names=names: dict(zip(names, values))))
            elif wanted is not None:
                form = _INTEGERS.get(wanted[1]) or _BYTES.get(wanted[1])
                read = form(size) if form and size else None
                codes, post = read if read is not None else (f"{size}s", wanted[1])
                picks.append((wanted[0], (self._add(codes, 1),), post))
            elif size:
                self._add(f"{size}x", 0)
            padded = min((length + 3) & ~3, end - offset)
            if padded > length:
                self._add(f"{padded - length}x", 0)
            offset += padded
        return offset == end

    def decode(self, attrs, defaults):
        """The entry's fields, or None when its headers are not this layout's."""
        values = self.struct.unpack_from(attrs)
        if self.header_values(values) != self.expected:
            return None
        found = dict(defaults)
        for name, getter, post in self.picks:
            value = getter(values)
            found[name] = value if post is None else post(value)
        return found


def _decode(attrs, fields, **defaults):
    found = _fields(attrs, fields, **defaults)
    # Kernels since 4.x send 64-bit stats beside the old 32-bit ones; prefer them.
    stats32 = found.pop("stats32", {})
    found["stats"] = found.get("stats") or stats32
    return found


def parse_service(attrs, stats=True):
    """A dumped service's attributes as a dict; 'key' holds its raw key
    attributes.  Without `stats`, its counters are left out ({})."""
    svc = _decode(attrs, _SERVICE_FIELDS if stats else _SERVICE_FIELDS_BARE)
    svc["key"] = b"".join(nla(kind, value) for kind, value in iter_attrs(attrs)
                          if kind in SERVICE_KEY_ATTRS)
    return svc


def parse_dest(attrs, stats=True):
    return _decode(attrs, _DEST_FIELDS if stats else _DEST_FIELDS_BARE, active=0, inactive=0)


def stop_daemon_attrs(state):
    """What IPVS_CMD_DEL_DAEMON needs: the role of the daemon to stop, nothing else."""
    return nla(IPVS_CMD_ATTR_DAEMON, nla(DAEMON_STATE, _u32(state)))


def parse_daemon(attrs):
    """A sync daemon: state (IP_VS_STATE_*), interface, syncid, and its multicast group and port."""
    return _fields(attrs, _DAEMON_FIELDS)


def _top_attr(payload, wanted):
    for kind, value in iter_attrs(payload[_GENLHDR.size:]):
        if kind == wanted:
            return value
    return None


class GenlSocket:
    """A raw generic-netlink socket that sends requests in batches and collects their acks."""

    BATCH = 256  # requests per sendmsg
    # Each ack takes about a kilobyte of receive buffer however small it is;
    # a batch's acks must all fit, or the kernel drops them (ENOBUFS).
    RCVBUF = 4 << 20

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.sock.bind((0, 0))
        # Acks need not echo the request back: smaller acks, more in flight.
        self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        try:  # root may go past net.core.rmem_max
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, self.RCVBUF)
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RCVBUF)
        self.seq = 0

    def close(self):
        self.sock.close()

    # A netlink datagram is one ack, one answer, or one part of a dump, which
    # the kernel fills to at most 32 KiB.  Python allocates the whole buffer
    # for each read and shrinks it after: a read into a megabyte took four
    # times as long as one into this, over a dump's thousands of reads.
    RECEIVE = 64 << 10

    def _receive(self):
        data, _ancillary, flags, _address = self.sock.recvmsg(self.RECEIVE)
        if flags & socket.MSG_TRUNC:  # the rest of the datagram is gone
            raise OSError(errno.EMSGSIZE, f"a netlink message longer than {self.RECEIVE} bytes")
        return data

    def _answers(self, what):
        """Payloads answering request self.seq, until its DONE or ack; an error ack raises."""
        while True:
            for kind, seq, payload in iter_messages(self._receive()):
                if seq != self.seq:
                    continue
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    code = ack_errno(payload)
                    if code:
                        raise OSError(code, what)
                    return
                yield payload

    def family(self, name):
        """The id of a generic-netlink family; the kernel loads its module if needed."""
        attrs = nla(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0")
        self.seq += 1
        self.sock.send(message(GENL_ID_CTRL, self.seq, CTRL_CMD_GETFAMILY, attrs, version=1))
        what = f"generic netlink family {name}"
        for payload in self._answers(what):
            value = _top_attr(payload, CTRL_ATTR_FAMILY_ID)
            if value is not None:
                return struct.unpack_from("=H", value)[0]
        raise OSError(errno.ENOENT, what)

    def request_all(self, build):
        """Send build(seq) for each slot, BATCH at a time; returns each request's errno."""
        count = len(build)
        codes = [None] * count
        for start in range(0, count, self.BATCH):
            first_seq = self.seq + 1
            chunk = [build[i](first_seq + i - start) for i in range(start, min(start + self.BATCH, count))]
            self.seq += len(chunk)
            self.sock.sendall(b"".join(chunk))
            pending = len(chunk)
            while pending:
                for kind, seq, payload in iter_messages(self._receive()):
                    index = start + seq - first_seq
                    if kind == NLMSG_ERROR and 0 <= index - start < len(chunk) and codes[index] is None:
                        codes[index] = ack_errno(payload)
                        pending -= 1
        return codes

    def dump(self, family, cmd, attrs=b""):
        """The payloads of a dump request's answers."""
        self.seq += 1
        self.sock.send(message(family, self.seq, cmd, attrs, flags=NLM_F_REQUEST | NLM_F_DUMP))
        return list(self._answers("IPVS dump"))

    def ask(self, family, cmd, attrs=b""):
        """The answers to one request that is not a dump, up to its ack."""
        self.seq += 1
        self.sock.send(message(family, self.seq, cmd, attrs))
        return list(self._answers("IPVS request"))

    def timeouts(self, family):
        for payload in self.ask(family, IPVS_CMD_GET_CONFIG):
            return parse_config(payload)
        raise OSError(errno.ENODATA, "IPVS sent no timeouts")

    def set_timeouts(self, family, timeouts):
        self.ask(family, IPVS_CMD_SET_CONFIG, config_attrs(timeouts))

    def ipvs_table(self, family, stats=True):
        """Every IPVS service with its real servers: [(service dict, [dest dicts])];
        without `stats`, their counters are left out."""
        table = []
        for payload in self.dump(family, IPVS_CMD_GET_SERVICE):
            svc = parse_service(_top_attr(payload, IPVS_CMD_ATTR_SERVICE) or b"", stats)
            table.append((svc, self._dests(family, nla(IPVS_CMD_ATTR_SERVICE, svc["key"]),
                                           stats)))
        return table

    def real_servers(self, family, key):
        """The real servers of one service, by its key, without counters:
        [dest dicts]; none where the kernel has no such service."""
        return self._dests(family, service_attrs(key), stats=False)

    def _dests(self, family, service, stats):
        """The real servers the kernel dumps for `service`, the service
        attribute that names one by its key."""
        return [parse_dest(_top_attr(payload, IPVS_CMD_ATTR_DEST) or b"", stats)
                for payload in self.dump(family, IPVS_CMD_GET_DEST, service)]

    def sync_daemons(self, family):
        """The running connection sync daemons, master and backup: [daemon dicts]."""
        return [parse_daemon(_top_attr(payload, IPVS_CMD_ATTR_DAEMON) or b"")
                for payload in self.dump(family, IPVS_CMD_GET_DAEMON)]

    def stop_sync_daemon(self, family, state):
        """Stop the sync daemon of one role (IP_VS_STATE_MASTER or _BACKUP)."""
        self.ask(family, IPVS_CMD_DEL_DAEMON, stop_daemon_attrs(state))
