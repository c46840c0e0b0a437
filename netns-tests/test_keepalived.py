"""The keepalived engine in the lab: health checks, failover, connection survival,
split brain and live changes, with real keepalived, IPVS, web servers and clients.

Timings are printed (run pytest with -s to see them) rather than asserted:
the lab may run emulated, and docs/keepalived.md reports the measured figures.
Loads that must lose nothing give each request 5 s, as a browser would give
far more; loads that measure a gap use 0.5 s, so a lost request shows.
"""

import hashlib
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ipvs_table
from clusters import DNS_VIP, PAIR, WEB_VIP, edited, pair_edited
from conftest import measured as report
from lbctl.errors import LabError
from lbctl.lab.traffic import failed_client_port, summarize

WEB_HEALTH = PAIR["services"]["web"]["health"]
DETECTION = 1.0 + 0.5  # interval + timeout of the web check in PAIR


ALL_WEB = {"192.168.100.3", "192.168.100.4", "192.168.100.6"}
ALL_WORKERS = ("pi1", "pi2", "pi3")


@pytest.fixture
def pair(lab):
    for worker in ALL_WORKERS:
        lab.ensure_web_server(worker)
    path = lab.reset(PAIR, "pair")
    lab.wait_for_roles()
    # A worker an earlier test took out comes back only after `rise` checks.
    lab.wait_for(lambda: ipvs_web_serving(lab, "lb1") == ipvs_web_serving(lab, "lb2") == ALL_WEB,
                 what="every web worker in both tables")
    return path


def ipvs_web_weights(lab, node="lb1"):
    """{"ADDRESS:PORT": weight} of the web service's real servers on a balancer."""
    rows = ipvs_table.service(ipvs_table.on(lab, node), WEB_VIP, 80) or {}
    return {address: row.weight for address, row in rows.items()}


def ipvs_web_dests(lab, node="lb1"):
    return {dest.rsplit(":", 1)[0] for dest in ipvs_web_weights(lab, node)}


def ipvs_web_serving(lab, node="lb1"):
    """Real servers that take new connections: a failed check leaves its
    server at weight 0 (inhibit_on_failure) rather than deleting it."""
    return {dest.rsplit(":", 1)[0] for dest, weight in ipvs_web_weights(lab, node).items()
            if weight != 0}


def client_neigh_mac(lab, vip=WEB_VIP):
    return lab.cached_mac(vip)


def sync_report(lab, node, cluster_file):
    import json

    result = lab.lbctl(node, "status", str(cluster_file), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["sync"]


def web_connections_held(lab, node):
    import json

    report = json.loads(lab.lbctl(node, "status", "--json").stdout)
    return sum(d["active"] for s in report["services"] if s["service"] == f"tcp {WEB_VIP}:80"
               for d in s["real_servers"])


def test_the_backup_shows_connections_it_learned_and_warns_when_sync_multicast_is_filtered(
        lab, pair):
    holders = []
    try:
        # Filtered first: lb2 must reach an empty learned table on its own, and
        # only what it learned in earlier tests (at most a FIN_WAIT timeout) expires.
        # This test comes first in the file, before the pair tests' own traffic,
        # so there is little left to wait for.
        lab.block_sync("lb2")
        started = time.time()
        lab.wait_for(lambda: sync_report(lab, "lb2", pair)["learned_connections"] == 0,
                     timeout=300, what="lb2 to hold no connections learned earlier")
        report("sync test: learned connections expired on lb2", after=f"{time.time() - started:.1f}s")
        holders.append(lab.hold_connections(WEB_VIP, 80, 8, 180))
        lab.wait_for(lambda: web_connections_held(lab, "lb1") >= 8, what="lb1 holding 8 connections")
        time.sleep(3)  # the master daemon sends at least once a second
        status = lab.lbctl("lb2", "status", str(pair)).stdout
        assert status.splitlines()[0] == "lbctl status: cluster lab, node lb2 (balancer)", status
        assert "backup daemon on eth0" in status and "group 224.0.0.81 port 8848" in status, status
        assert "connections learned from the peer: 0" in status, status
        assert "WARNING: this balancer is VRRP BACKUP and holds no connections learned" in status
        assert "224.0.0.81 UDP port 8848 is being filtered between the balancers" in status
        assert sync_report(lab, "lb2", pair)["warning"]

        lab.block_sync("lb2", blocked=False)
        holders.append(lab.hold_connections(WEB_VIP, 80, 8, 180))
        try:
            lab.wait_for(lambda: sync_report(lab, "lb2", pair)["learned_connections"] >= 8,
                         what="lb2 to learn the new connections")
        except LabError:
            table = lab.sh("lb2", ["cat", "/proc/net/ip_vs_conn_sync"], check=False).stdout
            raise AssertionError(f"lb2 learned too few connections:\n{table}") from None
        status = lab.lbctl("lb2", "status", str(pair)).stdout
        learned = sync_report(lab, "lb2", pair)
        assert {d["role"] for d in learned["daemons"]} == {"master", "backup"}, learned
        assert learned["warning"] is None, learned
        assert "WARNING" not in status, status
        assert "connections learned from the peer: " in status
        assert int(status.split("connections learned from the peer: ")[1].split()[0]) >= 8
    finally:
        lab.block_sync("lb2", blocked=False)
        for holder in holders:
            holder.kill()
            holder.wait()


def test_a_pair_shares_one_table_and_a_reapply_leaves_keepalived_alone(lab, pair):
    assert lab.ipvs_rules("lb1") == lab.ipvs_rules("lb2")
    assert ipvs_web_serving(lab) == ALL_WEB
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(WEB_VIP) == {lab.mac("lb1")}
    assert set(lab.ask_web(6)) <= {"served by pi1", "served by pi2", "served by pi3"}
    pids = lab.keepalived_pids("lb1")
    # The log is shared with earlier tests in this lab; only what the reapply
    # adds to it counts.
    log_path = lab.path("lb1", "log_file")
    log_before = os.path.getsize(log_path)
    again = lab.lbctl("lb1", "apply", str(pair))
    assert again.returncode == 0, again.stderr
    assert "no changes" in again.stdout and "IPVS matches" in again.stdout
    assert lab.keepalived_pids("lb1") == pids
    with open(log_path) as log:
        log.seek(log_before)
        assert "Reloading" not in log.read()
    status = lab.lbctl("lb1", "status").stdout
    assert "keepalived for cluster lab: VRRP MASTER" in status
    assert "health web/pi1: up" in status
    # Nothing lbctl, keepalived or the hooks wrote is writable by other users.
    root = Path(lab.nodes["lb1"].root)
    writable = [str(p) for p in root.rglob("*")
                if not p.is_symlink() and p.stat().st_mode & stat.S_IWOTH]
    assert writable == []


def test_a_config_written_without_its_reload_is_loaded_by_the_next_apply(lab, pair):
    reweighted = lab.write("pair-pi3-weight-5", pair_edited(
        workers=lambda w: {**w, "pi3": {**w["pi3"], "weight": 5}}))
    conf = Path(lab.path("lb1", "conf"))
    # An apply of `reweighted` killed after it wrote the files and before
    # keepalived reloaded them: the new files on disk, the old ones running.
    assert lab.lbctl("lb1", "apply", str(reweighted)).returncode == 0
    written = conf.read_text()
    assert lab.lbctl("lb1", "apply", str(pair)).returncode == 0
    assert ipvs_web_weights(lab)["192.168.100.6:80"] == 2
    conf.write_text(written)
    again = lab.lbctl("lb1", "apply", str(reweighted))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reload" in again.stdout and "not known to run the files on disk" in again.stdout, \
        again.stdout
    lab.wait_for(lambda: ipvs_web_weights(lab)["192.168.100.6:80"] == 5, timeout=10,
                 what="pi3's new weight in lb1's table")
    assert lab.lbctl("lb1", "plan", str(reweighted), "--detailed-exitcode").returncode == 0


KEEPALIVED_CONSOLE_TIME = re.compile(r"^(\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}): ")


def _logged_at(line):
    """When keepalived logged `line` (its console log has whole seconds)."""
    return time.mktime(time.strptime(KEEPALIVED_CONSOLE_TIME.match(line)[1],
                                     "%a %b %d %H:%M:%S %Y"))


def test_a_new_weight_reaches_the_kernel_as_keepalived_reloads(lab, pair):
    """keepalived carries a real server's weight over a reload, then writes
    the new one as the reload ends (not at a later check, which with a
    steady-passing check would be never): it is in the kernel when apply
    returns, and keepalived's log changes it in the second of its reload."""
    reweighted = lab.write("pair-pi3-weight-5", pair_edited(
        workers=lambda w: {**w, "pi3": {**w["pi3"], "weight": 5}}))
    log_path = lab.path("lb1", "log_file")
    log_before = os.path.getsize(log_path)
    started = time.monotonic()
    applied = lab.lbctl("lb1", "apply", str(reweighted))
    took = time.monotonic() - started
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert ipvs_web_weights(lab)["192.168.100.6:80"] == 5
    with open(log_path) as log:
        log.seek(log_before)
        lines = log.read().splitlines()
    reloads = [line for line in lines if "Reloading" in line]
    changes = [line for line in lines if "Changing weight from 2 to 5" in line]
    assert reloads and len(changes) == 1, "\n".join(lines)
    after_reload = _logged_at(changes[0]) - _logged_at(reloads[0])
    report("weight change under keepalived", apply_seconds=f"{took:.1f}",
           logged_after_reload=f"{after_reload:g}s")
    # Whole seconds, from the first "Reloading" line of keepalived's
    # processes: a reload on busy emulated CPUs may straddle two.
    assert 0 <= after_reload <= 2, "\n".join(lines)


def test_a_dead_worker_leaves_within_the_detection_time_and_returns_after_rise(lab, pair):
    try:
        _dead_worker_leaves_and_returns(lab)
    finally:
        lab.ensure_web_server("pi2")  # whatever failed, the next test gets pi2 back


def _dead_worker_leaves_and_returns(lab):
    httpd = lab.web_server("pi2")
    load = lab.traffic("load", WEB_VIP, "--seconds", 12, "--interval", 0.05, "--timeout", 0.5)
    time.sleep(2)
    stopped = time.time()
    httpd.terminate()
    httpd.wait()
    lab.wait_for(lambda: "192.168.100.4" not in ipvs_web_serving(lab), timeout=15,
                 what="pi2 to leave IPVS")
    removed = time.time()
    # The backup checks on its own schedule: it follows within one more detection time.
    lab.wait_for(lambda: "192.168.100.4" not in ipvs_web_serving(lab, "lb2"),
                 timeout=DETECTION + 5, what="pi2 to leave lb2's IPVS too")
    records = lab.finish(load)
    after = [r for r in records if r[0] > removed]
    report("health: worker stopped", removed_after=f"{removed - stopped:.2f}s",
           configured_detection=f"{DETECTION}s",
           failed_before_removal=sum(not r[2] for r in records if r[0] <= removed),
           requests_after=len(after))
    # Once removed, no request reaches the dead worker: every later one succeeds.
    assert after and all(ok for _, _, ok, _ in after), [r for r in after if not r[2]]
    status = lab.lbctl("lb1", "status").stdout
    assert "health web/pi2: down" in status

    restarted = time.time()
    lab.ensure_web_server("pi2")
    lab.wait_for(lambda: "192.168.100.4" in ipvs_web_serving(lab), timeout=30,
                 what="pi2 to return")
    back = time.time() - restarted
    report("health: worker restarted", back_after=f"{back:.2f}s", rise=WEB_HEALTH["rise"])
    # Flapping is damped: it takes `rise` passed checks, one interval apart.
    assert back >= (WEB_HEALTH["rise"] - 1) * 1.0


def test_a_crashed_master_hands_the_vip_to_the_backup(lab, pair):
    assert client_neigh_mac(lab) in (None, lab.mac("lb1"))
    lab.ask_web(1)
    load = lab.traffic("load", WEB_VIP, "--seconds", 6, "--interval", 0.05, "--timeout", 0.5)
    time.sleep(2)
    crashed = time.time()  # SIGKILL lands at once; the wait for exit follows
    lab.kill_keepalived("lb1", signal.SIGKILL)
    lab.wait_for(lambda: client_neigh_mac(lab) == lab.mac("lb2"), timeout=10,
                 what="the client to reach the VIP at lb2")
    moved = time.time() - crashed
    summary = summarize(lab.finish(load), crashed)
    report("failover: master keepalived killed", vip_on_backup_after=f"{moved:.2f}s",
           failed=f"{summary['failed']}/{summary['requests']}")
    assert lab.vrrp_state("lb2") == "MASTER"
    # The crashed balancer comes back with the next apply, and takes over again.
    again = lab.lbctl("lb1", "apply", str(pair))
    assert again.returncode == 0, again.stderr
    assert "keepalived start" in again.stdout
    lab.wait_for_roles()
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(WEB_VIP) == {lab.mac("lb1")}


def test_a_vip_a_single_balancer_takes_over_is_announced_at_once(lab, pair):
    """The pair shrinks to lb1 alone while lb2 holds the VIPs: lb2 stops, and
    lb1 adds them itself.  A client that cached lb2's MAC must learn lb1's at
    once, not after its entry fails (seconds here, hours on many routers)."""
    lab.kill_keepalived("lb1", signal.SIGTERM)
    lab.wait_for(lambda: lab.vrrp_state("lb2") == "MASTER", what="lb2 master")
    assert lab.udp_ask(DNS_VIP, 53) != ["timeout"]
    lab.wait_for(lambda: client_neigh_mac(lab, DNS_VIP) == lab.mac("lb2"),
                 what="the client to cache lb2's MAC for the dns VIP")
    applied = lab.reset()  # lb2's keepalived stops first; lb1 has no check: netlink
    assert client_neigh_mac(lab, DNS_VIP) == lab.mac("lb1")
    assert client_neigh_mac(lab, WEB_VIP) in (None, lab.mac("lb1"))
    assert lab.udp_ask(DNS_VIP, 53, timeout=1) != ["timeout"], applied


def test_a_pair_reloaded_as_one_balancer_keeps_its_vips(lab, pair):
    """lb2 leaves: lb1's keepalived reloads (it runs on, for the check) without
    its VRRP instance, and deletes that instance's VIPs as it does; lb1 must
    hold them itself once apply returns.  The reload leaves the pair's sync
    daemons running; apply stops them."""
    daemons = lab.sh("lb1", ["ipvsadm", "-L", "--daemon"]).stdout
    assert "master sync daemon" in daemons and "backup sync daemon" in daemons, daemons
    running = lab.keepalived_pids("lb1")[0]
    lab.reset(edited(services=lambda s: {**s, "web": {**s["web"], "workers": ["pi1", "pi2"],
                                                      "health": WEB_HEALTH}}), "one-checked")
    assert lab.keepalived_pids("lb1")[0] == running  # reloaded, not restarted
    # keepalived let go of the VIPs with its VRRP instance; lb1 holds them
    # now, on eth0, and no longer on lo, where they stayed meanwhile.
    held = lab.sh("lb1", ["ip", "-4", "-o", "address", "show", "dev", "eth0"]).stdout
    assert WEB_VIP in held and DNS_VIP in held, held
    on_lo = lab.sh("lb1", ["ip", "-4", "-o", "address", "show", "dev", "lo"]).stdout
    assert WEB_VIP not in on_lo and DNS_VIP not in on_lo, on_lo
    assert set(lab.ask_web(4)) == {"served by pi1", "served by pi2"}
    assert lab.sh("lb1", ["ipvsadm", "-L", "--daemon"]).stdout == ""


def test_a_pair_shrunk_while_the_other_balancer_runs_leaves_it_the_vips(lab, pair):
    """lb1 is given a one-balancer file while lb2 still runs the pair's
    keepalived: as lb1's reload lets the VIPs go, lb2 takes them over, and
    lb1 must not add them too (two MACs for one VIP).  It says who holds
    them; once lb2 is removed, the same apply takes them."""
    single = lab.write("one-checked-lb2-running", edited(services=lambda s: {
        **s, "web": {**s["web"], "workers": ["pi1", "pi2"], "health": WEB_HEALTH}}))
    planned = lab.lbctl("lb1", "plan", str(single))
    assert "WARNING: this balancer leaves its failover pair" in planned.stdout, planned.stdout
    applied = lab.lbctl("lb1", "apply", str(single))
    said = applied.stdout + applied.stderr
    assert applied.returncode != 0, said
    assert f"answers ARP for {WEB_VIP} (by {lab.mac('lb2')}), {DNS_VIP} (by {lab.mac('lb2')})" \
        in said, said
    held = lab.sh("lb1", ["ip", "-4", "-o", "address", "show"]).stdout
    assert WEB_VIP not in held and DNS_VIP not in held, held  # nor on lo, where it waited
    assert lab.vrrp_state("lb2") == "MASTER"
    assert all(a.startswith("served by pi") for a in lab.ask_web(4))  # through lb2
    removed = lab.lbctl("lb2", "apply", str(pair), "--remove")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    again = lab.lbctl("lb1", "apply", str(single))
    assert again.returncode == 0, again.stdout + again.stderr
    held = lab.sh("lb1", ["ip", "-4", "-o", "address", "show", "dev", "eth0"]).stdout
    assert WEB_VIP in held and DNS_VIP in held, held
    assert set(lab.ask_web(4)) == {"served by pi1", "served by pi2"}


def test_a_master_cut_off_fails_over_and_back(lab, pair):
    lab.ask_web(1)
    load = lab.traffic("load", WEB_VIP, "--seconds", 12, "--interval", 0.05, "--timeout", 0.5)
    time.sleep(2)
    cut, restored = lab.cut_master("lb1", "lb2", seconds_down=3)
    records = lab.finish(load)
    down, back = summarize([r for r in records if r[0] < restored], cut), \
        summarize([r for r in records if r[0] >= restored], restored)
    report("failover: master link down",
           vip_answers_after="never" if down["gap"] is None else f"{down['gap']:.2f}s",
           failed=f"{down['failed']}/{down['requests']}")
    report("failback: link restored", failed=f"{back['failed']}/{back['requests']}")
    # The backup answered for the VIP while lb1 was still cut off (not lb1
    # once its link came back), and the VIP answered again after the failback.
    assert down["gap"] is not None and down["gap"] < restored - cut, (down, restored - cut)
    assert back["gap"] is not None, back
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(WEB_VIP) == {lab.mac("lb1")}


def test_a_planned_failover_and_back_loses_no_request(lab, pair):
    lower = pair_edited(balancers=lambda b: {**b, "lb1": {**b["lb1"], "priority": 50}})
    lowered = lab.write("pair-lb1-lowered", lower)
    # Each request gets 10 s: one whose connection the new master learns only
    # from the old one's next sync batch (up to 3 s) is answered at the
    # client's next resend, 3 s or 6.2 s after its first send.  The load runs
    # until lb1 is master again, so the failback is under load too.
    load = lab.traffic("load", WEB_VIP, "--seconds", 120, "--interval", 0.05, "--timeout", 10)
    time.sleep(2)
    for result in lab.apply_all(lowered).values():
        assert result.returncode == 0, result.stdout + result.stderr
    lab.wait_for(lambda: lab.vrrp_state("lb2") == "MASTER", what="lb2 master")
    moves = {"to lb2": master_since(lab, "lb2")}
    time.sleep(2)
    for result in lab.apply_all(pair).values():
        assert result.returncode == 0, result.stdout + result.stderr
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 master")
    moves["back to lb1"] = master_since(lab, "lb1")
    records = lab.stop_load(load)
    summary = summarize(records, 0)
    report("planned failover and back", failed=f"{summary['failed']}/{summary['requests']}",
           slowest=f"{max(end - start for start, end, _ok, _body in records):.1f}s")
    # The load is stopped once lb1 is master again: its last request may
    # have begun before the move and been answered after it (a SYN resent
    # across the move), and that request spans the move too.
    assert records[0][0] < moves["to lb2"] and records[-1][1] > moves["back to lb1"], \
        f"the load did not span both moves: {moves}, requests {records[0][0]}..{records[-1][1]}"
    failed = [r for r in records if not r[2]]
    assert not failed, failed_requests(lab, failed, moves)


def failed_requests(lab, failed, moves):
    """Each failed request, when it started against the VIP's moves, and what
    both balancers hold of its connection."""
    lines = []
    for start, end, _ok, body in failed:
        when = ", ".join(f"{start - at:+.2f}s from {move}" for move, at in moves.items())
        lines.append(f"{body} ({end - start:.1f}s; {when})")
        port = failed_client_port(body)
        for node in ("lb1", "lb2") if port else ():
            lines.append(f"  {node}: {connection_rows(lab, node, port)}")
    return "\n".join(lines)


def _blob_hashes(lab):
    """The digests of the blobs every web server of the lab serves."""
    hashes = set()
    for name in lab.nodes:
        path = os.path.join(lab.workdir, f"{name}-www", "blob")
        if os.path.exists(path):
            with open(path, "rb") as fh:
                hashes.add(hashlib.sha256(fh.read()).hexdigest())
    return hashes


def test_long_downloads_survive_failover_and_failback(lab, pair):
    # 100 downloads of 1 MiB, each read at 64 KiB/s: about 16 s on the wire, long
    # enough to span the failover and, after the preempt delay, the failback.
    before = lab.learned_ports("lb2", WEB_VIP, 80)
    downloads = lab.traffic("downloads", WEB_VIP, "--count", 100, "--rate", 64 * 1024)
    # The cut comes once lb2 knows them all: a connection younger than the sync
    # daemon's batch (up to 3 s) is lost with its master, and that is not what
    # this test measures.
    lab.wait_until_learned("lb2", WEB_VIP, 80, 100, before)
    lab.cut_master("lb1", "lb2", seconds_down=2)
    results = lab.finish(downloads)
    exact = [r for r in results if r["ok"] and r["sha256"] in _blob_hashes(lab)]
    report("connection survival", complete_and_byte_exact=f"{len(exact)}/{len(results)}",
           errors=sorted({r["error"] for r in results if r["error"]}))
    assert len(exact) >= 0.99 * len(results)


def test_a_split_brain_heals_to_one_master_and_one_mac(lab, pair):
    for node in ("lb1", "lb2"):
        lab.block_vrrp(node)
    try:
        lab.wait_for(lambda: lab.vrrp_state("lb2") == "MASTER", timeout=10,
                     what="lb2 to become master as well")
        assert lab.vrrp_state("lb1") == "MASTER"
    finally:
        for node in ("lb1", "lb2"):
            lab.block_vrrp(node, blocked=False)
    lab.wait_for(lambda: lab.vrrp_state("lb2") == "BACKUP", timeout=10, what="lb2 to yield")
    assert lab.vrrp_state("lb1") == "MASTER"
    time.sleep(1)
    # Without flushing: the client's own cache already points at the one master.
    assert client_neigh_mac(lab) == lab.mac("lb1")
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(WEB_VIP) == {lab.mac("lb1")}
    addresses = lab.sh("lb2", ["ip", "-4", "-br", "addr", "show", "eth0"]).stdout
    assert WEB_VIP not in addresses


# A client that opened a connection and has sent nothing yet, as a client of
# a protocol whose server speaks first (SSH, SMTP) waits for the greeting:
# the balancer has seen the handshake's two packets only.  It says "open",
# and sends its request when told to.
OPEN_CONNECTION = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=30, source_address=("", int(sys.argv[2])))
print("open", s.getsockname()[1], flush=True)
sys.stdin.readline()
started = time.monotonic()
try:
    s.sendall(b"GET /index.html HTTP/1.0\\r\\n\\r\\n")
    reply = b""
    while chunk := s.recv(4096):
        reply += chunk
    print("reply", reply.decode().splitlines()[-1], f"{time.monotonic() - started:.1f}")
except OSError as exc:
    print("error", type(exc).__name__, f"{time.monotonic() - started:.1f}")
"""


def chain_packets(lab, node, table, chain):
    """The packets counted by the one counter of a node's nftables chain."""
    out = lab.sh(node, ["nft", "list", "chain", "ip", table, chain]).stdout
    return int(out.split("counter packets ")[1].split()[0])


def grace_held(lab, node):
    """Packets the takeover grace dropped since the node's last VRRP state change."""
    return chain_packets(lab, node, "lbctl-lab", "takeover")


def master_since(lab, node):
    """When the node's keepalived last became master (its notify hook's record)."""
    with open(lab.path(node, "vrrp_state")) as fh:
        state, since = fh.read().split()[:2]  # then the hook's start, for its order
    assert state == "MASTER", state
    return float(since)


def connection_rows(lab, node, port):
    """The node's IPVS entries of the client's connection from `port`, with
    where each came from (LOCAL: scheduled here; SYNC: learned from the peer)."""
    return [" ".join(fields) for fields in lab.connection_entries(node)
            if fields[2] == f"{port:04X}"]


def unused_client_port(lab):
    """A client port below the ephemeral range (so no other load of the session
    took it) that neither balancer has an entry for: an entry lb2 learned for
    an earlier connection, and whose end it never heard of (its sync was
    filtered, a cable was out), stays ESTABLISHED for 15 minutes and would
    forward the test's packets as if lb2 knew this connection."""
    while True:
        port = random.randrange(20000, 30000)
        if not any(connection_rows(lab, node, port) for node in ("lb1", "lb2")):
            return port


# On the client: the worker's SYN-ACKs to one client port are lost until the
# client has sent its SYN twice (the rule counts them), so the balancer sees
# a handshake of three packets.
SYN_ACK_TABLE = "lbctl-test-synack"
SYN_ACK_LOST = """
table ip {table} {{
    chain in {{
        type filter hook input priority 0; policy accept;
        tcp dport {port} tcp flags & (syn | ack) == syn | ack drop
    }}
    chain out {{
        type filter hook output priority 0; policy accept;
        tcp sport {port} tcp flags & (syn | ack) == syn counter
    }}
}}
"""


def syns_sent(lab):
    return chain_packets(lab, "client", SYN_ACK_TABLE, "out")


class GraceOver(Exception):
    """The takeover grace had ended before the request could test it."""


def armed(lab, node):
    """The takeover grace's set of armed protocols on a node, as nft lists it."""
    return lab.sh(node, ["nft", "list", "set", "ip", "lbctl-lab", "armed"]).stdout


def finish_on_the_other_balancer(lab, sync_blocked, syn_resent=False, sync_held=False):
    """Open a connection through lb1, make lb2 take the VIP (neither hears the
    other's adverts), then finish the request through lb2: (what the client
    printed, packets lb2's grace held back, what both balancers and the
    client knew, for a failure's message).  `syn_resent`: the client's first
    SYN-ACKs are lost, and it sends its SYN again.  `sync_held`: lb1's sync
    datagrams are held on their way to lb2 until lb2's grace has held the
    request back: lb2 learns the connection after the client's next packet
    reached it, the race the grace is for."""
    # keepalived sends a master's gratuitous ARPs again 5 s after it took over
    # (vrrp_garp_master_delay); lb1's must not pull the client back mid-test.
    time.sleep(max(0.0, master_since(lab, "lb1") + 6 - time.time()))
    # The last takeover's split brain healed with lb1 announcing the VIP again
    # (lb2 answers lb1's advert with its own, vrrp_higher_prio_send_advert, and
    # lb1 answers that lower one with gratuitous ARPs, vrrp_garp_lower_prio_repeat):
    # the client must not still send to lb2.
    lab.wait_for(lambda: client_neigh_mac(lab) != lab.mac("lb2"), timeout=10,
                 what="the client to leave lb2 for the VIP")
    client = None
    try:
        if sync_held:
            lab.hold_sync("lb1")
        if sync_blocked:
            # Before the connection opens: lb1's sync daemon may send it within
            # moments of its first packets, and lb2 must never learn it.
            lab.block_sync("lb2")
        port = unused_client_port(lab)
        if syn_resent:
            lab.sh("client", ["nft", "-f", "-"],
                   input=SYN_ACK_LOST.format(table=SYN_ACK_TABLE, port=port))
        client = subprocess.Popen(["ip", "netns", "exec", lab.nodes["client"].netns,
                                   sys.executable, "-c", OPEN_CONNECTION, WEB_VIP, str(port)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if syn_resent:
            lab.wait_for(lambda: syns_sent(lab) >= 2, timeout=10, what="the client's second SYN")
            lab.sh("client", ["nft", "delete", "table", "ip", SYN_ACK_TABLE])
        opened, port = client.stdout.readline().split()
        assert opened == "open"
        port = int(port)
        assert [row for row in connection_rows(lab, "lb1", port) if row.split()[8] == "LOCAL"], \
            f"lb1 did not schedule the client's connection: {connection_rows(lab, 'lb1', port)}"
        for node in ("lb1", "lb2"):
            lab.block_vrrp(node)
        lab.wait_for(lambda: client_neigh_mac(lab) == lab.mac("lb2"), timeout=10,
                     what="the client to reach the VIP at lb2")
        learned_before = connection_rows(lab, "lb2", port)
        assert not (sync_blocked and learned_before), \
            f"lb2 knew the connection though its sync was filtered: {learned_before}"
        if "elements" not in armed(lab, "lb2"):
            # The client reached lb2 later than the grace lasts (a neighbour
            # entry that kept lb1's MAC until keepalived's second round of
            # gratuitous ARPs, 5 s on, on a slow lab): nothing to test here.
            raise GraceOver(f"lb2 took over {time.time() - master_since(lab, 'lb2'):.1f}s "
                            "before the client reached it, and its grace had ended")
        client.stdin.write("go\n")
        client.stdin.flush()
        if sync_held:
            try:
                # Until the grace holds the request back, or the client gave up.
                lab.wait_for(lambda: grace_held(lab, "lb2") > 0 or client.poll() is not None,
                             timeout=10, what="lb2's grace to hold the request back")
            finally:
                lab.hold_sync("lb1", held=False)
        printed = client.communicate(timeout=60)[0].split()
        known = (f"lb2 knew before the request went on: {learned_before}\n"
                 f"lb1: {connection_rows(lab, 'lb1', port)}\n"
                 f"lb2: {connection_rows(lab, 'lb2', port)}\n"
                 f"client's neighbour for the VIP: {client_neigh_mac(lab)} "
                 f"(lb1 {lab.mac('lb1')}, lb2 {lab.mac('lb2')})\n"
                 f"lb2's sloppy_tcp: {lab.sh('lb2', ['sysctl', '-n', 'net.ipv4.vs.sloppy_tcp']).stdout}"
                 f"--- lb2's keepalived:\n{lab.keepalived_log('lb2', lines=15)}")
        return printed, grace_held(lab, "lb2"), known
    finally:
        # This first: nothing below may leave lb1's sync held back for the
        # rest of the module.
        lab.stop_holding_sync("lb1")
        if client is not None:
            client.kill()
        lab.sh("client", ["nft", "delete", "table", "ip", SYN_ACK_TABLE], check=False)
        for node in ("lb1", "lb2"):
            lab.block_vrrp(node, blocked=False)
        lab.block_sync("lb2", blocked=False)
        lab.wait_for_roles(timeout=10)
        # lb1 heard lb2's lower priority adverts again: it repeats its gratuitous
        # ARPs 5 s later (vrrp_garp_lower_prio_delay), which must not land in
        # the next takeover.
        time.sleep(6)


def finish_within_the_grace(lab, **how):
    """finish_on_the_other_balancer, made again (up to three times in all)
    when the client reached lb2 only after its grace had ended: a slow lab's
    run that tests nothing."""
    for attempt in range(3):
        try:
            return finish_on_the_other_balancer(lab, **how)
        except GraceOver as exc:
            report("takeover grace: over before the request", reason=str(exc), **how)
            if attempt == 2:
                raise


def test_a_takeover_carries_on_a_connection_the_peer_had_not_synced_yet(lab, pair):
    # Each client connection has had only its handshake through lb1, which is
    # when lbctl's sync settings queue it.  lb1's sync daemon sends it in its
    # next batch, up to 3 s later.  Until it arrives lb2 does not know it, and
    # its own TCP stack would answer the request with a reset; the takeover
    # grace drops those packets instead, and the client's resend gets through.
    assert "elements = { tcp }" in armed(lab, "lb2")  # the backup: armed, with no timeout
    # The master: armed for 5 s after it took over, then no more.
    lab.wait_for(lambda: "elements" not in armed(lab, "lb1"), timeout=20,
                 what="lb1's grace to end")
    # Two connections: a two-packet handshake (the kernel's default counts to
    # three, and never sent it), then one whose SYN was resent (three packets
    # by the handshake's end; a count of two never sent it).  lb1's sync is
    # held until lb2's grace holds the request, then lets go: lb2 learns the
    # connection while the client waits to resend.
    for syn_resent in (False, True):
        printed, held, known = finish_within_the_grace(
            lab, sync_blocked=False, syn_resent=syn_resent, sync_held=True)
        report("takeover grace: a request begun on the old master", printed=" ".join(printed),
               packets_held=held, syn_resent=syn_resent)
        assert printed[:3] == ["reply", "served", "by"], f"{printed}\n{known}"
        assert held > 0, known

    # A connection the peer never sends (the sync multicast filtered, as when
    # the old master died before sending) is reset once the grace ends, rather
    # than left to hang.
    printed, held, known = finish_within_the_grace(lab, sync_blocked=True)
    report("takeover grace: a request lb2 never learns", printed=" ".join(printed),
           packets_held=held)
    assert printed[:2] == ["error", "ConnectionResetError"], f"{printed}\n{known}"
    assert held > 0, known


# Apply on lb1 as lbctl does, except that the keepalived.conf in the plan is made
# one keepalived refuses: an unknown scheduler lbctl's own checks never let through.
APPLY_WITH_A_CONFIG_KEEPALIVED_REJECTS = """
import dataclasses, sys
from lbctl.errors import ApplyError
from lbctl.engine.execute import execute
from lbctl.layout import Layout
from lbctl.engine.node import load_node

ctx = load_node(sys.argv[1], "lb1", sys.argv[2])
conf = Layout("lab").conf
ctx.plan.changes = [c if c.key != conf else dataclasses.replace(c, new=dataclasses.replace(
    c.new, content=c.new.content.replace("lvs_sched wrr", "lvs_sched fastest")))
    for c in ctx.plan.changes]
try:
    execute(ctx.plan, ctx.adapters)
except ApplyError as exc:
    print(exc)
    sys.exit(1)
"""


def test_a_config_keepalived_rejects_leaves_the_running_one_untouched(lab, pair):
    root = lab.nodes["lb1"].root
    conf_path = lab.path("lb1", "conf")
    before = open(conf_path).read()
    pids = lab.keepalived_pids("lb1")
    rules = lab.ipvs_rules("lb1")
    edited = lab.write("pair-edit", pair_edited(
        balancers=lambda b: {**b, "lb1": {**b["lb1"], "priority": 140}}))
    result = lab.sh("lb1", [sys.executable, "-c", APPLY_WITH_A_CONFIG_KEEPALIVED_REJECTS,
                            str(edited), root], check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "keepalived rejects it" in result.stdout and "fastest" in result.stdout
    assert open(conf_path).read() == before
    assert lab.keepalived_pids("lb1") == pids
    assert lab.ipvs_rules("lb1") == rules
    # The edit itself, without the bad line, goes through.
    assert lab.lbctl("lb1", "apply", str(edited)).returncode == 0
    assert "priority 140" in open(conf_path).read()
