"""Every command that takes --all, in every mode: the matrix.

One routed lab serves every mode in turn: an sshd in each node, and the
client behind a router running BIRD, as a laptop on another network would
drive a cluster.  Each mode starts from nodes that lbctl never touched (the
previous mode's `apply --remove --all` took everything away, which is one
of its cells), runs each command from the client, and asserts what a user
would see: the exit code, the nodes named, and the kernel's state where the
command changes it.  The suite prints the matrix at the end.

A new command that takes --all gets a column here.
"""

import contextlib
import copy
import os
import re
import subprocess
import sys
import time
from ipaddress import IPv4Address

import pytest

import ipvs_table
from clusters import write_cluster
from conftest import MEASUREMENTS
from lbctl.config import load_cluster
from lbctl.lab.routed import RoutedLab
from lbctl.lab.shell import pids_in
from lbctl.layout import ETC_DIR
from test_cluster_ssh import fleet, order_of  # noqa: F401  (fleet: sshd in this lab)

LAN_VIP = "192.168.100.10"
ROUTED_VIP = "10.200.0.10"
OTHER_ROUTED_VIP = "10.200.0.11"
WORKERS = {"pi1": "192.168.100.3", "pi2": "192.168.100.4", "pi3": "192.168.100.6"}
WORKERS_BY_ADDRESS = {address: name for name, address in WORKERS.items()}
BALANCERS = {"lb1": "192.168.100.2", "lb2": "192.168.100.5"}
# Two chances: a stall of the emulated lab's CPUs past one 500 ms check
# fails every worker's at once.  With one chance the balancer has no real
# server left, and in mode ecmp it withdraws the VIP too.
FAST_CHECK = {"http": {"path": "/index.html", "status": 200},
              "interval": "1s", "timeout": "500ms", "retries": 2, "rise": 1}

# The README's simplest cluster: one balancer, no checks, no vrrp section.
SINGLE = {
    "cluster": "mx",
    "ssh": {"user": "root"},
    "balancers": {"lb1": {"address": BALANCERS["lb1"], "interface": "eth0"}},
    "workers": {name: {"address": address} for name, address in WORKERS.items()},
    "services": {"web": {"vip": LAN_VIP, "port": 80, "scheduler": "rr"}},
}
SINGLE_CHECKED = copy.deepcopy(SINGLE)
SINGLE_CHECKED["services"]["web"]["health"] = FAST_CHECK
PAIR = copy.deepcopy(SINGLE_CHECKED)
PAIR["balancers"] = {"lb1": {"address": BALANCERS["lb1"], "interface": "eth0", "priority": 150},
                     "lb2": {"address": BALANCERS["lb2"], "interface": "eth0", "priority": 100}}
# 1 s adverts: on the emulated lab's busy CPUs 100 ms ones can be missed
# during a reload (see clusters.steady).
PAIR["vrrp"] = {"advert_interval": "1s", "preempt": True}
ECMP = copy.deepcopy(SINGLE_CHECKED)
ECMP["mode"] = "ecmp"
ECMP["bgp"] = {"as": 65001, "router": {"address": "192.168.100.1", "as": 65000},
               "hold": "3s", "keepalive": "1s"}
ECMP["balancers"] = {name: {"address": address, "interface": "eth0"}
                     for name, address in BALANCERS.items()}
ECMP["services"]["web"].update(vip=ROUTED_VIP, scheduler="mh", scheduler_flags=["mh-port"])

# The mode whose cells pi3 runs with the installed lbctl started anew for
# each command, as on a Pi (test_cluster_ssh's fleet runs it so throughout),
# and the client too, as a laptop's shell does: every --all command from a
# fresh interpreter.  In the others every node and the client run their
# warm lbctl, which costs the emulated lab a second of CPU less per command.
COLD_MODE = "failover pair"
# mode name: (spec, the balancers that serve, what runs the table there)
MODES = {
    "one balancer, netlink": (SINGLE, ["lb1"], "netlink"),
    "one balancer, keepalived": (SINGLE_CHECKED, ["lb1"], "keepalived"),
    "failover pair": (PAIR, ["lb1", "lb2"], "keepalived"),
    "ecmp": (ECMP, ["lb1", "lb2"], "keepalived"),
}
COLUMNS = ["apply", "plan", "status", "doctor", "drain", "undrain", "rollout", "apply --remove"]
MATRIX = {}  # (mode, column): "ok 12.3s" or "FAILED"


def matrix_lines():
    width = max(len(m) for m in MODES)
    lines = ["--all in every mode (each cell: outcome, seconds)",
             " " * width + " | " + " | ".join(f"{c:>14}" for c in COLUMNS)]
    for mode in MODES:
        cells = [MATRIX.get((mode, c), "not run") for c in COLUMNS]
        lines.append(f"{mode:<{width}} | " + " | ".join(f"{c:>14}" for c in cells))
    return lines


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    topology = folder / "topology.yaml"
    write_cluster(topology, ECMP)
    the_lab = RoutedLab(load_cluster(str(topology)), topology, prefix="mx")
    the_lab.files = folder
    the_lab.build()
    try:
        yield the_lab
    finally:
        MEASUREMENTS.extend(matrix_lines())
        the_lab.teardown()


def slug(mode):
    return re.sub(r"\W+", "-", mode)


def vip_of(spec):
    return spec["services"]["web"]["vip"]


def web_rules(lab, node, vip):
    """{address: weight} of the web service's real servers in `node`'s IPVS,
    or None if it has no such service."""
    rows = ipvs_table.service(ipvs_table.on(lab, node), vip, 80)
    return None if rows is None else {a.rsplit(":", 1)[0]: row.weight for a, row in rows.items()}


def served_by(lab, vip, count=12):
    return set(lab.ask(f"http://{vip}/", count, timeout=3))


def daemons(lab, node):
    """The names of keepalived and BIRD processes running in a node's namespace."""
    found = set()
    for pid in pids_in([lab.nodes[node].netns]):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        if name in ("keepalived", "bird"):
            found.add(name)
    return found


class Cells:
    """One mode's row: each cell timed, its outcome recorded before it asserts."""

    def __init__(self, lab, fleet, mode, path):
        self.lab, self.fleet, self.mode, self.path = lab, fleet, mode, str(path)

    def run(self, column, *args):
        started = time.monotonic()
        MATRIX[(self.mode, column)] = "FAILED"
        if column == "rollout":
            done = self.fleet.from_client(["rollout", self.path, *args, "--yes",
                                           "--ssh-config", self.fleet.config], timeout=900)
        elif column == "apply":
            # As a person runs it: the plans on a terminal, then "y".  What
            # follows the answer is what the apply printed.
            status, shown, asked = self.fleet.lbctl_all_on_a_terminal(*args, answer="y\n")
            plans, _, applied = shown.partition("[y/N] y\n")
            done = subprocess.CompletedProcess(args, status, applied, shown)
            done.asked, done.plans = asked, plans
        else:
            done = self.fleet.lbctl_all(*args)
        done.seconds, done.column = time.monotonic() - started, column
        return done

    def passed(self, done):
        MATRIX[(self.mode, done.column)] = f"ok {done.seconds:.1f}s"


def take_everything_away(lab, fleet, path, serving):
    """After a failed cell: lbctl removed from every node, by each node
    itself, so the next mode still starts from clean nodes."""
    for node in [*serving, *WORKERS]:
        lab.sh(node, [sys.executable, "-m", "lbctl", "apply", str(path), "--remove",
                      "--root", lab.nodes[node].root], check=False)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_all_command(lab, fleet, mode):
    spec, serving, engine = MODES[mode]
    vip = vip_of(spec)
    path = write_cluster(lab.files / f"{slug(mode)}.yaml", spec)
    cluster = load_cluster(str(path))
    assert cluster.engine == engine
    nodes = [*serving, *WORKERS]
    idle = [b for b in BALANCERS if b not in serving]
    cell = Cells(lab, fleet, mode, path)
    fleet.make_cold(["pi3", "client"] if mode == COLD_MODE else [])
    clean = False
    try:
        _apply(lab, cell, spec, serving, vip)
        _plan(cell, nodes)
        _status(cell, serving)
        _doctor(cell, nodes)
        _drain_and_undrain(lab, cell, serving, vip)
        _rollout(lab, cell, serving, vip)
        _remove(lab, cell, serving, idle, vip)
        clean = True
    finally:
        if not clean:
            take_everything_away(lab, fleet, path, serving)


def _apply(lab, cell, spec, serving, vip):
    # Nothing serves the VIP before.
    assert lab.curl(f"http://{vip}/", timeout=2).returncode != 0
    done = cell.run("apply", "apply", cell.path)
    assert (done.returncode, done.asked) == (0, True), done.stderr
    # Every node's plan was shown before the question, and applied after it.
    assert sorted(order_of(done.plans)) == sorted([*serving, *WORKERS]), done.stderr
    order = order_of(done.stdout)
    # Workers first, then the balancers one at a time: a fresh pair's
    # master-to-be first (the first keepalived to run becomes master).
    assert set(order[:3]) == set(WORKERS), done.stdout
    expected = ["lb1", "lb2"] if spec is PAIR else serving
    assert order[3:] == expected, done.stdout
    assert f"applied on {len(serving) + 3} node(s)" in done.stdout, done.stdout
    for node in serving:
        lab.wait_for(lambda n=node: web_rules(lab, n, vip) == {a: 1 for a in WORKERS.values()},
                     timeout=30, what=f"{node}'s IPVS to hold every worker at weight 1")
    for node in BALANCERS:
        if node not in serving:
            assert web_rules(lab, node, vip) is None, f"{node} is not in the file"
    if spec is PAIR:
        lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 master")
    if spec is ECMP:
        lab.wait_for_next_hops(vip, serving)
    everyone = {f"served by {w}" for w in WORKERS}
    lab.wait_for(lambda: served_by(lab, vip) == everyone, timeout=30,
                 what=f"the client served by {sorted(everyone)} through {vip}")
    cell.passed(done)


def _plan(cell, nodes):
    done = cell.run("plan", "plan", cell.path, "--detailed-exitcode")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("no changes") == len(nodes), done.stdout
    assert sorted(order_of(done.stdout)) == sorted(nodes), done.stdout
    cell.passed(done)


def _status(cell, serving):
    done = cell.run("status", "status", cell.path, "--detailed-exitcode")
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    for node in serving:
        assert re.search(rf"^balancer {node} \({BALANCERS[node]}\)", text, re.M), text
    for node, address in WORKERS.items():
        assert re.search(rf"^worker {node} \({re.escape(address)}\)", text, re.M), text
    assert text.count("drift: none, the node matches the file") == len(serving) + 3, text
    assert "unreachable" not in text
    cell.passed(done)


def _doctor(cell, nodes):
    done = cell.run("doctor", "doctor", cell.path)
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "no problems found"), \
        done.stdout + done.stderr
    # Every node's own checks and the wire's, from the first balancer.
    assert f"checking {len(nodes)} node(s), the LAN from lb1" in done.stderr, done.stderr
    assert "not run" not in done.stdout, done.stdout
    cell.passed(done)


def _drain_and_undrain(lab, cell, serving, vip):
    pi1 = WORKERS["pi1"]
    done = cell.run("drain", "drain", "pi1", cell.path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(order_of(done.stdout)) == sorted(serving), done.stdout
    for node in serving:
        lab.wait_for(lambda n=node: (web_rules(lab, n, vip) or {}).get(pi1) == 0, timeout=30,
                     what=f"pi1 at weight 0 on {node}")
    assert served_by(lab, vip) == {"served by pi2", "served by pi3"}
    cell.passed(done)

    done = cell.run("undrain", "undrain", "pi1", cell.path)
    assert done.returncode == 0, done.stdout + done.stderr
    for node in serving:
        lab.wait_for(lambda n=node: (web_rules(lab, n, vip) or {}).get(pi1) == 1, timeout=30,
                     what=f"pi1 back at weight 1 on {node}")
    lab.wait_for(lambda: "served by pi1" in served_by(lab, vip), timeout=30,
                 what="pi1 serving again")
    cell.passed(done)


def _rollout(lab, cell, serving, vip):
    # One batch of two workers: every step of a rollout (drain on each
    # balancer, wait for idle, run, wait for health, undrain) at the cost of
    # one round; test_cluster_ssh takes workers in turn under load.  The
    # update itself fails unless the worker is at weight 0 on every serving
    # balancer while it runs.
    ran = lab.files / f"rollout-{slug(cell.mode)}"
    drained = " && ".join(
        f"ip netns exec {lab.nodes[node].netns} ipvsadm-save -n | "
        f'grep -q -- "-r $LBCTL_WORKER_ADDRESS:80 -g -w 0$"' for node in serving)
    # A bound of its own, well inside the test's: a wait that stalls is
    # reported by the rollout, with the connection table that held it.
    done = cell.run("rollout", "--exec", f'{drained} && echo "$LBCTL_WORKER" >> {ran}',
                    "--batch", "2", "--start-at", "pi2", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr + "".join(
        f"\n--- {node}'s connections:\n{lab.sh(node, ['ipvsadm', '-L', '-n', '-c']).stdout}"
        for node in serving)
    assert "rolled out to 2 worker(s): pi2, pi3" in done.stdout, done.stdout
    assert ran.read_text() == "pi2\npi3\n"
    for node in serving:
        lab.wait_for(lambda n=node: web_rules(lab, n, vip) == {a: 1 for a in WORKERS.values()},
                     timeout=30, what=f"every worker back at weight 1 on {node}")
    cell.passed(done)


def _remove(lab, cell, serving, idle, vip):
    done = cell.run("apply --remove", "apply", cell.path, "--remove")
    assert done.returncode == 0, done.stdout + done.stderr
    order = order_of(done.stdout)
    # The balancers stop sending traffic before the workers let go of the VIP.
    assert set(order[:len(serving)]) == set(serving), done.stdout
    assert set(order[len(serving):]) == set(WORKERS), done.stdout
    assert f"lbctl removed from {len(serving) + 3} node(s)" in done.stdout, done.stdout
    for node in [*serving, *idle]:
        assert web_rules(lab, node, vip) is None, node
        assert daemons(lab, node) == set(), node
    for node in WORKERS:
        held = lab.sh(node, ["ip", "-4", "-o", "address", "show", "dev", "lo"]).stdout
        assert vip not in held, (node, held)
    for node in [*serving, *WORKERS]:
        folder = os.path.join(lab.nodes[node].root, ETC_DIR.lstrip("/"))
        left = os.listdir(folder) if os.path.isdir(folder) else []
        assert left == [], (node, left)
    if vip == ROUTED_VIP:
        lab.wait_for_next_hops(vip, [], timeout=15)
    assert lab.curl(f"http://{vip}/", timeout=2).returncode != 0
    cell.passed(done)


def test_an_ecmp_bgp_change_rolled_out_keeps_a_route_at_the_router(lab, fleet):
    """A change to `bgp:` restarts each balancer's session.  apply --all takes
    the next balancer only once the last one offers the router its VIPs
    again, so the router always has a next hop for the VIP."""
    import threading

    with ecmp_applied(lab, fleet, "ecmp-hold"):
        held_longer = copy.deepcopy(ECMP)
        held_longer["bgp"]["hold"] = "4s"
        changed = write_cluster(lab.files / "ecmp-hold-4s.yaml", held_longer)
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append((time.monotonic(), lab.next_hops(ROUTED_VIP)))
                time.sleep(0.1)
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            done = fleet.lbctl_all("apply", str(changed))
        finally:
            stop.set()
            sampler.join()
        assert done.returncode == 0, done.stdout + done.stderr
        assert "waiting for lb1 to offer the router its VIPs again" in done.stderr, done.stderr
        # Every node's plan first (mode ecmp plans all before any changes,
        # with --yes too), then the workers, then one balancer at a time.
        shown = order_of(done.stdout)
        assert sorted(shown[:5]) == sorted(["lb1", "lb2", *WORKERS]), done.stdout
        assert shown[5 + 3:] == ["lb1", "lb2"], done.stdout
        # Each session did restart (the hold time is negotiated at the open).
        for node in ("lb1", "lb2"):
            conf = open(lab.path(node, "bird_conf")).read()
            assert "hold time 4" in conf, conf
        bare = [when for when, hops in samples if not hops]
        dropped = {tuple(hops) for _when, hops in samples if len(hops) < 2}
        MEASUREMENTS.append(f"[apply --all of a bgp.hold change] samples={len(samples)} "
                            f"with one next hop={len([1 for _w, h in samples if len(h) == 1])} "
                            f"with none={len(bare)}")
        assert len(samples) > 20 and bare == [], (len(samples), bare)
        assert dropped, "no balancer's session restarted: the test proves nothing"
        lab.wait_for_next_hops(ROUTED_VIP, ["lb1", "lb2"])


@contextlib.contextmanager
def ecmp_applied(lab, fleet, name, spec=ECMP):
    """`spec` (mode ecmp) applied by apply --all, each VIP offered by both
    balancers and served by every worker; removed from every node after."""
    path = write_cluster(lab.files / f"{name}.yaml", spec)
    try:
        done = fleet.lbctl_all("apply", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        for vip in sorted({svc["vip"] for svc in spec["services"].values()}):
            lab.wait_for_next_hops(vip, ["lb1", "lb2"])
            lab.wait_for(lambda: served_by(lab, vip) == {f"served by {w}" for w in WORKERS},
                         timeout=30, what=f"every worker serving {vip}")
        yield path
    finally:
        done = fleet.lbctl_all("apply", str(path), "--remove")
        if done.returncode != 0:
            take_everything_away(lab, fleet, path, ["lb1", "lb2"])


# A second service, with connections that go on through the balancer the
# router moved them to: the wait must count them.
ECMP_TWO_SERVICES = copy.deepcopy(ECMP)
ECMP_TWO_SERVICES["services"]["api"] = {**ECMP["services"]["web"], "vip": OTHER_ROUTED_VIP}


def test_in_mode_ecmp_a_drain_waits_for_connections_not_the_entries_a_moved_flow_left(
        lab, fleet):
    """A flow the router moves to another balancer leaves its entry on the
    one it left, ESTABLISHED for IPVS's 15 minutes, while the connection ends
    through the other.  drain --all --wait (and rollout) count each
    connection once, where it was seen last: the worker is idle at once.
    A moved connection that goes on through the other balancer still
    counts, there."""
    with ecmp_applied(lab, fleet, "ecmp-moved", ECMP_TWO_SERVICES) as path:
        # Requests begun and left waiting, half of them through lb1 by the
        # router's hash: to web, to be finished; to api, to be kept open.
        go, end = lab.files / "finish-the-requests", lab.files / "end-the-kept-ones"
        holder = lab.spawn("client", [sys.executable, "-c", FINISH_LATER, ROUTED_VIP, "80",
                                      "16", str(go)])
        keeper = lab.spawn("client", [sys.executable, "-c", FINISH_LATER, OTHER_ROUTED_VIP,
                                      "80", "16", str(go), str(end)])
        lab.wait_for(lambda: established_on(lab, "lb1") and
                     established_on(lab, "lb1", OTHER_ROUTED_VIP), timeout=10,
                     what="connections through lb1")
        # lb1 leaves: its flows go to lb2, which takes them up as their
        # requests go on (the kept ones) or end, and sees them close.
        drained = lab.lbctl("lb1", "drain-balancer", "lb1", "--timeout", "60", timeout=120)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        for vip in (ROUTED_VIP, OTHER_ROUTED_VIP):
            lab.wait_for_next_hops(vip, ["lb2"])
        moved = established_on(lab, "lb1", OTHER_ROUTED_VIP)
        go.touch()
        assert holder.wait(timeout=60) == 0
        lab.wait_for(lambda: len(established_on(lab, "lb2", OTHER_ROUTED_VIP)) == 16,
                     timeout=10, what="lb2 taking up the kept connections lb1 had")
        # What lb1 still holds of web: entries of connections that ended
        # through lb2 (within tcp_fin of their close there).
        left = established_on(lab, "lb1")
        assert left, "no entry left on lb1: the test proves nothing"
        worker = WORKERS_BY_ADDRESS[left[0]]
        waited = fleet.lbctl_all("drain", worker, str(path), "--service", "web", "--wait",
                                 "--timeout", "60")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert re.search(rf"^{worker} is idle on lb1, lb2 after \d+s\n  lb1 still lists \d+ "
                         r"ESTABLISHED entr(y|ies) of connections that closed through another "
                         "balancer", waited.stdout, re.M), waited.stdout
        assert WORKERS[worker] in established_on(lab, "lb1")  # still there, not counted
        # The kept ones of api: listed on both balancers, each counted once,
        # on lb2, where it was seen last.
        busy = WORKERS_BY_ADDRESS[moved[0]]
        kept = established_on(lab, "lb2", OTHER_ROUTED_VIP).count(WORKERS[busy])
        waited = fleet.lbctl_all("drain", busy, str(path), "--service", "api", "--wait",
                                 "--timeout", "4")
        assert waited.returncode == 1, waited.stdout + waited.stderr
        assert f"{busy} still has {kept} connection(s) after 4s ({kept} on lb2)" in \
            waited.stdout, waited.stdout
        end.touch()
        assert keeper.wait(timeout=60) == 0
        for name, service in ((worker, "web"), (busy, "api")):
            done = fleet.lbctl_all("undrain", name, str(path), "--service", service)
            assert done.returncode == 0, done.stdout + done.stderr
        undrained = lab.lbctl("lb1", "undrain-balancer", "lb1", timeout=120)
        assert undrained.returncode == 0, undrained.stdout + undrained.stderr
        lab.wait_for_next_hops(ROUTED_VIP, ["lb1", "lb2"])


# Opens connections, sends each the start of a request, then (once the
# file argv[4] exists) the rest, and reads each answer to its end.  With a
# second file, argv[5], it sends one more header line at the first file and
# the rest only at the second.
FINISH_LATER = """\
import os, socket, sys, time
vip, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = [socket.create_connection((vip, port), timeout=60) for _ in range(count)]
for s in held:
    s.sendall(b"GET / HTTP/1.0\\r\\n")
for go in sys.argv[4:-1]:
    while not os.path.exists(go):
        time.sleep(0.1)
    for s in held:
        s.sendall(b"X-Kept: on\\r\\n")
while not os.path.exists(sys.argv[-1]):
    time.sleep(0.1)
for s in held:
    s.sendall(b"\\r\\n")
    while s.recv(65536):
        pass
    s.close()
"""


def established_on(lab, node, vip=ROUTED_VIP):
    """The worker addresses of `node`'s ESTABLISHED entries to `vip`:80."""
    return [str(IPv4Address(int(fields[5], 16)))
            for fields in lab.service_entries(node, vip, 80) if fields[7] == "ESTABLISHED"]


def held_on(lab, node, ifname):
    return lab.sh(node, ["ip", "-4", "-o", "address", "show", "dev", ifname]).stdout


def test_one_cluster_moves_from_mode_to_mode_with_only_that_modes_daemons(lab, fleet):
    """One cluster by apply --all: mode ecmp, a failover pair, ecmp again,
    then one balancer (lb2 taken out with apply --remove on it).  After each
    step exactly the new mode's daemons run: BIRD only in mode ecmp, and the
    router has no route once the cluster leaves it (a BIRD left running
    would keep sending half the flows to the pair's backup); exactly one
    VRRP holder in the pair; the VIPs on lo or on eth0 as the mode wants;
    and the client is served through them."""
    ecmp_path = write_cluster(lab.files / "moving-ecmp.yaml", ECMP)
    pair_path = write_cluster(lab.files / "moving-pair.yaml", PAIR)
    single_path = write_cluster(lab.files / "moving-single.yaml", SINGLE_CHECKED)
    everyone = {f"served by {w}" for w in WORKERS}

    def applied_all(path):
        done = fleet.lbctl_all("apply", str(path))
        assert done.returncode == 0, done.stdout + done.stderr

    def as_ecmp():
        for node in BALANCERS:
            assert daemons(lab, node) == {"keepalived", "bird"}, node
            assert ROUTED_VIP in held_on(lab, node, "lo"), node
            assert LAN_VIP not in held_on(lab, node, "eth0"), node
        lab.wait_for_next_hops(ROUTED_VIP, ["lb1", "lb2"])
        lab.wait_for(lambda: served_by(lab, ROUTED_VIP) == everyone, timeout=30,
                     what="every worker serving through both ECMP balancers")

    def no_routes():
        lab.wait_for(lambda: lab.next_hops(ROUTED_VIP) == [], timeout=15,
                     what="the router to have no route for the ECMP VIP")

    try:
        applied_all(ecmp_path)
        as_ecmp()

        applied_all(pair_path)
        for node in BALANCERS:
            assert daemons(lab, node) == {"keepalived"}, node
            assert ROUTED_VIP not in held_on(lab, node, "lo"), node
        no_routes()
        lab.wait_for_roles("lb1", "lb2")  # preempt, and lb1 has the higher priority
        lab.wait_for(lambda: [LAN_VIP in held_on(lab, n, "eth0") for n in BALANCERS] ==
                     [True, False], timeout=15, what="the pair's VIP on lb1 alone")
        lab.wait_for(lambda: served_by(lab, LAN_VIP) == everyone, timeout=30,
                     what="every worker serving through the pair")

        applied_all(ecmp_path)
        as_ecmp()  # the pair's VRRP instance went with the reload

        removed = lab.lbctl("lb2", "apply", str(ecmp_path), "--remove")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert daemons(lab, "lb2") == set()
        lab.wait_for_next_hops(ROUTED_VIP, ["lb1"], timeout=15)
        applied_all(single_path)
        assert daemons(lab, "lb1") == {"keepalived"}
        assert ROUTED_VIP not in held_on(lab, "lb1", "lo")
        no_routes()
        assert LAN_VIP in held_on(lab, "lb1", "eth0")
        assert LAN_VIP not in held_on(lab, "lb2", "eth0") and daemons(lab, "lb2") == set()
        lab.wait_for(lambda: served_by(lab, LAN_VIP) == everyone, timeout=30,
                     what="every worker serving through the one balancer")
    finally:
        done = fleet.lbctl_all("apply", str(single_path), "--remove")
        if done.returncode != 0 or daemons(lab, "lb2"):  # a step failed: whatever it left
            for path in (single_path, pair_path, ecmp_path):
                take_everything_away(lab, fleet, path, ["lb1", "lb2"])
