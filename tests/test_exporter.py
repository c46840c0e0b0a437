"""lbctl exporter: the metrics only lbctl knows, as Prometheus parses them."""

from ipaddress import IPv4Address

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from helpers import PI_SINGLE, KeepalivedRunning, applied_here, cluster_from
from lbctl.adapters.files import FilesRoot
from lbctl.adapters.protocols import IpvsDest, IpvsService, IpvsSnapshot, SyncDaemon
from lbctl.commands.exporter import parse_listen
from lbctl.config.model import ServiceKey
from lbctl.records.drains import with_drain, write_drains
from lbctl.records.saved import SavedCopies
from lbctl.status.collect import learned_connections
from lbctl.errors import UsageError
from lbctl.status.exporter import LbctlCollector
from lbctl.records.last_apply import record_last_apply

PAIR = PI_SINGLE.replace(
    "  lb1: {address: 192.168.100.2, interface: eth0}\n",
    "  lb1: {address: 192.168.100.2, interface: eth0}\n"
    "  lb2: {address: 192.168.100.5, interface: eth0}\n").replace(
    "scheduler: wrr}", "scheduler: wrr, health: {http: {path: /}}}")
WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)


def state_dir(root, **files):
    folder = root / "run/lbctl/pi-web/state"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_at_", "@")).write_text(text)


def scrape(root, snapshot=None, drift=lambda cluster: 0):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LbctlCollector(str(root), lambda: [cluster_from(PAIR)],
                                     lambda: snapshot, drift))
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_health_drain_weights_vrrp_sync_drift_and_last_apply(tmp_path):
    state_dir(tmp_path, **{"health.web_at_pi1": "up 100.5\n", "health.web_at_pi2": "down 200\n",
                           "vrrp": "MASTER 300\n", "vrrp.transitions": "3\n"})
    write_drains(FilesRoot(str(tmp_path)), "pi-web", with_drain({}, "pi3", "web", 50.0))
    record_last_apply(str(tmp_path), "pi-web", False, "apply: boom", now=400.0)
    table = IpvsSnapshot([IpvsService(WEB, str(WEB), "wrr", 0, (
        IpvsDest(IPv4Address("192.168.100.3"), 80, 1, 3),
        IpvsDest(IPv4Address("192.168.100.4"), 80, 0, 3),
        IpvsDest(IPv4Address("192.168.100.6"), 80, 0, 3)))],
        [SyncDaemon("master", "eth0", 51, "224.0.0.81", 8848)], {})
    with KeepalivedRunning(tmp_path):
        got = scrape(tmp_path, table, drift=lambda cluster: 2)
    web = {"cluster": "pi-web", "service": "web"}
    assert value(got, "lbctl_worker_healthy", **web, worker="pi1") == 1
    assert value(got, "lbctl_worker_healthy", **web, worker="pi2") == 0
    assert value(got, "lbctl_worker_health_since_seconds", **web, worker="pi1") == 100.5
    # pi3 has no check result yet: no health series rather than a made-up one.
    assert value(got, "lbctl_worker_healthy", **web, worker="pi3") is None
    assert value(got, "lbctl_worker_drained", **web, worker="pi3") == 1
    assert value(got, "lbctl_worker_drained", **web, worker="pi1") == 0
    assert value(got, "lbctl_worker_weight_configured", **web, worker="pi3") == 2
    assert value(got, "lbctl_worker_weight_kernel", **web, worker="pi3") == 0
    # dns is not in the kernel's table: its kernel weight is absent, not 0.
    assert value(got, "lbctl_worker_weight_kernel", cluster="pi-web", service="dns",
                 worker="pi1") is None
    assert value(got, "lbctl_vrrp_state", cluster="pi-web", state="MASTER") == 1
    assert value(got, "lbctl_vrrp_state", cluster="pi-web", state="BACKUP") == 0
    assert value(got, "lbctl_vrrp_transitions_total", cluster="pi-web") == 3
    assert value(got, "lbctl_sync_daemon_running", role="master", interface="eth0") == 1
    assert value(got, "lbctl_drift_changes", cluster="pi-web") == 2
    assert value(got, "lbctl_last_apply_timestamp_seconds", cluster="pi-web") == 400
    assert value(got, "lbctl_last_apply_success", cluster="pi-web") == 0


def test_a_keepalived_killed_as_master_is_in_no_role(tmp_path):
    # A kill runs no notify hook: the record still says MASTER.
    state_dir(tmp_path, vrrp="MASTER 300\n")
    with KeepalivedRunning(tmp_path):
        assert value(scrape(tmp_path), "lbctl_vrrp_state", cluster="pi-web", state="MASTER") == 1
    got = scrape(tmp_path)
    assert value(got, "lbctl_vrrp_state", cluster="pi-web", state="MASTER") == 0
    assert value(got, "lbctl_vrrp_state", cluster="pi-web", state="STOP") == 1
    assert value(got, "lbctl_vrrp_state_since_seconds", cluster="pi-web") is None


def test_a_damaged_drain_record_shows(tmp_path):
    path = tmp_path / "var/lib/lbctl/drained/pi-web.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "drained": {"pi2": {"services": "web", "since": 1}}}')
    got = scrape(tmp_path)
    assert value(got, "lbctl_drain_record_ok", cluster="pi-web") == 0
    path.write_text('{"format": 1, "drained": {"pi2": {"services": ["web"], "since": 1}}}')
    got = scrape(tmp_path)
    assert value(got, "lbctl_drain_record_ok", cluster="pi-web") == 1
    assert value(got, "lbctl_worker_drained", cluster="pi-web", service="web", worker="pi2") == 1


def test_unknown_drift_and_no_apply_since_boot_are_absent(tmp_path):
    got = scrape(tmp_path, None, drift=lambda cluster: None)
    assert value(got, "lbctl_drift_changes", cluster="pi-web") is None
    assert value(got, "lbctl_last_apply_success", cluster="pi-web") is None
    assert value(got, "lbctl_vrrp_state", cluster="pi-web", state="MASTER") is None


@pytest.mark.parametrize("text", ["9588", "localhost:9588", "127.0.0.1:0", "[::1]:9588",
                                  "127.0.0.1:99999"])
def test_listen_must_be_an_ipv4_address_and_a_port(text):
    with pytest.raises(UsageError, match="not ADDRESS:PORT"):
        parse_listen(text)


def test_listen_takes_an_address_and_port():
    assert parse_listen("0.0.0.0:9588") == ("0.0.0.0", 9588)


SYNC_HEADER = "Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Origin Expires\n"


def _learned_rows(count):
    return "".join(f"TCP C0A86414 {0xD000 + n:04X} C0A8640A 0050 C0A86403 0050 ESTABLISHED "
                   "SYNC       895\n" for n in range(count))


BACKUP_DAEMON = SyncDaemon("backup", "eth0", 51, "224.0.0.81", 8848)


def _learned_scrapes(root, table, now, seconds_per_count, daemons):
    """scrape(): the learned-count lines of an exporter whose clock reads
    now[0], and whose every count of `table` takes `seconds_per_count`."""
    def count():
        now[0] += seconds_per_count
        return learned_connections(str(table))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LbctlCollector(str(root), lambda: [cluster_from(PAIR)],
                                     lambda: IpvsSnapshot([], daemons, {}), lambda c: 0,
                                     clock=lambda: now[0], learned=count))

    def scrape():
        text = generate_latest(registry).decode()
        return [line for line in text.splitlines()
                if line.startswith("lbctl_sync_learned_connections ")]
    return scrape


def test_the_learned_count_is_kept_twenty_times_as_long_as_it_took(tmp_path):
    # Counting reads the kernel's whole connection table: a big one takes a
    # Pi a while, and Prometheus may scrape often.  Here each count takes 0.5 s.
    table = tmp_path / "ip_vs_conn_sync"
    table.write_text(SYNC_HEADER + _learned_rows(3))
    now = [1000.0]
    learned = _learned_scrapes(tmp_path, table, now, 0.5, [BACKUP_DAEMON])
    assert learned() == ["lbctl_sync_learned_connections 3.0"]
    table.write_text(SYNC_HEADER + _learned_rows(5))
    now[0] = 1010.4  # the count ended at 1000.5, and is kept for 20 x 0.5 s
    assert learned() == ["lbctl_sync_learned_connections 3.0"]
    now[0] = 1010.5
    assert learned() == ["lbctl_sync_learned_connections 5.0"]


def test_the_learned_count_is_made_again_after_a_failover_and_at_least_every_30s(tmp_path):
    table = tmp_path / "ip_vs_conn_sync"
    table.write_text(SYNC_HEADER + _learned_rows(3))
    state_dir(tmp_path, vrrp="BACKUP 200\n")
    now = [1000.0]
    daemons = [BACKUP_DAEMON]
    # A huge table: 20 times what a count takes would be minutes.
    learned = _learned_scrapes(tmp_path, table, now, 10, daemons)
    assert learned() == ["lbctl_sync_learned_connections 3.0"]
    table.write_text(SYNC_HEADER + _learned_rows(5))
    now[0] += 29.9
    assert learned() == ["lbctl_sync_learned_connections 3.0"]
    now[0] += 0.1
    assert learned() == ["lbctl_sync_learned_connections 5.0"]
    # The balancer becomes master: what it learned as backup it now serves.
    table.write_text(SYNC_HEADER + _learned_rows(1))
    state_dir(tmp_path, vrrp="MASTER 300\n")
    assert learned() == ["lbctl_sync_learned_connections 1.0"]
    # And a sync daemon that starts or stops.
    table.write_text(SYNC_HEADER + _learned_rows(2))
    daemons.append(SyncDaemon("master", "eth0", 51, "224.0.0.81", 8848))
    assert learned() == ["lbctl_sync_learned_connections 2.0"]
    # Backup and master again between two scrapes: the role is as it was,
    # not the count.
    table.write_text(SYNC_HEADER + _learned_rows(4))
    state_dir(tmp_path, vrrp="MASTER 400\n")
    assert learned() == ["lbctl_sync_learned_connections 4.0"]


def test_the_saved_copies_are_validated_again_only_once_an_apply_changed_them(tmp_path):
    clusters = SavedCopies(str(tmp_path))
    applied_here(tmp_path, PAIR)
    (first,) = clusters()
    assert clusters() == [first] and clusters()[0] is first  # not read and validated again
    # An apply writes a new copy and renames it into place.
    applied_here(tmp_path, PAIR.replace("  pi3: {address: 192.168.100.6, weight: 2}\n", ""))
    (second,) = clusters()
    assert sorted(second.workers) == ["pi1", "pi2"] and sorted(first.workers) == [
        "pi1", "pi2", "pi3"]
    assert clusters()[0] is second
    # One that no longer loads is left out, and shows again once mended.
    copy = tmp_path / "etc/lbctl/pi-web.yaml"
    copy.write_text("cluster: [\n")
    assert clusters() == []
    applied_here(tmp_path, PAIR)
    (mended,) = clusters()
    assert sorted(mended.workers) == ["pi1", "pi2", "pi3"]


def test_a_saved_copy_removed_while_it_is_read_is_left_out(tmp_path, monkeypatch):
    # apply --remove deletes the copy between the listing and the read.
    from lbctl.records import saved

    clusters = SavedCopies(str(tmp_path))
    applied_here(tmp_path, PAIR)
    listed = saved.os.path.exists
    copy = tmp_path / "etc/lbctl/pi-web.yaml"

    def exists_then_removed(path):
        found = listed(path)
        if found and path == str(copy):
            copy.unlink()
        return found
    monkeypatch.setattr(saved.os.path, "exists", exists_then_removed)
    assert clusters() == []


def test_drift_is_kept_a_while_but_made_again_at_once_after_an_apply(tmp_path):
    now, asked = [1000.0], []
    found = {"pending": 3}

    def drift(cluster):
        asked.append(now[0])
        return found["pending"]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LbctlCollector(str(tmp_path), lambda: [cluster_from(PAIR)], lambda: None,
                                     drift, clock=lambda: now[0], drift_every=30))

    def drift_metric():
        text = generate_latest(registry).decode()
        return [line for line in text.splitlines() if line.startswith("lbctl_drift_changes")]
    assert drift_metric() == ['lbctl_drift_changes{cluster="pi-web"} 3.0']
    found["pending"] = 0  # an apply that nobody recorded (or a hand fix): seen later
    now[0] += 10
    assert drift_metric() == ['lbctl_drift_changes{cluster="pi-web"} 3.0']
    record_last_apply(str(tmp_path), "pi-web", True, "", now=now[0])
    assert drift_metric() == ['lbctl_drift_changes{cluster="pi-web"} 0.0']  # at once
    found["pending"] = 1  # a hand change: seen within drift_every
    now[0] += 29
    assert drift_metric() == ['lbctl_drift_changes{cluster="pi-web"} 0.0']
    now[0] += 1
    assert drift_metric() == ['lbctl_drift_changes{cluster="pi-web"} 1.0']
    assert asked == [1000.0, 1010.0, 1040.0]


def test_the_grafana_dashboard_asks_only_for_series_the_exporter_serves(tmp_path):
    """docs/grafana-lbctl.json: valid JSON, and every lbctl metric and label its
    queries name is one a scrape gives, so no panel stays empty for a typo."""
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parent.parent / "docs" /
                            "grafana-lbctl.json").read_text())
    state_dir(tmp_path, **{"health.web_at_pi1": "up 100.5\n", "vrrp": "MASTER 300\n",
                           "vrrp.transitions": "3\n"})
    table = IpvsSnapshot([IpvsService(WEB, str(WEB), "wrr", 0, (
        IpvsDest(IPv4Address("192.168.100.3"), 80, 1, 3),))], [], {})
    served = {}
    for name, labels in scrape(tmp_path, table):
        served.setdefault(name, set()).update(k for k, _v in labels)
    queries = [dashboard["templating"]["list"][0]["query"]] + [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(queries) >= 6 and all(p.get("datasource", {}).get("type") == "prometheus"
                                     for p in dashboard["panels"])
    asked = 0
    for query in queries:
        for name, selector in re.findall(r"\b(lbctl_[a-z_]+)(?:\{([^}]*)\})?", query):
            asked += 1
            assert name in served, f"{name} in {query!r} is not served"
            labels = set(re.findall(r"(\w+)\s*=", selector or ""))
            assert labels <= served[name], f"{query!r}: {labels - served[name]} not on {name}"
        assert "node_ipvs_" in query or "lbctl_" in query
    assert asked >= 7


def test_a_pair_made_one_balancer_shows_no_vrrp_role_left_from_the_pair(tmp_path):
    # keepalived runs a single balancer with checks but no VRRP instance; the
    # "vrrp" file its hook wrote while a pair stays behind.
    state_dir(tmp_path, **{"vrrp": "FAULT 300\n", "health.web_at_pi1": "up 100\n"})
    single = PAIR.replace("  lb2: {address: 192.168.100.5, interface: eth0}\n", "")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LbctlCollector(str(tmp_path), lambda: [cluster_from(single)],
                                     lambda: None, lambda cluster: 0))
    text = generate_latest(registry).decode()
    assert "lbctl_vrrp_state{" not in text
    assert 'lbctl_worker_healthy{cluster="pi-web",service="web",worker="pi1"} 1.0' in text


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"),
                                     RuntimeError("unexpected")])
def test_an_apply_that_fails_with_any_error_is_recorded_as_failed(tmp_path, monkeypatch, failure):
    from types import SimpleNamespace

    from lbctl.commands import apply
    from lbctl.records.last_apply import read_last_apply

    path = tmp_path / "pi-web.yaml"
    path.write_text(PI_SINGLE)

    def failing(args, out, cluster, reached):
        reached["role"] = "balancer"
        raise failure
    monkeypatch.setattr(apply, "_apply", failing)
    args = SimpleNamespace(file=str(path), root=str(tmp_path), remove=False)
    record_last_apply(str(tmp_path), "pi-web", True, now=1.0)
    with pytest.raises(type(failure)):
        apply.run(args, None)
    found = read_last_apply(str(tmp_path), "pi-web")
    assert found["ok"] is False and str(failure) in found["error"], found


def test_the_server_answers_one_scrape_at_a_time_and_a_burst_shares_one_collection(
        monkeypatch):
    """A scrape flood (mode ecmp: VIP:PORT reachable from anywhere, were the
    file to say public) queues instead of starting a thread and a collection
    per request; a client that sends nothing is dropped."""
    import socket
    import threading
    import time
    import urllib.request

    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import CollectorRegistry

    from lbctl.commands import exporter

    class Counting:
        collections = 0

        def collect(self):
            Counting.collections += 1
            time.sleep(0.5)  # a collection that takes a while, as on a Pi
            yield GaugeMetricFamily("lbctl_test", "a test gauge", value=1)

    monkeypatch.setattr(exporter, "CLIENT_SECONDS", 0.5)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter.Reused(Counting()))
    server = exporter.serve("127.0.0.1", 0, registry)
    port = server.server_address[1]
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        silent = socket.create_connection(("127.0.0.1", port))  # says nothing
        trickle = socket.create_connection(("127.0.0.1", port))  # a byte now and then
        trickling = threading.Event()

        def trickle_on():  # a header that never ends, a byte each 0.2 s
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                if trickling.wait(0.2):
                    return
                try:
                    trickle.send(bytes([byte]))
                except OSError:
                    return
        threading.Thread(target=trickle_on, daemon=True).start()
        answers = []

        def scrape():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as got:
                answers.append((got.status, got.read().decode()))
        scrapers = [threading.Thread(target=scrape) for _ in range(5)]
        for t in scrapers:
            t.start()
        for t in scrapers:
            t.join(30)
        assert [status for status, _ in answers] == [200] * 5
        assert all("lbctl_test 1.0" in text for _, text in answers)
        assert Counting.collections == 1
        assert threading.active_count() < 10  # no thread per request
        trickling.set()
        silent.close()
        trickle.close()
    finally:
        server.shutdown()
        server.server_close()


def test_reused_shares_a_collection_only_for_as_long_as_it_took():
    from lbctl.commands.exporter import Reused

    now = [100.0]

    class Counting:
        def __init__(self):
            self.n = 0

        def collect(self):
            self.n += 1
            now[0] += 1.0  # each collection takes a second
            return [self.n]

    reused = Reused(Counting(), clock=lambda: now[0])
    assert list(reused.collect()) == [1]
    now[0] += 0.5
    assert list(reused.collect()) == [1]  # within the second it took: shared
    now[0] += 1.0
    assert list(reused.collect()) == [2]  # a scrape seconds later: a new one
