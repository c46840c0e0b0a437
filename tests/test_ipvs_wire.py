"""The batched write path's messages, read back with pyroute2's own IPVS parser."""

import errno
import socket
import struct
from ipaddress import IPv4Address

import pytest
from pyroute2.netlink.generic.ipvs import ipvsmsg

from lbctl.adapters import ipvs_wire
from lbctl.adapters.protocols import IpvsOp
from lbctl.config.model import DestKey, ServiceKey
from lbctl.state import DestSpec, ServiceSpec

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
DNS = ServiceKey("udp", IPv4Address("192.168.100.11"), 53)
PI3 = DestKey(WEB, IPv4Address("192.168.100.6"), 80)


def parse(data):
    msg = ipvsmsg(data)
    msg.decode()
    return msg


def svc(msg):
    return msg.get_attr("IPVS_CMD_ATTR_SERVICE")


def test_add_service_carries_key_scheduler_flags_timeout_and_netmask():
    msg = parse(ipvs_wire.op_message(42, 7, IpvsOp("add", "service", WEB, ServiceSpec("wrr", 300))))
    assert (msg["header"]["type"], msg["header"]["sequence_number"], msg["cmd"]) == (42, 7, 1)
    assert msg["header"]["flags"] == ipvs_wire.NLM_F_REQUEST | ipvs_wire.NLM_F_ACK
    s = svc(msg)
    assert s.get_attr("IPVS_SVC_ATTR_AF") == 2
    assert s.get_attr("IPVS_SVC_ATTR_PROTOCOL") == 6
    assert s.get_attr("IPVS_SVC_ATTR_ADDR") == "192.168.100.10"
    assert s.get_attr("IPVS_SVC_ATTR_PORT") == 80
    assert s.get_attr("IPVS_SVC_ATTR_SCHED_NAME") == "wrr"
    assert s.get_attr("IPVS_SVC_ATTR_FLAGS")["flags"] == 1
    assert s.get_attr("IPVS_SVC_ATTR_TIMEOUT") == 300
    assert s.get_attr("IPVS_SVC_ATTR_NETMASK") == "255.255.255.255"


def test_set_service_without_persistence_clears_the_flag():
    s = svc(parse(ipvs_wire.op_message(42, 1, IpvsOp("set", "service", DNS, ServiceSpec("rr")))))
    assert s.get_attr("IPVS_SVC_ATTR_PROTOCOL") == 17
    assert s.get_attr("IPVS_SVC_ATTR_FLAGS") == {"flags": 0, "mask": ipvs_wire.MANAGED_FLAGS}
    assert s.get_attr("IPVS_SVC_ATTR_TIMEOUT") == 0


def test_service_writes_change_only_the_flags_lbctl_manages():
    s = svc(parse(ipvs_wire.op_message(42, 1, IpvsOp("set", "service", DNS, ServiceSpec("rr")))))
    mask = s.get_attr("IPVS_SVC_ATTR_FLAGS")["mask"]
    # persistence, one-packet and the three scheduler bits are set or cleared...
    assert mask & 0x01 and mask & 0x04 and mask & 0x08 and mask & 0x10 and mask & 0x20
    # ...and the kernel's own HASHED bit, and bits lbctl does not know, are left alone.
    assert not mask & 0x02 and not mask & ~0x3F


def test_service_flags_are_sent_and_read_back_by_name():
    spec = ServiceSpec("sh", 60, ("ops", "sh-port"))
    s = svc(parse(ipvs_wire.op_message(42, 1, IpvsOp("add", "service", DNS, spec))))
    flags = s.get_attr("IPVS_SVC_ATTR_FLAGS")["flags"]
    assert flags == 0x01 | 0x04 | 0x10  # persistent, IP_VS_SVC_F_ONEPACKET, IP_VS_SVC_F_SCHED2
    # What a dump reports, HASHED included, comes back as the names the file uses.
    assert ipvs_wire.flag_names(flags | 0x02, "sh") == ("ops", "sh-port")
    assert ipvs_wire.flag_names(0x08 | 0x10, "mh") == ("mh-fallback", "mh-port")
    # Scheduler bits under a scheduler that ignores them have no name.
    assert ipvs_wire.flag_names(0x08, "wrr") == ()


def test_set_config_carries_only_the_declared_timeouts_and_reads_back():
    msg = parse(ipvs_wire.message(42, 3, ipvs_wire.IPVS_CMD_SET_CONFIG,
                                  ipvs_wire.config_attrs({"udp": 30, "tcp_fin": 60})))
    assert msg["cmd"] == 12
    names = [name for name, _ in msg["attrs"]]
    assert sorted(names) == ["IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", "IPVS_CMD_ATTR_TIMEOUT_UDP"]
    # The kernel's GET_CONFIG answer has the same layout, with all three.
    answer = ipvs_wire.message(42, 4, ipvs_wire.IPVS_CMD_GET_CONFIG, ipvs_wire.config_attrs(
        {"tcp": 900, "tcp_fin": 60, "udp": 30}))[16:]
    assert ipvs_wire.parse_config(answer) == {"tcp": 900, "tcp_fin": 60, "udp": 30}


@pytest.mark.parametrize("verb,cmd", [("add", 5), ("set", 6)])
def test_dest_changes_name_the_service_and_the_real_server_in_direct_routing(verb, cmd):
    msg = parse(ipvs_wire.op_message(42, 3, IpvsOp(verb, "dest", WEB, DestSpec(2), PI3)))
    assert msg["cmd"] == cmd
    assert svc(msg).get_attr("IPVS_SVC_ATTR_SCHED_NAME") is None  # key only
    d = msg.get_attr("IPVS_CMD_ATTR_DEST")
    assert d.get_attr("IPVS_DEST_ATTR_ADDR") == "192.168.100.6"
    assert d.get_attr("IPVS_DEST_ATTR_PORT") == 80
    assert d.get_attr("IPVS_DEST_ATTR_WEIGHT") == 2
    assert d.get_attr("IPVS_DEST_ATTR_FWD_METHOD") == 3


def test_delete_messages_carry_keys_only():
    msg = parse(ipvs_wire.op_message(42, 4, IpvsOp("del", "dest", WEB, None, PI3)))
    assert msg["cmd"] == 7
    assert msg.get_attr("IPVS_CMD_ATTR_DEST").get_attr("IPVS_DEST_ATTR_WEIGHT") is None
    assert parse(ipvs_wire.op_message(42, 5, IpvsOp("del", "service", WEB)))["cmd"] == 3


def test_received_buffers_split_into_messages_and_acks():
    ok = ipvs_wire._NLMSGHDR.pack(36, ipvs_wire.NLMSG_ERROR, 0, 9, 0) + b"\0" * 20
    bad = ipvs_wire._NLMSGHDR.pack(36, ipvs_wire.NLMSG_ERROR, 0, 10, 0) + \
        (-22).to_bytes(4, "little", signed=True) + b"\0" * 16
    found = [(kind, seq, ipvs_wire.ack_errno(p)) for kind, seq, p in ipvs_wire.iter_messages(ok + bad)]
    assert found == [(2, 9, 0), (2, 10, 22)]


def _encoded(cmd, top, attrs):
    msg = ipvsmsg()
    msg["cmd"] = cmd
    msg["version"] = 1
    msg["attrs"] = [(top, {"attrs": attrs})]
    msg.encode()
    return bytes(msg.data)[16:]  # the payload after the netlink header


def test_dumped_services_parse_like_pyroute2_encodes_them():
    payload = _encoded(4, "IPVS_CMD_ATTR_SERVICE", [
        ("IPVS_SVC_ATTR_AF", 2), ("IPVS_SVC_ATTR_PROTOCOL", 6),
        ("IPVS_SVC_ATTR_ADDR", "192.168.100.10"), ("IPVS_SVC_ATTR_PORT", 80),
        ("IPVS_SVC_ATTR_SCHED_NAME", "wrr"), ("IPVS_SVC_ATTR_FLAGS", {"flags": 1, "mask": 0xFFFFFFFF}),
        ("IPVS_SVC_ATTR_TIMEOUT", 300),
        ("IPVS_SVC_ATTR_STATS64", {"attrs": [("IPVS_STATS_ATTR_CONNS", 7),
                                             ("IPVS_STATS_ATTR_INBYTES", 1 << 40),
                                             ("IPVS_STATS_ATTR_CPS", 3)]}),
    ])
    svc = ipvs_wire.parse_service(ipvs_wire._top_attr(payload, ipvs_wire.IPVS_CMD_ATTR_SERVICE))
    assert (svc["af"], svc["protocol"], svc["addr"], svc["port"]) == (2, 6, "192.168.100.10", 80)
    assert (svc["scheduler"], svc["flags"], svc["timeout"]) == ("wrr", 1, 300)
    assert svc["stats"] == {"conns": 7, "inbytes": 1 << 40, "cps": 3}
    # The key sent back to ask for this service's real servers is the one received.
    assert ipvs_wire.service_attrs(WEB)[4:] == svc["key"]
    # What apply reads: the same service without its counters.
    bare = ipvs_wire.parse_service(ipvs_wire._top_attr(payload, ipvs_wire.IPVS_CMD_ATTR_SERVICE),
                                   stats=False)
    assert bare == {**svc, "stats": {}}


def test_dumped_real_servers_parse_like_pyroute2_encodes_them():
    payload = _encoded(8, "IPVS_CMD_ATTR_DEST", [
        ("IPVS_DEST_ATTR_ADDR", "192.168.100.6"), ("IPVS_DEST_ATTR_PORT", 80),
        ("IPVS_DEST_ATTR_FWD_METHOD", 3), ("IPVS_DEST_ATTR_WEIGHT", 2),
        ("IPVS_DEST_ATTR_ACTIVE_CONNS", 4), ("IPVS_DEST_ATTR_INACT_CONNS", 9),
        ("IPVS_DEST_ATTR_ADDR_FAMILY", 2),
        ("IPVS_DEST_ATTR_STATS64", {"attrs": [("IPVS_STATS_ATTR_CONNS", 5),
                                              ("IPVS_STATS_ATTR_OUTBYTES", 1 << 33)]}),
    ])
    dest = ipvs_wire.parse_dest(ipvs_wire._top_attr(payload, ipvs_wire.IPVS_CMD_ATTR_DEST))
    assert dest == {"addr": "192.168.100.6", "port": 80, "forward": 3, "weight": 2,
                    "active": 4, "inactive": 9, "stats": {"conns": 5, "outbytes": 1 << 33}}
    bare = ipvs_wire.parse_dest(ipvs_wire._top_attr(payload, ipvs_wire.IPVS_CMD_ATTR_DEST),
                                stats=False)
    assert bare == {**dest, "stats": {}}


def _dest_payload(order, weight, conns):
    attrs = {"IPVS_DEST_ATTR_ADDR": "192.168.100.6", "IPVS_DEST_ATTR_PORT": 80,
             "IPVS_DEST_ATTR_FWD_METHOD": 3, "IPVS_DEST_ATTR_WEIGHT": weight,
             "IPVS_DEST_ATTR_ADDR_FAMILY": 2,
             "IPVS_DEST_ATTR_STATS64": {"attrs": [("IPVS_STATS_ATTR_CONNS", conns),
                                                  ("IPVS_STATS_ATTR_INPKTS", 2)]}}
    payload = _encoded(8, "IPVS_CMD_ATTR_DEST", [(name, attrs[name]) for name in order])
    return ipvs_wire._top_attr(payload, ipvs_wire.IPVS_CMD_ATTR_DEST)


def test_each_dumped_entry_is_read_by_its_own_headers():
    """Entries are read through the layout of the first of their length: one
    of that length laid out otherwise, or with other values, reads right."""
    usual = ["IPVS_DEST_ATTR_ADDR", "IPVS_DEST_ATTR_PORT", "IPVS_DEST_ATTR_FWD_METHOD",
             "IPVS_DEST_ATTR_WEIGHT", "IPVS_DEST_ATTR_ADDR_FAMILY", "IPVS_DEST_ATTR_STATS64"]
    swapped = [usual[0], usual[3], usual[2], usual[1], *usual[4:]]
    first = _dest_payload(usual, 2, 5)
    other = _dest_payload(swapped, 7, 1 << 40)
    assert len(first) == len(other) and first != other
    expected = {"addr": "192.168.100.6", "port": 80, "forward": 3, "active": 0, "inactive": 0}
    # The first is read through the layout made of it; the other, of the same
    # length but other headers, is walked, the second time through as well.
    assert ipvs_wire._layout(ipvs_wire._DEST_FIELDS, first).decode(first, {}) is not None
    assert ipvs_wire._layout(ipvs_wire._DEST_FIELDS, first).decode(other, {}) is None
    for _ in range(2):
        assert ipvs_wire.parse_dest(first) == {**expected, "weight": 2,
                                               "stats": {"conns": 5, "inpkts": 2}}
        assert ipvs_wire.parse_dest(other) == {**expected, "weight": 7,
                                               "stats": {"conns": 1 << 40, "inpkts": 2}}
    # Schedulers' names differ in length inside the same padding.
    for name in ("rr", "wrr", "wlc", "sh", "mh"):
        attrs = ipvs_wire.nla(ipvs_wire.SVC_SCHED_NAME, name.encode() + b"\0") \
            + ipvs_wire.nla(ipvs_wire.SVC_PORT, b"\0\x50")
        assert ipvs_wire.parse_service(attrs)["scheduler"] == name


def test_an_empty_counter_reads_as_zero_and_a_full_layout_cache_still_reads_right(
        monkeypatch):
    stats = ipvs_wire.nla(1, b"") + ipvs_wire.nla(3, struct.pack("=Q", 9))
    attrs = (ipvs_wire.nla(ipvs_wire.DEST_WEIGHT, struct.pack("=I", 4))
             + ipvs_wire.nla(ipvs_wire.DEST_STATS64, stats))
    for _ in range(2):
        assert ipvs_wire.parse_dest(attrs) == {"weight": 4, "active": 0, "inactive": 0,
                                               "stats": {"conns": 0, "outpkts": 9}}
    monkeypatch.setattr(ipvs_wire, "_LAYOUTS", {})
    monkeypatch.setattr(ipvs_wire, "_MAX_LAYOUTS", 0)
    assert ipvs_wire.parse_dest(attrs)["stats"] == {"conns": 0, "outpkts": 9}
    assert ipvs_wire._LAYOUTS == {}


def test_the_kernels_sixteen_byte_address_union_reads_as_ipv4():
    attrs = ipvs_wire.nla(ipvs_wire.SVC_ADDR, bytes([10, 2, 0, 1]) + b"\0" * 12)
    assert ipvs_wire.parse_service(attrs)["addr"] == "10.2.0.1"


def test_a_datagram_longer_than_the_receive_buffer_is_an_error_not_a_short_read():
    sock = ipvs_wire.GenlSocket()
    sock.sock.close()  # its reads come from a datagram socket of the test's instead
    sender, sock.sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    try:
        message = ipvs_wire.message(42, 1, 4, b"")
        sender.send(message)
        assert sock._receive() == message
        sender.send(b"\0" * (ipvs_wire.GenlSocket.RECEIVE + 1))
        with pytest.raises(OSError) as refused:
            sock._receive()
        assert refused.value.errno == errno.EMSGSIZE
    finally:
        sender.close()
        sock.close()


def test_an_unknown_family_is_reported_as_missing():
    sock = ipvs_wire.GenlSocket()
    try:
        with pytest.raises(FileNotFoundError):
            sock.family("LBCTL_NO_SUCH")
    finally:
        sock.close()


def test_a_sync_daemon_dump_reads_role_interface_syncid_group_and_port():
    import socket
    import struct

    nla = ipvs_wire.nla
    daemon = (nla(ipvs_wire.DAEMON_STATE, struct.pack("=I", ipvs_wire.IP_VS_STATE_BACKUP))
              + nla(ipvs_wire.DAEMON_MCAST_IFN, b"eth0\0")
              + nla(ipvs_wire.DAEMON_SYNC_ID, struct.pack("=I", 51))
              + nla(ipvs_wire.DAEMON_SYNC_MAXLEN, struct.pack("=H", 1472))
              + nla(ipvs_wire.DAEMON_MCAST_GROUP, socket.inet_aton("224.0.0.81"))
              + nla(ipvs_wire.DAEMON_MCAST_PORT, struct.pack("=H", 8848))
              + nla(ipvs_wire.DAEMON_MCAST_TTL, b"\1"))
    assert ipvs_wire.parse_daemon(daemon) == {"state": 2, "interface": "eth0", "syncid": 51,
                                              "group": "224.0.0.81", "port": 8848}


def test_stopping_a_sync_daemon_names_its_role_only():
    msg = parse(ipvs_wire.message(42, 3, ipvs_wire.IPVS_CMD_DEL_DAEMON,
                                  ipvs_wire.stop_daemon_attrs(ipvs_wire.IP_VS_STATE_BACKUP)))
    assert msg["cmd"] == 10  # IPVS_CMD_DEL_DAEMON
    # pyroute2 leaves this nest undecoded: one attribute, 8 bytes long, of
    # type 1 (IPVS_DAEMON_ATTR_STATE), holding 2 (IP_VS_STATE_BACKUP).
    assert msg.get_attr("IPVS_CMD_ATTR_DAEMON") == "08:00:01:00:02:00:00:00"


def test_a_dump_becomes_services_keyed_as_lbctl_makes_them_and_others_by_a_label():
    from lbctl.adapters.ipvs import _services

    counters = {"conns": 7, "inpkts": 1, "outpkts": 0, "inbytes": 60, "outbytes": 0, "cps": 0,
                "inpps": 0, "inbps": 0, "outbps": 0}
    dest = {"addr": "192.168.100.6", "port": 80, "weight": 2, "forward": 2, "active": 1,
            "inactive": 3, "stats": counters}
    web = {"af": socket.AF_INET, "protocol": socket.IPPROTO_TCP, "addr": "192.168.100.10",
           "port": 80, "scheduler": "sh",
           "flags": ipvs_wire.IP_VS_SVC_F_PERSISTENT | ipvs_wire.IP_VS_SVC_F_SCHED2,
           "timeout": 300, "stats": counters}
    marked = {"af": socket.AF_INET, "fwmark": 5, "scheduler": "rr", "flags": 0, "stats": {}}
    sixes = {"af": socket.AF_INET6, "protocol": socket.IPPROTO_TCP, "addr": "192.168.100.11",
             "port": 443, "scheduler": "rr", "flags": 0, "stats": {}}
    found = _services([(web, [dest]), (marked, [dest]), (sixes, [])])
    assert [(s.key, s.label, s.scheduler, s.persistence) for s in found] == [
        (WEB, str(WEB), "sh", 300), (None, "fwmark 5", "rr", 0),
        (None, "proto 6 192.168.100.11", "rr", 0)]
    assert found[0].stats.conns == 7 and found[1].stats.conns == 0
    (pi3,) = found[1].dests
    assert (pi3.address, pi3.port, pi3.weight, pi3.active, pi3.inactive) == \
        (IPv4Address("192.168.100.6"), 80, 2, 1, 3)
    assert found[0].dests == found[1].dests
    assert (found[0].flags, found[1].flags) == (("sh-port",), ())
