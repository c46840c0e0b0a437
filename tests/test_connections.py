"""status --connections: the kernel's table as /proc/net/ip_vs_conn writes it, named."""

import io
import json

from helpers import PI_SINGLE, cluster_from
from lbctl.status.connections import Filter, Names, entries, write_json, write_text

# As the kernel writes it: hex addresses and ports, a persistence template
# (state NONE, client port 0), and a UDP flow.
TABLE = """\
Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP C0A86414 9C40 C0A8640A 0050 C0A86403 0050 ESTABLISHED     899
TCP C0A86414 9C41 C0A8640A 0050 C0A86404 0050 TIME_WAIT        65
TCP 0A000001 D431 C0A8640A 0050 C0A86406 0050 FIN_WAIT        119
UDP C0A86414 E000 C0A8640B 0035 C0A86403 0035 UDP             299
TCP C0A86415 0000 C0A8640A 0050 C0A86404 0050 NONE            360
TCP C0A86499 9C40 C0A86463 0050 C0A86403 0050 ESTABLISHED      10
"""


def table(tmp_path):
    path = tmp_path / "ip_vs_conn"
    path.write_text(TABLE)
    return str(path)


def names():
    return Names.of([cluster_from(PI_SINGLE)])


def listed(tmp_path, **filters):
    out = io.StringIO()
    write_json(entries(Filter.of(names(), **filters), table(tmp_path)), names(), out)
    return json.loads(out.getvalue())


def test_json_names_every_entry_and_counts_states_per_service_and_worker(tmp_path):
    report = listed(tmp_path)
    first = report["connections"][0]
    assert first == {"protocol": "tcp", "client": "192.168.100.20", "client_port": 40000,
                     "vip": "192.168.100.10", "port": 80, "service": "web",
                     "cluster": "pi-web", "worker": "pi1",
                     "worker_address": "192.168.100.3", "worker_port": 80,
                     "state": "ESTABLISHED", "expires": 899, "template": False}
    assert len(report["connections"]) == 6
    template = report["connections"][4]
    assert template["template"] and template["client_port"] == 0 and template["worker"] == "pi2"
    # A service the file does not name (another VIP) keeps its addresses, without a name.
    assert report["connections"][5]["service"] is None
    assert report["connections"][5]["cluster"] is None
    summary = {(s["service"], s["worker"]): s["states"] for s in report["summary"]}
    assert summary[("web", "pi2")] == {"TIME_WAIT": 1, "persistence": 1}
    assert summary[("dns", "pi1")] == {"UDP": 1}


def test_filters_by_service_worker_and_client_network(tmp_path):
    assert [c["client_port"] for c in listed(tmp_path, service="dns")["connections"]] == [57344]
    assert {c["worker"] for c in listed(tmp_path, worker="pi2")["connections"]} == {"pi2"}
    from_lan = listed(tmp_path, client="192.168.100.0/24")["connections"]
    assert "10.0.0.1" not in {c["client"] for c in from_lan} and len(from_lan) == 5
    assert [c["client"] for c in listed(tmp_path, client="10.0.0.0/8")["connections"]] == \
        ["10.0.0.1"]


def test_text_lists_entries_with_names_and_ends_with_the_counts(tmp_path):
    out = io.StringIO()
    assert write_text(Filter(), names(), out, table(tmp_path)) == 6
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["pro", "expire", "state", "client", "service", "worker"]
    assert lines[1].split() == ["tcp", "14:59", "ESTABLISHED", "192.168.100.20:40000", "web",
                                "192.168.100.10:80", "pi1", "192.168.100.3:80"]
    assert lines[5].split()[2] == "persistence"
    assert "? 192.168.100.99:80" in lines[6]
    assert "6 connection entries" in lines
    assert "  web 192.168.100.10:80 -> pi2 192.168.100.4:80: 1 TIME_WAIT, 1 persistence" in lines


def test_the_text_path_for_a_filter_or_odd_lines_lists_the_same_entries(tmp_path):
    """The column-at-a-time path and the entry-at-a-time one agree."""
    fast, slow = io.StringIO(), io.StringIO()
    write_text(Filter(), names(), fast, table(tmp_path))
    everything = Filter.of(names(), client="0.0.0.0/0")
    write_text(everything, names(), slow, table(tmp_path))
    assert fast.getvalue() == slow.getvalue()


def test_no_table_says_ipvs_is_not_loaded_and_an_empty_one_lists_nothing(tmp_path):
    out = io.StringIO()
    assert write_text(Filter(), names(), out, str(tmp_path / "absent")) == 0
    assert out.getvalue().startswith("IPVS: not loaded (the ip_vs kernel module)"), out.getvalue()
    assert "connection entr" not in out.getvalue()
    empty = tmp_path / "ip_vs_conn"
    empty.write_text(TABLE.splitlines(keepends=True)[0])  # the header alone
    out = io.StringIO()
    assert write_text(Filter(), names(), out, str(empty)) == 0
    assert out.getvalue().endswith("0 connection entries\n") and "not loaded" not in out.getvalue()


def test_json_ends_with_the_kernels_timeouts_and_the_weights_of_the_real_servers_kept(tmp_path):
    from ipaddress import IPv4Address

    from fakes import FakeIpvs
    from lbctl.config.model import DestKey, ServiceKey
    from lbctl.state import FWD_DIRECT_ROUTING, ServiceSpec
    from lbctl.status.connections import kernel_settings

    ipvs = FakeIpvs()
    ipvs.kernel_timeouts["tcp_fin"] = 600  # as `ipvsadm --set` or another file left it
    web = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
    ipvs.services[web] = ServiceSpec("wrr")
    for address, weight in (("192.168.100.3", 0), ("192.168.100.4", 1)):
        ipvs.dests[DestKey(web, IPv4Address(address), 80)] = [weight, FWD_DIRECT_ROUTING, 0]
    wanted = Filter.of(names(), worker="pi1")
    out = io.StringIO()
    write_json(entries(wanted, table(tmp_path)), names(), out, kernel_settings(ipvs, wanted, names()))
    report = json.loads(out.getvalue())
    assert report["timeouts"] == {"tcp": 900, "tcp_fin": 600, "udp": 300}
    # pi1's real server alone, drained: a reader can tell a drain was undone.
    assert report["real_servers"] == [{"service": "web", "cluster": "pi-web",
                                       "vip": "192.168.100.10", "port": 80,
                                       "worker": "pi1", "worker_address": "192.168.100.3",
                                       "worker_port": 80, "weight": 0}]
    assert len(report["connections"]) == 3  # pi1's, as before
