"""What the VRRP defaults mean on the wire: a pair does not fail back on its own,
so idle connections survive the master's return; one balancer sends no adverts."""

import json
import signal
import subprocess
import sys
import time

import pytest

from clusters import PAIR, WEB_VIP, edited
from lbctl.errors import LabError
from test_keepalived import ALL_WEB, ipvs_web_serving

# Opens connections to the VIP and sends the first line of a request on each,
# prints the local ports, then sits idle until told to go on (a line on stdin), sends the blank line
# that ends each request and prints what each got back, as JSON.
IDLE_CLIENTS = """
import json, socket, sys
socks = [socket.create_connection((sys.argv[1], 80), timeout=5) for _ in range(int(sys.argv[2]))]
for s in socks:
    s.sendall(b"GET /index.html HTTP/1.0\\r\\n")
print(" ".join(str(s.getsockname()[1]) for s in socks), flush=True)
sys.stdin.readline()
answers = []
for s in socks:
    try:
        s.sendall(b"\\r\\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        answers.append(data.partition(b"\\r\\n\\r\\n")[2].decode().strip() or "empty")
    except OSError as exc:
        answers.append(f"error: {exc}")
print(json.dumps(answers))
"""


class IdleClients:
    def __init__(self, lab, count):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", lab.nodes["client"].netns, sys.executable, "-c",
             IDLE_CLIENTS, WEB_VIP, str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ports = self.proc.stdout.readline().split()
        assert len(self.ports) == count, self.ports

    def known_to(self, lab, node):
        """Whether every connection is in the node's IPVS connection table."""
        table = lab.sh(node, ["ipvsadm", "-Lnc"]).stdout
        return all(f":{port} " in table for port in self.ports)

    def finish(self):
        out, _ = self.proc.communicate("go\n", timeout=60)
        return json.loads(out)


def _lb1_master(lab, path):
    """lb1 master and lb2 backup, as the test starts from.  Without preempt
    the pair's first election is a race: both keepalived start in BACKUP,
    and the one whose timer runs out first keeps the VIPs, whatever its
    priority (a lb1 that started a few tens of milliseconds late stays
    backup).  So lb2 is stopped, lb1 takes over, and lb2 comes back."""
    try:
        lab.wait_for_roles(timeout=10)
        return
    except LabError:
        pass
    lab.kill_keepalived("lb2", signal.SIGTERM)
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 to take over")
    applied = lab.lbctl("lb2", "apply", str(path))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    lab.wait_for_roles()


def _served(answers):
    return all(a.startswith("served by ") for a in answers)


def test_a_returning_master_stays_backup_and_idle_connections_survive(lab):
    # preempt left at its default.  Adverts a second apart: a backup that
    # hears none for three intervals takes over whatever preempt says, and
    # the emulated lab's busy CPUs can hold a keepalived for longer than
    # three adverts of 100 ms.
    spec = {**PAIR, "vrrp": {"advert_interval": "1s"}}
    path = lab.reset(spec, "pair-default-preempt")
    _lb1_master(lab, path)
    lab.wait_for(lambda: ipvs_web_serving(lab, "lb1") == ipvs_web_serving(lab, "lb2") == ALL_WEB,
                 what="every web worker in both tables")
    assert "nopreempt" in open(lab.path("lb1", "conf")).read()

    before = IdleClients(lab, 6)  # through lb1, learned by lb2's sync daemon
    # The sync daemon sends in batches, up to two seconds apart.
    lab.wait_for(lambda: before.known_to(lab, "lb2"), what="lb2 to learn lb1's connections")
    lab.set_link("lb1", False)
    try:
        lab.wait_for(lambda: lab.vrrp_state("lb2") == "MASTER", what="lb2 to take over")
        during = IdleClients(lab, 6)  # through lb2 while lb1 is away: lb1 never learns them
    finally:
        lab.set_link("lb1", True)
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "BACKUP", what="lb1 back as backup")
    # Longer than the preempt delay a preempting master would wait before taking over.
    time.sleep(lab.cluster.health_settle_seconds + 3)
    assert (lab.vrrp_state("lb1"), lab.vrrp_state("lb2")) == ("BACKUP", "MASTER")

    before_answers, during_answers = before.finish(), during.finish()
    assert _served(before_answers), before_answers
    assert _served(during_answers), during_answers
    result = lab.lbctl("lb2", "apply", str(path))
    assert result.returncode == 0 and "no changes" in result.stdout, result.stdout


@pytest.fixture(scope="module")
def single_with_checks(lab):
    """One balancer whose web service is health checked, so keepalived runs on it alone."""
    spec = edited(services=lambda s: {**s, "web": {**s["web"], "health": {
        "http": {"path": "/index.html"}, "interval": "1s", "timeout": "500ms", "rise": 1}}})
    lab.reset()  # one balancer (lb2's keepalived stops), then checks on it
    lab.reset(spec, "single-with-checks")
    yield
    lab.reset()


def test_one_balancer_with_health_checks_sends_no_vrrp_adverts(lab, single_with_checks):
    lab.wait_for(lambda: ipvs_web_serving(lab, "lb1") == ALL_WEB, what="every web worker in")
    # VRRP is IP protocol 112; listen on the LAN port of lb1 for three seconds.
    dump = lab.sh("lb1", ["timeout", "3", "tcpdump", "-i", "eth0", "-n", "-c", "1",
                          "ip proto 112"], check=False)
    assert "IP " not in dump.stdout, dump.stdout
    assert WEB_VIP in lab.sh("lb1", ["ip", "-4", "-o", "address", "show", "dev", "eth0"]).stdout
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(WEB_VIP) == {lab.mac("lb1")}
    assert {a.removeprefix("served by ") for a in lab.ask_web(8)} == {"pi1", "pi2", "pi3"}
    status = lab.lbctl("lb1", "status").stdout
    assert "MASTER" not in status and "BACKUP" not in status
