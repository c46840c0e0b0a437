"""tcp, udp and exec health checks: defaults, which checker runs them, and the probe itself."""

import os
import shutil
import socket
import subprocess
import threading
from ipaddress import IPv4Address

import pytest

from helpers import PI_SINGLE, cluster_from, keepalived_findings, keepalived_test
from lbctl.adapters.protocols import IpvsDest, IpvsService
from lbctl.config.model import ServiceKey
from lbctl.errors import ConfigError
from lbctl.status.health import Reported, ipvs_drift, wait_for_ipvs
from lbctl.render.keepalived import (
    render_keepalived_conf, script_text,
)
from lbctl.layout import Layout


def with_health(web=None, dns=None):
    text = PI_SINGLE
    if web:
        text = text.replace("scheduler: wrr}", f"scheduler: wrr, health: {web}}}")
    if dns:
        text = text.replace("scheduler: rr,", f"scheduler: rr, health: {dns},")
    return text


def render(text):
    cluster = cluster_from(text)
    return render_keepalived_conf(cluster, "lb1", "eth0", Layout(cluster.name))


def server_block(conf, address, port):
    return conf.split(f"real_server {address} {port} {{")[1].split("real_server")[0]


# Defaults and the fast profile

def test_defaults_survive_one_slow_reply_and_fast_is_one_key_away():
    steady = cluster_from(with_health(web="{tcp: {}}")).services["web"].health
    assert (steady.interval, steady.timeout, steady.retries, steady.rise) == (2.0, 1.0, 2, 2)
    fast = cluster_from(with_health(web="{tcp: {}, profile: fast}")).services["web"].health
    assert (fast.interval, fast.timeout, fast.retries, fast.rise) == (1.0, 0.5, 1, 2)
    # Explicit keys still win over the profile.
    mixed = cluster_from(with_health(web="{tcp: {}, profile: fast, retries: 3}"))
    assert mixed.services["web"].health.retries == 3


def test_a_failed_server_is_set_to_weight_0_not_deleted():
    conf = render(with_health(web="{http: {path: /}}", dns="{udp: {}}"))
    for address, port in (("192.168.100.3", 80), ("192.168.100.3", 53)):
        assert "inhibit_on_failure" in server_block(conf, address, port)
    # A pair without checks has nothing to inhibit.
    assert "inhibit_on_failure" not in render(PI_SINGLE.replace(
        "  lb1: {address: 192.168.100.2, interface: eth0}\n",
        "  lb1: {address: 192.168.100.2, interface: eth0}\n"
        "  lb2: {address: 192.168.100.5, interface: eth0}\n"))


def test_timeout_longer_than_interval_is_refused_where_it_is_written():
    with pytest.raises(ConfigError) as e:
        cluster_from(with_health(web="{tcp: {}, interval: 1s, timeout: 2s}"))
    assert "cluster.yaml:9:97:" in str(e.value)
    assert "timeout 2s is longer than the interval 1s" in str(e.value)
    # The default timeout (1s) against a shorter interval is reported at the interval.
    with pytest.raises(ConfigError, match="timeout 1s is longer than the interval 0.5s"):
        cluster_from(with_health(web="{tcp: {}, interval: 500ms}"))


# Which checker runs a check

def test_rise_1_tcp_runs_in_keepalived_with_retries_as_retry():
    conf = render(with_health(web="{tcp: {}, rise: 1, retries: 3, interval: 2s, timeout: 1s}"))
    block = server_block(conf, "192.168.100.3", 80)
    assert "TCP_CHECK {" in block and "MISC_CHECK" not in block
    # keepalived marks a server down after retry + 1 failures in a row.
    assert "retry 2\n" in block and "delay_before_retry 2.0\n" in block
    assert "connect_timeout 1.0\n" in block


def test_rise_1_udp_runs_in_keepalived_with_payload_and_required_reply():
    conf = render(with_health(dns="{udp: {payload: ff00, reply: 0A}, rise: 1}"))
    block = server_block(conf, "192.168.100.3", 53)
    assert "UDP_CHECK {" in block and "MISC_CHECK" not in block
    assert "payload ff00\n" in block and "require_reply 0a\n" in block
    # keepalived compares only the bytes that arrived: without a minimum, an
    # empty or cut-short reply passes.  Its default maximum (255 bytes) would
    # fail a long DNS answer.
    assert "min_reply_length 1\n" in block and "max_reply_length 65535\n" in block
    longer = server_block(render(with_health(dns="{udp: {payload: ff00, reply: '736572766564'}, "
                                                 "rise: 1}")), "192.168.100.3", 53)
    assert "min_reply_length 6\n" in longer
    silent_ok = server_block(render(with_health(dns="{udp: {}, rise: 1}")), "192.168.100.3", 53)
    assert "UDP_CHECK {" in silent_ok and "require_reply" not in silent_ok


def test_rise_above_1_and_exec_keep_the_damping_script():
    for web in ("{tcp: {}}", "{exec: {command: [/bin/true]}, rise: 1}"):
        block = server_block(render(with_health(web=web)), "192.168.100.3", 80)
        assert "MISC_CHECK {" in block and "TCP_CHECK" not in block


@pytest.mark.parametrize("timing, kill_after", [
    ("interval: 500ms, timeout: 500ms", 3),  # a short interval still leaves 2 s for a stall
    ("interval: 4s, timeout: 3s", 7),  # a long one leaves a whole interval
])
def test_keepalived_kills_a_scripted_probe_only_well_past_its_timeout(timing, kill_after):
    # keepalived's kill counts as a failure at once, past the script's damping:
    # a Pi that stalls bash for a moment must not fail a healthy worker.
    block = server_block(render(with_health(web=f"{{tcp: {{}}, {timing}}}")), "192.168.100.3", 80)
    assert f"misc_timeout {kill_after}\n" in block


@pytest.mark.parametrize("dns, found", [
    ("{udp: {payload: 'zz'}, rise: 1}", "'zz' is not usable"),
    ("{udp: {payload: '0a 0b'}, rise: 1}", "'0a 0b' is not usable"),
    ("{udp: {reply: abc}, rise: 1}", "'abc' is not usable"),
    ("{udp: {payload: 00ff}, rise: 1}", "'00ff' ends in the byte ff"),
    ("{udp: {reply: 0a}}", "a udp check with a reply needs rise 1"),
    ("{udp: {}, profile: quick}", "unknown profile 'quick'; use steady or fast"),
    ("{udp: {}, profile: [fast]}", "unknown profile \\['fast'\\]"),
])
def test_bad_udp_and_profile_values_are_refused(dns, found):
    with pytest.raises(ConfigError, match=found):
        cluster_from(with_health(dns=dns))


@pytest.mark.skipif(not os.access("/usr/sbin/keepalived", os.X_OK), reason="needs keepalived")
def test_keepalived_accepts_the_rendered_checks(tmp_path):
    text = with_health(web="{tcp: {}, rise: 1}", dns="{udp: {payload: ff00, reply: 0a}, rise: 1}")
    conf, findings = keepalived_findings(tmp_path, text)
    assert findings == []
    # The same test names a value keepalived does not know.
    assert any("fastest" in line for line in
               keepalived_test(tmp_path, conf.replace("lvs_sched wrr", "lvs_sched fastest")))


# Drift with inhibit_on_failure

def test_a_down_server_at_weight_0_is_not_drift_but_one_taking_traffic_is():
    cluster = cluster_from(with_health(web="{tcp: {}}"))
    reported = {f"health.web@{w}": Reported("up", 1.0) for w in ("pi1", "pi3")}
    reported["health.web@pi2"] = Reported("down", 2.0)
    assert ipvs_drift(cluster, reported, _web_table(0)) == ([], [])
    assert ipvs_drift(cluster, reported, _web_table(1))[0] == [
        "service web: worker pi2 (192.168.100.4:80) is down but still takes traffic in IPVS "
        "(weight 1)"]


def _web_table(pi2_weight):
    dests = tuple(IpvsDest(IPv4Address(a), 80, w, 3) for a, w in
                  (("192.168.100.3", 1), ("192.168.100.4", pi2_weight), ("192.168.100.6", 2)))
    dns = IpvsService(ServiceKey("udp", IPv4Address("192.168.100.11"), 53), "udp", "rr", 0,
                      tuple(IpvsDest(IPv4Address(a), 53, 1, 3)
                            for a in ("192.168.100.3", "192.168.100.4")))
    return [IpvsService(ServiceKey("tcp", IPv4Address("192.168.100.10"), 80), "tcp", "wrr",
                        0, dests), dns]


def _hook_files(state_dir, pi2):
    for worker, state in (("pi1", "up"), ("pi2", pi2), ("pi3", "up")):
        (state_dir / f"health.web@{worker}").write_text(f"{state} 1.0\n")


def _no_clock():
    ticks = iter(range(1000))
    return lambda: next(ticks)


def test_apply_does_not_report_a_check_whose_notify_hook_is_still_running(tmp_path):
    # keepalived put pi2 back at weight 1; its "up" hook writes a moment later.
    cluster = cluster_from(with_health(web="{tcp: {}}"))
    _hook_files(tmp_path, pi2="down")
    problems, unchecked, reported = wait_for_ipvs(
        cluster, tmp_path, lambda: _web_table(1), timeout=0, clock=_no_clock(),
        sleep=lambda _: _hook_files(tmp_path, pi2="up"))
    assert (problems, unchecked) == ([], [])
    assert reported["health.web@pi2"].state == "up"


def test_apply_reports_a_mismatch_that_is_still_there_a_second_later(tmp_path):
    cluster = cluster_from(with_health(web="{tcp: {}}"))
    _hook_files(tmp_path, pi2="down")
    slept = []
    problems, _, _ = wait_for_ipvs(cluster, tmp_path, lambda: _web_table(1), timeout=0,
                                   clock=_no_clock(), sleep=slept.append)
    assert problems == ["service web: worker pi2 (192.168.100.4:80) is down but still takes "
                        "traffic in IPVS (weight 1)"]
    assert slept == [1.0]


# The damping script's probes, for real, against local services

@pytest.fixture
def check(tmp_path):
    script = tmp_path / "lbctl-check"
    script.write_text(script_text("lbctl-check"))
    script.chmod(0o755)

    def run(kind, port, timeout="0.5"):
        state = tmp_path / f"check.{kind}{port}"
        state.unlink(missing_ok=True)
        return subprocess.run([str(script), str(state), "1", "1", timeout, kind, "127.0.0.1",
                               str(port)], check=False).returncode == 0
    return run


def free_port(kind):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def udp_service():
    """(port of a socket that answers, port of one that reads and never replies)."""
    answering = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for s in (answering, silent):
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            for s, reply in ((answering, True), (silent, False)):
                try:
                    data, peer = s.recvfrom(512)
                except OSError:
                    continue
                if reply:
                    s.sendto(b"ok\n", peer)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield answering.getsockname()[1], silent.getsockname()[1]
    stop.set()
    thread.join()
    answering.close()
    silent.close()


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils")
def test_udp_probe_passes_a_reply_and_silence_and_fails_nothing_listening(check, udp_service):
    answering, silent = udp_service
    assert check("udp", answering)
    # The read waits the whole timeout and silence counts as alive.
    assert check("udp", silent, timeout="1")
    assert not check("udp", free_port(socket.SOCK_DGRAM))


def test_tcp_probe_passes_a_listener_and_fails_a_closed_port(check):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        assert check("tcp", listener.getsockname()[1])
    assert not check("tcp", free_port(socket.SOCK_STREAM))
