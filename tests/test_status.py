"""How status reads on a balancer and on a worker."""

import errno
import subprocess
from dataclasses import replace

import pytest

from helpers import KeepalivedRunning

from lbctl.status.model import NodeStatus
from lbctl.status.render import format_status

BALANCER = {
    "clusters": [{"cluster": "pi-web", "node": "lb1", "role": "balancer"}], "ipvs_loaded": True,
    "services": [{"service": "tcp 192.168.100.10:80", "scheduler": "wrr", "persistence": 0,
                  "connections": 12, "conns_per_s": 2, "in_packets": 340, "in_bytes": 51000,
                  "in_packets_per_s": 6, "in_bytes_per_s": 900,
                  "real_servers": [{"address": "192.168.100.3:80", "forward": "route", "weight": 1,
                                    "active": 1, "inactive": 4, "connections": 5}]}],
    "vips_on_lo": [], "arp": {"all": {"arp_ignore": "0", "arp_announce": "0"}},
}
WORKER = {"clusters": [{"cluster": "pi-web", "node": "pi1", "role": "worker"}],
          "ipvs_loaded": True, "services": [], "vips_on_lo": ["192.168.100.10"],
          "arp": {"all": {"arp_ignore": "1", "arp_announce": "2"},
                  "eth0": {"arp_ignore": "1", "arp_announce": "2"}}}


def shown(data, now=None):
    """status's text for `data`, a node's `status --json`."""
    return format_status(NodeStatus.from_json(data), now=now)


SYNC_GROUP = {"interface": "eth0", "syncid": 51, "group": "224.0.0.81", "port": 8848}
BOTH_DAEMONS = [dict(SYNC_GROUP, role="master"), dict(SYNC_GROUP, role="backup")]
# As the kernel prints it (ip_vs_conn_sync_seq_show): learned connections are
# SYNC, this node's own LOCAL, and persistence templates have client port 0.
CONN_SYNC = """\
Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Origin Expires
TCP C0A86414 D2F0 C0A8640A 0050 C0A86403 0050 ESTABLISHED SYNC       895
TCP C0A86414 D2F2 C0A8640A 0050 C0A86404 0050 ESTABLISHED LOCAL      890
UDP C0A86414 A001 C0A8640B 0035 C0A86403 0035 UDP         SYNC       290
TCP C0A86414 0000 C0A8640A 0050 C0A86403 0050 NONE        SYNC       300
UDP C0A86414 0000 C0A8640B 0035 C0A86403 0035 UDP         SYNC       300
"""


def test_a_balancer_shows_services_real_servers_connections_and_rates():
    text = shown(BALANCER)
    assert text.splitlines()[0] == "lbctl status: cluster pi-web, node lb1 (balancer)"
    assert ("tcp 192.168.100.10:80 wrr  connections 12 (2/s)  in 340 packets (6/s)"
            "  51000 bytes (900 B/s)") in text
    assert "-> 192.168.100.3:80" in text and "weight 1" in text and "active 1" in text
    assert "ARP settings" not in text


def test_a_balancer_shows_service_flags_and_the_ipvs_timeouts():
    dns = dict(BALANCER["services"][0], service="udp 192.168.100.11:53", scheduler="sh",
               flags=["ops", "sh-port"])
    report = dict(BALANCER, services=[dns], timeouts={"tcp": 600, "tcp_fin": 120, "udp": 20})
    text = shown(report)
    assert "udp 192.168.100.11:53 sh flags ops,sh-port  connections 12" in text
    assert "IPVS timeouts: tcp 600s  tcp_fin 120s  udp 20s" in text


def test_direct_routing_shows_no_outgoing_figures_and_says_why():
    text = shown(BALANCER)
    assert "out " not in text and "outgoing" in text
    assert "replies go from the workers straight to the clients" in text
    assert "out_bytes_per_s" not in BALANCER["services"][0]


def test_status_json_has_incoming_figures_and_no_outgoing_ones(monkeypatch):
    from lbctl.adapters.protocols import IpvsService, IpvsSnapshot, IpvsStats
    from lbctl.status.collect import collect

    stats = IpvsStats(conns=12, inpkts=340, inbytes=51000, cps=2, inpps=6, inbps=900)
    snapshot = IpvsSnapshot([IpvsService(None, "tcp 192.168.100.10:80", "wrr", 0, (), stats)], [])
    report = collect("/nonexistent", ipvs=FakeIpvs(snapshot),
                     conn_sync_table="/nonexistent").to_json()
    service = report["services"][0]
    assert {k: service[k] for k in ("connections", "conns_per_s", "in_packets", "in_bytes",
                                    "in_packets_per_s", "in_bytes_per_s")} == \
        {"connections": 12, "conns_per_s": 2, "in_packets": 340, "in_bytes": 51000,
         "in_packets_per_s": 6, "in_bytes_per_s": 900}
    assert not any(k.startswith("out") for k in service)


def test_a_worker_shows_its_vips_and_arp_settings():
    text = shown(WORKER)
    assert text.splitlines()[0] == "lbctl status: cluster pi-web, node pi1 (worker)"
    assert "IPVS services: none" in text
    assert "VIPs on lo: 192.168.100.10" in text
    assert "eth0       arp_ignore=1  arp_announce=2" in text


def test_a_keepalived_balancer_shows_vrrp_state_and_each_workers_health(tmp_path):
    from lbctl.status.collect import keepalived_states

    state = tmp_path / "run/lbctl/pi-web/state"
    state.mkdir(parents=True)
    (state / "vrrp").write_text("MASTER 1000.5\n")
    (state / "health.web@pi1").write_text("up 1000.0\n")
    (state / "health.web@pi.2").write_text("down 1090.0\n")
    (state / "check.web@pi1").write_text("up 0\n")  # lbctl-check's own counter, not health
    with KeepalivedRunning(tmp_path):
        states = keepalived_states(str(tmp_path))
    assert states["pi-web"].running is True
    assert [h.worker for h in states["pi-web"].health] == ["pi.2", "pi1"]
    text = format_status(replace(NodeStatus.from_json(BALANCER), keepalived=states), now=1100.0)
    assert "keepalived for cluster pi-web: VRRP MASTER for 100s" in text
    assert "health web/pi1: up for 100s" in text
    assert "health web/pi.2: down for 10s" in text


def test_a_keepalived_that_stopped_shows_not_running_and_its_last_role(tmp_path):
    from lbctl.status.collect import keepalived_states

    state = tmp_path / "run/lbctl/pi-web/state"
    state.mkdir(parents=True)
    (state / "vrrp").write_text("MASTER 1000.5\n")  # a kill leaves the last role
    with KeepalivedRunning(tmp_path) as keepalived:
        pid = keepalived.proc.pid
    # Its pid file names a process that has gone (or, after a while, another).
    assert (tmp_path / "run/lbctl/pi-web/keepalived.pid").read_text() == f"{pid}\n"
    states = keepalived_states(str(tmp_path))
    assert states["pi-web"].running is False
    text = format_status(replace(NodeStatus.from_json(BALANCER), keepalived=states), now=1100.0)
    assert "keepalived for cluster pi-web: not running (VRRP MASTER when last recorded, 100s ago)" in text
    assert "VRRP MASTER for 100s\n" not in text


def test_hook_reports_are_read_against_the_config_keepalived_runs(tmp_path):
    from helpers import PI_SINGLE, cluster_from
    from lbctl.status.collect import keepalived_states

    # A pair made one balancer, whose web check lost pi2 and gained pi3 by a
    # reload: the pair's VRRP role and pi2's last report stay behind on disk,
    # and keepalived took pi3 in without reporting it (a worker added by a
    # reload may start down with no notify).
    state = tmp_path / "run/lbctl/pi-web/state"
    state.mkdir(parents=True)
    (state / "vrrp").write_text("FAULT 1000.5\n")
    (state / "health.web@pi1").write_text("up 1000.0\n")
    (state / "health.web@pi2").write_text("down 1090.0\n")
    (state / "health.dns@pi1").write_text("up 1000.0\n")  # dns has no checks now
    running = cluster_from(PI_SINGLE.replace(
        "scheduler: wrr", "scheduler: wrr, workers: [pi1, pi3], health: {http: {path: /}}"))
    with KeepalivedRunning(tmp_path):
        states = keepalived_states(str(tmp_path), [running])
    assert states["pi-web"].vrrp is None
    assert [(h.service, h.worker, h.state) for h in states["pi-web"].health] == [
        ("web", "pi1", "up"), ("web", "pi3", None)]
    text = format_status(replace(NodeStatus.from_json(BALANCER), keepalived=states), now=1100.0)
    assert "keepalived for cluster pi-web: no VRRP (a single balancer)" in text
    assert "health web/pi1: up for 100s" in text
    assert "health web/pi3: no report yet" in text
    assert "pi2" not in text and "dns/" not in text


def test_arp_settings_show_what_the_kernel_acts_on_the_larger_of_all_and_the_interface():
    from lbctl.status.collect import effective_arp

    raw = {"all": {"arp_ignore": "1", "arp_announce": "2"},
           "eth0": {"arp_ignore": "0", "arp_announce": "0"},
           "wlan0": {"arp_ignore": "8", "arp_announce": "0"}}
    assert effective_arp(raw) == {"all": {"arp_ignore": "1", "arp_announce": "2"},
                                  "eth0": {"arp_ignore": "1", "arp_announce": "2"},
                                  "wlan0": {"arp_ignore": "8", "arp_announce": "2"}}


@pytest.fixture
def no_ip_vs(monkeypatch):
    """A kernel where ip_vs is not loaded: no IPVS netlink family.  The
    list of `modprobe` (and any other program) the adapter runs."""
    from lbctl.adapters import ipvs, ipvs_wire

    class NoIpvsFamily:
        def family(self, name):
            raise FileNotFoundError(errno.ENOENT, f"generic netlink family {name}")

        def close(self):
            pass

    loaded = []
    monkeypatch.setattr(ipvs_wire, "GenlSocket", NoIpvsFamily)
    def run(argv, **_kwargs):
        loaded.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "modprobe: FATAL: Module ip_vs not found")
    monkeypatch.setattr(ipvs, "run", run)
    return loaded


class FakeIpvs:
    def __init__(self, snapshot):
        self.result = snapshot

    def snapshot(self):
        return self.result


def test_without_ip_vs_loaded_status_says_so_and_names_the_cluster_and_node(tmp_path):
    from lbctl.status.collect import collect
    from lbctl.config import load_cluster

    cluster = load_cluster("examples/pi-single.yaml")
    report = collect(str(tmp_path), cluster, "lb1", ipvs=FakeIpvs(None))
    text = format_status(report)
    assert text.splitlines()[0] == "lbctl status: cluster pi-web, node lb1 (balancer)"
    assert "IPVS: not loaded (the ip_vs kernel module)" in text
    assert "`lbctl apply` loads it" in text
    assert "IPVS services: none" not in text
    assert report.ipvs_loaded is False and report.services == ()


def test_the_ipvs_adapter_reports_a_missing_ipvs_family_as_not_loaded_and_loads_nothing(
        monkeypatch, no_ip_vs):
    from lbctl.adapters import ipvs

    monkeypatch.setattr(ipvs, "run", lambda *a, **k: pytest.fail("loaded ip_vs"))
    assert ipvs.IpvsNetlink().snapshot() is None


def test_without_a_file_status_names_the_cluster_and_node_last_applied_here(tmp_path):
    from lbctl.adapters.files import FilesRoot
    from lbctl.status.collect import collect
    from lbctl.records.ownership import write_ownership
    from lbctl.state import Ownership

    write_ownership(FilesRoot(str(tmp_path)), "/var/lib/lbctl", "pi-web",
                    Ownership(files={"/etc/lbctl/pi-web.yaml"}), "lb1")
    text = format_status(collect(str(tmp_path), ipvs=FakeIpvs(None)))
    assert text.splitlines()[0] == "lbctl status: cluster pi-web, node lb1"
    nothing = format_status(collect(str(tmp_path / "empty"), ipvs=FakeIpvs(None)))
    assert nothing.splitlines()[0].startswith("lbctl status: no cluster has been applied")


def test_learned_connections_count_the_sync_origin_rows_but_not_templates(tmp_path):
    from lbctl.status.collect import learned_connections

    table = tmp_path / "ip_vs_conn_sync"
    table.write_text(CONN_SYNC)
    assert learned_connections(str(table)) == 2
    assert learned_connections(str(tmp_path / "missing")) == 0


def _sync_report(daemons, learned, vrrp):
    """A balancer's NodeStatus with these sync daemons and the warning collect gives it."""
    from lbctl.status.collect import sync_warning

    keepalived = {"pi-web": {"pair": True, "mode": "failover", "transitions": 1,
                             "vrrp": {"state": vrrp, "since": 1000.0}, "health": []}}
    status = NodeStatus.from_json(dict(BALANCER, keepalived=keepalived, sync={
        "daemons": daemons, "learned_connections": learned}))
    warning = sync_warning(status.sync.daemons, learned, status.keepalived, ["pi-web"])
    return replace(status, sync=replace(status.sync, warning=warning))


def test_a_backup_shows_its_sync_daemons_and_the_connections_it_learned():
    text = format_status(_sync_report(BOTH_DAEMONS, 17, "BACKUP"), now=1100.0)
    assert "  master daemon on eth0 syncid 51 group 224.0.0.81 port 8848" in text
    assert "  backup daemon on eth0 syncid 51 group 224.0.0.81 port 8848" in text
    assert "connections learned from the peer: 17" in text
    assert "WARNING" not in text


def test_a_backup_that_learned_nothing_warns_that_the_sync_multicast_is_filtered():
    report = _sync_report(BOTH_DAEMONS, 0, "BACKUP")
    text = format_status(report, now=1100.0)
    assert "connections learned from the peer: 0" in text
    warning = next(line for line in text.splitlines() if "WARNING" in line)
    assert "If the master is serving connections" in warning
    assert "224.0.0.81 UDP port 8848 is being filtered between the balancers" in warning
    assert "IGMP snooping" in warning and "docs/firewall.md#" in warning
    assert report.sync.warning in warning


def test_a_master_or_a_node_without_a_backup_daemon_does_not_warn():
    assert _sync_report(BOTH_DAEMONS, 0, "MASTER").sync.warning is None
    assert _sync_report(BOTH_DAEMONS[:1], 0, "BACKUP").sync.warning is None
    text = format_status(_sync_report([], 0, "BACKUP"), now=1100.0)
    assert "connection sync: no sync daemon running" in text


def test_a_read_only_ipvs_adapter_finds_nothing_where_ip_vs_is_not_loaded_and_loads_nothing(
        no_ip_vs):
    """plan (and status's drift, and the exporter) only read: where ip_vs is
    not loaded the kernel holds no IPVS state, and `modprobe ip_vs` would
    change the node.  apply and drain still load it."""
    from lbctl.adapters import ipvs

    loaded = no_ip_vs
    reader = ipvs.IpvsNetlink(load_module=False)
    assert (reader.dump(), reader.timeouts(), reader.sync_daemons()) == ([], {}, [])
    assert loaded == []
    # A write loads it whatever the adapter was made for; so does apply's reader.
    for call in (lambda: reader.set_timeouts({"udp": 60}), lambda: ipvs.IpvsNetlink().dump()):
        with pytest.raises(ipvs.KernelError, match="this kernel has no IPVS"):
            call()
        assert loaded.pop() == [ipvs.MODPROBE, "-q", "ip_vs"]


def test_status_detailed_exitcode_says_whether_apply_would_change_this_node(
        monkeypatch, tmp_path, capsys, no_ip_vs):
    from ipaddress import IPv4Address

    from lbctl.adapters import addrs
    from lbctl.cli import main

    monkeypatch.setattr(addrs.AddressIp, "list",
                        lambda self: [(IPv4Address("192.168.100.2"), 24, "eth0")])
    # A balancer never applied: its whole table is drift, as plan shows it.
    assert main(["status", "examples/pi-single.yaml", "--root", str(tmp_path),
                 "--detailed-exitcode"]) == 2
    assert "+ service tcp 192.168.100.10:80" in capsys.readouterr().out
    assert main(["status", "examples/pi-single.yaml", "--root", str(tmp_path)]) == 0
    capsys.readouterr()
    # What it cannot tell without a file, or when asked not to look, is a usage error.
    for flags in ([], ["examples/pi-single.yaml", "--no-drift"],
                  ["examples/pi-single.yaml", "--watch"],
                  ["examples/pi-single.yaml", "--connections"]):
        with pytest.raises(SystemExit) as usage:
            main(["status", *flags, "--root", str(tmp_path), "--detailed-exitcode"])
        assert usage.value.code == 64
        assert "--detailed-exitcode says whether the node drifted" in capsys.readouterr().err


def test_status_detailed_exitcode_is_1_when_drift_cannot_be_known(capsys):
    from helpers import node_status
    from lbctl.commands.status import drift_exit_code
    from lbctl.status.model import NodeStatus

    status = NodeStatus.from_json(node_status("worker", drift=None, drift_error="no IPVS"))
    assert drift_exit_code(status) == 1
    assert capsys.readouterr().err == "lbctl: drift not known: no IPVS\n"
    assert drift_exit_code(NodeStatus.from_json(node_status("worker", drift=[]))) == 0
    assert drift_exit_code(NodeStatus.from_json(node_status("worker", drift=["+ x"]))) == 2


def test_plan_on_a_balancer_without_ip_vs_loaded_shows_everything_to_add_and_loads_nothing(
        monkeypatch, tmp_path, capsys, no_ip_vs):
    from ipaddress import IPv4Address

    from lbctl.adapters import addrs
    from lbctl.cli import main

    loaded = no_ip_vs
    monkeypatch.setattr(addrs.AddressIp, "list",
                        lambda self: [(IPv4Address("192.168.100.2"), 24, "eth0")])
    assert main(["plan", "examples/pi-single.yaml", "--root", str(tmp_path),
                 "--detailed-exitcode"]) == 2
    shown = capsys.readouterr().out
    assert "balancer lb1 of cluster pi-web:" in shown
    assert "+ service tcp 192.168.100.10:80 scheduler wrr" in shown
    assert loaded == []  # no modprobe: plan changed nothing
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_service_beside_a_drained_worker_is_shown_and_not_drained():
    """A fwmark or IPv6 service lbctl did not make has no key; a node with a
    drain must still show it."""
    from ipaddress import IPv4Address

    from lbctl.adapters.protocols import IpvsDest, IpvsService
    from lbctl.config.model import DestKey, ServiceKey
    from lbctl.status.collect import service_status

    pi1 = IPv4Address("192.168.100.3")
    web = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
    drained = {DestKey(web, pi1, 80)}
    fwmark = IpvsService(None, "fwmark 7", "wlc", 0, (IpvsDest(pi1, 80, 1, 3),))
    ours = IpvsService(web, str(web), "wlc", 0, (IpvsDest(pi1, 80, 0, 3),))
    assert [rs.drained for rs in service_status(fwmark, drained).real_servers] == [False]
    assert [rs.drained for rs in service_status(ours, drained).real_servers] == [True]
    # Keys of foreign services still hash, as any key in a set must.
    assert DestKey(None, pi1, 80) not in drained


def test_status_watch_reads_each_frame_on_one_socket_and_a_failed_read_starts_anew(
        monkeypatch):
    from lbctl.adapters import ipvs, ipvs_wire

    made = []

    class Socket:
        """The socket's side that _with_family uses, counting what it is asked."""

        def __init__(self):
            self.families, self.closed, self.fail = 0, False, False
            made.append(self)

        def family(self, name):
            self.families += 1
            return 42

        def ipvs_table(self, family, stats=True):
            if self.fail:
                raise OSError(errno.EIO, "cut short")
            return []

        def close(self):
            self.closed = True

    monkeypatch.setattr(ipvs_wire, "GenlSocket", Socket)
    watching = ipvs.IpvsNetlink(load_module=False, keep_open=True)
    for _ in range(3):
        assert watching.dump() == []
    assert len(made) == 1 and made[0].families == 1 and not made[0].closed
    made[0].fail = True
    with pytest.raises(OSError):
        watching.dump()
    assert made[0].closed  # its remains are never read as the next frame's
    assert watching.dump() == [] and len(made) == 2
    watching.close()
    assert made[1].closed
    # Any other reader opens a socket for each read and closes it.
    once = ipvs.IpvsNetlink(load_module=False)
    once.dump()
    once.dump()
    assert len(made) == 4 and all(s.closed for s in made)
