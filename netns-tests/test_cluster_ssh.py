"""The whole cluster from one machine: plan, apply, status and remove with --all,
from the client's namespace over real OpenSSH to an sshd in every node.

The tests run in order on one failover pair and share its state.
"""

import json
import os
import re
import signal
import sys
import time

import pytest
import yaml

from clusters import DNS_VIP, PAIR, TOPOLOGY, WEB_VIP, pair_edited, steady, write_cluster
from conftest import ClusterLab, measured
from lbctl import __version__
from lbctl.lab.sshd import LabSsh

NODES = ["lb1", "lb2", "pi1", "pi2", "pi3", "pi4"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab of its own, so the nodes are seen before lbctl ever touched them."""
    workdir = tmp_path_factory.mktemp("fleet")
    the_lab = ClusterLab(write_cluster(workdir / "topology.yaml", TOPOLOGY), workdir, "fl")
    the_lab.build()
    PRISTINE.update({name: node_trace(the_lab, name) for name in NODES})
    try:
        yield the_lab
    finally:
        the_lab.teardown()


@pytest.fixture(scope="module")
def fleet(lab):
    # pi3 runs the installed lbctl anew for each command, as a Pi does: the
    # entry point, a fresh interpreter and its own hash seed stay covered.
    # The others relay to their node's warm lbctl (lbctl/lab/warm_relay.py).
    ssh = LabSsh(lab, cold=["pi3"]).setup()
    yield ssh
    ssh.stop_all()


def as_root(spec):
    """The lab logs in as root and runs lbctl without sudo.  These tests
    change the pair under load and fail nothing over: steady() (1 s adverts,
    two chances for each check)."""
    return {**steady(spec), "ssh": {"user": "root"}}


@pytest.fixture(scope="module")
def pair_file(lab):
    return lab.write("fleet-pair", as_root(PAIR))


# The edit the load test rolls out: worker pi4 joins, pi3's weight changes,
# and the dns service goes, so pi1 and pi2 give up its VIP.
GROWN = pair_edited(workers=lambda w: {**w, "pi3": {**w["pi3"], "weight": 1},
                                       "pi4": {"address": "192.168.100.7"}},
                    services=lambda s: {"web": s["web"]})
PRISTINE = {}  # each node as lbctl found it, before the first apply --all


def node_trace(lab, name):
    """What lbctl could leave on a node: its addresses and routes, IPVS table, the sysctls
    lbctl sets, its daemons, nftables (a pair's takeover grace), and every file
    and link under the node's root."""
    node = lab.nodes[name]
    trace = {"addresses": sorted(lab.sh(name, ["ip", "-4", "-o", "address", "show"]).stdout
                                 .split("\n")),
             "routes": sorted(lab.sh(name, ["ip", "-4", "route", "show", "table", "all"])
                              .stdout.split("\n")),
             "ipvs": lab.ipvs_rules(name),
             "ipvs timeouts": lab.sh(name, ["ipvsadm", "-L", "--timeout"]).stdout,
             "sysctls": lab.sh(name, ["sysctl", "-a", "--pattern",
                                      r"^net\.ipv4\.(vs|conf\.(all|eth0|lo))\."],
                               check=False).stdout,
             "keepalived": lab.keepalived_pids(name), "files": {},
             "nftables": lab.sh(name, ["nft", "list", "ruleset"]).stdout}
    for folder, _dirs, files in os.walk(node.root):
        for entry in files:
            path = os.path.join(folder, entry)
            trace["files"][path] = os.readlink(path) if os.path.islink(path) else \
                open(path, "rb").read()
    return trace


def ownership_records(lab):
    """Each applied node's ownership record, as text: what lbctl holds there."""
    return {n: open(lab.path(n, "ownership_record")).read() for n in NODES[:5]}


def trace_changes(before, after):
    """{part or file: its lines gone ("- ...") and added ("+ ...")} where
    two node_trace()s differ."""
    def lines(value):
        if value is None:
            return []
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value.splitlines() if isinstance(value, str) else [repr(value)]

    pairs = {part: (before[part], after[part]) for part in before if part != "files"}
    for path in before["files"].keys() | after["files"].keys():
        pairs[path] = (before["files"].get(path), after["files"].get(path))
    changes = {}
    for what, (old, new) in pairs.items():
        if old != new:
            gone, added = lines(old), lines(new)
            changes[what] = [f"- {line}" for line in gone if line not in added] + \
                [f"+ {line}" for line in added if line not in gone]
    return changes


def lbctls_doing(changes):
    """trace_changes() less what the pair's daemons change as time passes:
    keepalived's own log (its repeated gratuitous ARPs), the takeover grace's
    set (its element expires after a takeover) and nftables' packet counts."""
    counter = re.compile(r" counter packets \d+ bytes \d+")

    def rules(lines, sign):
        return {counter.sub("", line[2:]) for line in lines
                if line.startswith(sign) and "elements = " not in line}

    left = {}
    for what, lines in changes.items():
        if what.endswith("/keepalived.log"):
            continue
        if what == "nftables" and rules(lines, "- ") == rules(lines, "+ "):
            continue
        left[what] = lines
    return left


def node_seconds(output):
    """How long each node took, from the blocks' headers: pi1=4.2s,..."""
    return ",".join(f"{n}={t}s" for n, t in re.findall(r"^== (\S+) \(.*\) ([\d.]+)s", output, re.M))


def order_of(output):
    """Node names in the order their blocks were printed."""
    return re.findall(r"^== (\S+) \(", output, re.M)


def test_apply_all_brings_a_fresh_cluster_up_in_order(lab, fleet, pair_file):
    assert lab.curl(f"http://{WEB_VIP}/", timeout=2).returncode != 0  # nothing serves the VIP

    up = fleet.lbctl_all("apply", str(pair_file))
    measured("apply --all: fresh pair, 3 workers", seconds=f"{up.seconds:.1f}",
             nodes=node_seconds(up.stdout))
    assert up.returncode == 0, up.stdout + up.stderr
    # Workers first, then the balancers: on a pair where no keepalived runs
    # yet, the master-to-be first (the first to run becomes master).
    order = order_of(up.stdout)
    assert set(order[:3]) == {"pi1", "pi2", "pi3"} and order[3:] == ["lb1", "lb2"], up.stdout
    assert "applying on master balancer lb1" in up.stderr, up.stderr
    assert "applied on 5 node(s)" in up.stdout
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 master")
    served = set(lab.ask(f"http://{WEB_VIP}/", 12))
    assert served == {"served by pi1", "served by pi2", "served by pi3"}
    # plan --all and doctor --all of the fresh pair: test_fleet_matrix's cells.

    # Stopped cleanly on both nodes (keepalived's hooks then record STOP), the
    # pair is as fresh as one that never ran: the master-to-be starts first.
    for name in ("lb1", "lb2"):
        lab.kill_keepalived(name, signal.SIGTERM)
    status = fleet.lbctl_all("status", str(pair_file), "--no-drift")
    for name, address in (("lb1", "192.168.100.2"), ("lb2", "192.168.100.5")):
        # keepalived ends the hooks still running as it stops (SIGTERM, then
        # SIGKILL): on busy CPUs the STOP hook can go before it records, and
        # status then adds the last record, "(VRRP MASTER when last recorded,
        # 9s ago)".
        assert re.search(rf"^balancer {name} \({re.escape(address)}\): keepalived not running"
                         r"( \(VRRP \w+ when last recorded, [^)]*\))?$", status.stdout, re.M), \
            status.stdout
    again = fleet.lbctl_all("apply", str(pair_file))
    assert again.returncode == 0, again.stdout + again.stderr
    assert [n for n in order_of(again.stdout) if n.startswith("lb")] == ["lb1", "lb2"], \
        again.stdout
    assert "applying on master balancer lb1" in again.stderr, again.stderr
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER" and lab.vrrp_state("lb2") == "BACKUP",
                 what="lb1 master and lb2 backup again")


def test_plan_all_finds_a_node_changed_by_hand(lab, fleet, pair_file):
    lab.sh("pi2", ["ip", "address", "del", f"{WEB_VIP}/32", "dev", "lo"])
    before = {name: node_trace(lab, name) for name in NODES}
    plan = fleet.lbctl_all("plan", str(pair_file), "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert "changes pending on pi2\n" in plan.stdout
    assert f"+ address {WEB_VIP}/32 dev lo" in plan.stdout
    # status --all says so too, for a monitor that runs it.
    status = fleet.lbctl_all("status", str(pair_file), "--detailed-exitcode")
    assert status.returncode == 2, status.stdout + status.stderr
    assert status.stdout.count("drift: none, the node matches the file") == 4, status.stdout
    pi2 = status.stdout.split("worker pi2 (192.168.100.4):")[1].split("\nworker ")[0]
    assert f"+ address {WEB_VIP}/32 dev lo" in pi2, status.stdout
    # doctor --all names it from both sides: pi2's own check, and the SYN the
    # master sent to pi2's MAC, which pi2 now drops.
    doctor = fleet.lbctl_all("doctor", str(pair_file), "--json")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    assert sorted((f["node"], f["check"]) for f in report["findings"]) == [
        ("pi2", "direct-route-dropped"), ("pi2", "vip-not-on-lo")], doctor.stdout
    assert report["not_run"] == []
    assert lab.lbctl("lb1", "validate", str(pair_file)).returncode == 0
    # None of them changed anything: the drift is still there to be applied.
    for name in NODES:
        changes = trace_changes(before[name], node_trace(lab, name))
        assert not lbctls_doing(changes), f"{name}: {json.dumps(changes, indent=1)}"


def test_an_unreachable_node_is_shown_and_stops_apply_there(lab, fleet, pair_file):
    fleet.stop("pi3")
    try:
        # One view from every node that answers: roles, tables by name, drift.
        status = fleet.lbctl_all("status", str(pair_file))
        assert status.returncode == 4, status.stdout + status.stderr  # one did not report
        text = status.stdout
        assert re.search(r"^worker pi3 \(192\.168\.100\.6\): unreachable: .*port 22", text,
                         re.M), text
        assert re.search(r"^balancer lb1 \(192\.168\.100\.2\): VRRP MASTER", text, re.M), text
        assert re.search(r"^balancer lb2 \(192\.168\.100\.5\): VRRP BACKUP", text, re.M), text
        assert f"service web (tcp {WEB_VIP}:80) wrr" in text
        assert re.search(r"worker pi3 \(192\.168\.100\.6:80\) weight 2 .* up for", text), text
        pi2 = text.split("worker pi2 (192.168.100.4):")[1].split("\nworker ")[0]
        assert pi2.startswith(" VIPs on lo 192.168.100.11;"), pi2  # the web VIP is gone
        assert f"+ address {WEB_VIP}/32 dev lo" in pi2
        assert text.count("drift: none, the node matches the file") == 3

        edit = lab.write("fleet-weight", as_root(pair_edited(
            workers=lambda w: {**w, "pi1": {**w["pi1"], "weight": 3}})))
        applied = fleet.lbctl_all("apply", str(edit))
        assert applied.returncode == 1
        assert "stopped: failed on pi3; done on pi1, pi2; not touched: lb1, lb2" in applied.stdout, \
            applied.stdout
        assert WEB_VIP in lab.sh("pi2", ["ip", "-4", "address", "show", "dev", "lo"]).stdout
        # The balancers were not touched: pi1 still has its old weight there.
        assert f"-a -t {WEB_VIP}:80 -r 192.168.100.3:80 -g -w 1" in lab.ipvs_rules("lb1")
    finally:
        fleet.start("pi3")


def test_a_bad_file_is_rejected_before_any_node_is_contacted(lab, fleet, pair_file):
    bad = lab.files / "fleet-bad.yaml"
    bad.write_text(pair_file.read_text().replace("priority: 100", "priority: 100\n    prio: 1"))
    records = ownership_records(lab)
    fleet.stop_all()  # a contact attempt would now fail with "unreachable"
    try:
        for command in ("apply", "plan", "status"):
            done = fleet.lbctl_all(command, str(bad))
            assert done.returncode == 1, command
            assert re.match(rf"{re.escape(str(bad))}:\d+:5: balancers\.lb2: unknown key 'prio'",
                            done.stderr), done.stderr
            assert done.stdout == "" and "unreachable" not in done.stderr
    finally:
        for name in NODES:
            fleet.start(name)
    assert records == ownership_records(lab)


def test_a_node_with_another_lbctl_is_named_before_any_change(lab, fleet, pair_file):
    fleet.stop("pi2")
    fleet.start("pi2", version="0.1.9")  # not yet upgraded
    records = ownership_records(lab)
    tables = {n: lab.ipvs_rules(n) for n in ("lb1", "lb2")}
    try:
        edit = lab.write("fleet-pi1-weight-3", as_root(pair_edited(
            workers=lambda w: {**w, "pi1": {**w["pi1"], "weight": 3}})))
        applied = fleet.lbctl_all("apply", str(edit))
        assert applied.returncode == 1, applied.stdout + applied.stderr
        assert "== pi2 (worker, 192.168.100.4): this node runs lbctl 0.1.9, not " \
            f"{__version__}; --all runs {__version__}" in applied.stdout, applied.stdout
        assert "lbctl install FILE --all --node NAME" in applied.stdout
        assert f"stopped before any change: pi2 must run lbctl {__version__} first" \
            in applied.stdout
        # Nothing changed anywhere: not on the nodes before pi2 in the rollout either.
        assert records == ownership_records(lab)
        assert tables == {n: lab.ipvs_rules(n) for n in ("lb1", "lb2")}
    finally:
        fleet.stop("pi2")
        fleet.start("pi2")


def test_apply_all_shows_each_plan_and_asks_and_no_changes_nothing(lab, fleet, pair_file):
    edit = lab.write("fleet-pi1-weight-3", as_root(pair_edited(
        workers=lambda w: {**w, "pi1": {**w["pi1"], "weight": 3}})))
    records = ownership_records(lab)
    tables = {n: lab.ipvs_rules(n) for n in ("lb1", "lb2")}
    # A script that forgot --yes: refused before any node is contacted.
    refused = fleet.lbctl_all("apply", str(edit), yes=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "there is no terminal to ask on: pass --yes" in refused.stderr, refused.stderr
    assert refused.stdout == ""
    assert (records, tables) == (ownership_records(lab), {n: lab.ipvs_rules(n)
                                                          for n in ("lb1", "lb2")})
    # On a terminal: every node's plan, then the question; "n" changes nothing.
    status, shown, asked = fleet.lbctl_all_on_a_terminal("apply", str(edit), answer="n\n")
    assert (status, asked) == (1, True), shown
    for node in ("lb1", "lb2", "pi1", "pi2", "pi3"):
        assert f"== {node} (" in shown, shown
    question = re.search(r"^Apply these changes to (.*)\? \[y/N\] n$", shown, re.M)
    assert question and {"lb1", "lb2"} <= set(question[1].split(", ")), shown
    assert shown.rstrip().endswith("cancelled; nothing was changed"), shown
    assert (records, tables) == (ownership_records(lab), {n: lab.ipvs_rules(n)
                                                          for n in ("lb1", "lb2")})
    # "y", but pi3 changed while the plans were read (its web VIP taken off
    # lo by hand): pi3's plan is not the one agreed to, so pi3 changes
    # nothing, says why, and the rollout stops before the balancers.
    on_lo = ["ip", "-4", "address", "show", "dev", "lo"]
    status, shown, asked = fleet.lbctl_all_on_a_terminal(
        "apply", str(edit), answer="y\n",
        meanwhile=lambda: lab.sh("pi3", ["ip", "address", "del", f"{WEB_VIP}/32", "dev", "lo"]))
    assert (status, asked) == (1, True), shown
    assert "this node's plan is no longer the one planned before any node changed" in shown, shown
    assert "stopped: failed on pi3; done on pi1, pi2; not touched: lb1, lb2" in shown, shown
    assert f"{WEB_VIP}/32" not in lab.sh("pi3", on_lo).stdout
    assert tables == {n: lab.ipvs_rules(n) for n in ("lb1", "lb2")}
    # Asked again, the plans shown include pi3's VIP; "y" goes ahead, in the
    # rollout's order.
    status, shown, asked = fleet.lbctl_all_on_a_terminal("apply", str(edit), answer="y\n")
    assert (status, asked) == (0, True), shown
    assert f"+ address {WEB_VIP}/32 dev lo" in shown, shown
    assert "applied on 5 node(s)" in shown, shown
    assert f"{WEB_VIP}/32" in lab.sh("pi3", on_lo).stdout
    for node in ("lb1", "lb2"):
        assert f"-a -t {WEB_VIP}:80 -r 192.168.100.3:80 -g -w 3" in lab.ipvs_rules(node)


def test_apply_all_of_an_edit_under_load_fails_no_request(lab, fleet, pair_file):
    # The edit adds worker pi4 and changes pi3's weight: pi4 must hold the VIP
    # before any balancer sends it a request.
    edit = lab.write("fleet-grow", as_root(GROWN))
    capture = lab.start_capture()
    load = lab.start_load(interval=0.1, timeout=1)
    applied = fleet.lbctl_all("apply", str(edit))
    records = lab.stop_load(load)
    failed = [r for r in records if not r[2]]
    seen = lab.stop_capture(capture, failed)
    measured("apply --all of an edit under load", seconds=f"{applied.seconds:.1f}",
             failed=f"{len(failed)}/{len(records)}", nodes=node_seconds(applied.stdout))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # Workers add first; the balancers stop using the dns VIP; only then do
    # pi1 and pi2 let go of it.
    order = order_of(applied.stdout)
    assert set(order[:4]) == {"pi1", "pi2", "pi3", "pi4"} and set(order[4:6]) == {"lb1", "lb2"}
    # The backup before the master.  The VIPs change, yet the adverts carry
    # only the pair's fixed anchor: lb2, reloaded first, keeps hearing lb1
    # and stays backup (had it taken the VIPs, a request would have failed).
    assert "applying on backup balancer lb2" in applied.stderr, applied.stderr
    assert order[4:6] == ["lb2", "lb1"], applied.stderr
    assert order[6:] == ["pi1", "pi2"], applied.stdout
    assert f"left for the next apply: - address {DNS_VIP}/32 dev lo" in applied.stdout
    for worker in ("pi1", "pi2"):
        assert DNS_VIP not in lab.sh(worker, ["ip", "-4", "address", "show", "dev", "lo"]).stdout
    assert failed == [], seen
    assert {r[3] for r in records} >= {"served by pi1", "served by pi2", "served by pi3"}
    lab.wait_for(lambda: "served by pi4" in lab.ask_web(8), timeout=20, what="pi4 serving")
    assert f"-a -t {WEB_VIP}:80 -r 192.168.100.6:80 -g -w 1" in lab.ipvs_rules("lb1")


def test_rollout_updates_a_batch_of_workers_under_load_and_fails_no_request(lab, fleet):
    grown = lab.files / "fleet-grow.yaml"
    # The update a person would push: each worker's page, replaced atomically,
    # with its web server frozen for 3 s meanwhile.  A request sent to a worker
    # the rollout had not truly drained would hang past the load's 2 s and fail.
    # pi3 and pi4 go together, as one batch of two; pi1 and pi2, before
    # --start-at, are left alone.  (One worker after another is the next test's.)
    for worker in ("pi3", "pi4"):
        (lab.files / f"{worker}.httpd.pid").write_text(f"{lab.web_server(worker).pid}\n")
    page = f'{lab.workdir}/"$LBCTL_WORKER"-www/index.html'
    pid = f'$(cat {lab.files}/"$LBCTL_WORKER".httpd.pid)'
    command = (f'kill -STOP {pid} && sleep 3 && '
               f'printf "served by %s v2\\n" "$LBCTL_WORKER" > {page}.new && '
               f'mv {page}.new {page} && kill -CONT {pid}')
    capture = lab.start_capture()
    load = lab.start_load(interval=0.1, timeout=2)
    started = time.monotonic()
    rolled = rollout(lab, fleet, grown, "--exec", command, "--batch", "2", "--start-at", "pi3")
    seconds = time.monotonic() - started
    records = lab.stop_load(load)
    failed = [r for r in records if not r[2]]
    seen = lab.stop_capture(capture, failed)
    measured("rollout of a batch of 2 workers under load", seconds=f"{seconds:.1f}",
             failed=f"{len(failed)}/{len(records)}")
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "rolled out to 2 worker(s): pi3, pi4" in rolled.stdout
    # A failure shows the wire near it and what each balancer's checks did.
    assert failed == [], "\n".join([str(failed[:12]), seen, *(
        f"--- {node}'s keepalived:\n{lab.keepalived_log(node, lines=60)}"
        for node in ("lb1", "lb2"))])
    assert {r[3] for r in records} >= {"served by pi3 v2", "served by pi4 v2"}
    pages = {"served by pi1", "served by pi2", "served by pi3 v2", "served by pi4 v2"}
    lab.wait_for(lambda: set(lab.ask_web(12)) == pages, timeout=20,
                 what="pi3 and pi4 serving the new page, pi1 and pi2 the old")
    # Every worker is back at the file's weight on both balancers.
    for node in ("lb1", "lb2"):
        assert f"-a -t {WEB_VIP}:80 -r 192.168.100.6:80 -g -w 1" in lab.ipvs_rules(node)
        assert f"-a -t {WEB_VIP}:80 -r 192.168.100.7:80 -g -w 1" in lab.ipvs_rules(node)


def test_a_failing_update_stops_the_rollout_with_its_worker_drained(lab, fleet):
    grown = lab.files / "fleet-grow.yaml"
    # From pi3: its update works, the second worker's (pi4's) fails.
    ran = lab.files / "rollout-ran"
    failing = f'echo "$LBCTL_WORKER" >> {ran} && [ "$LBCTL_WORKER" != pi4 ] || exit 3'
    rolled = rollout(lab, fleet, grown, "--exec", failing, "--start-at", "pi3")
    assert rolled.returncode == 1
    assert "stopped at pi4: the command exited 3 for pi4." in rolled.stdout, rolled.stdout
    assert "done: pi3; not started: none" in rolled.stdout, rolled.stdout
    assert ran.read_text() == "pi3\npi4\n"
    resume = re.search(r"to resume once fixed: lbctl rollout (\S+) --exec \.\.\. "
                       r"--start-at (\S+)", rolled.stdout)
    assert resume and resume[2] == "pi4", rolled.stdout
    # pi4 stays drained on both balancers; the others serve at the file's weights.
    for node in ("lb1", "lb2"):
        rules = lab.ipvs_rules(node)
        assert f"-a -t {WEB_VIP}:80 -r 192.168.100.7:80 -g -w 0" in rules
        for address in ("192.168.100.3", "192.168.100.4", "192.168.100.6"):
            assert f"-a -t {WEB_VIP}:80 -r {address}:80 -g -w 1" in rules, rules
    assert "served by pi4" not in " ".join(lab.ask_web(8))
    # The resume it printed, with the command fixed, finishes the job.
    resumed_whole = False
    try:
        resumed = rollout(lab, fleet, resume[1], "--exec", f'echo "$LBCTL_WORKER" >> {ran}',
                          "--start-at", resume[2])
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "rolled out to 1 worker(s): pi4" in resumed.stdout, resumed.stdout
        assert ran.read_text() == "pi3\npi4\npi4\n"
        for node in ("lb1", "lb2"):
            assert f"-a -t {WEB_VIP}:80 -r 192.168.100.7:80 -g -w 1" in lab.ipvs_rules(node)
        resumed_whole = True
    finally:
        if not resumed_whole:  # pi4 may still be drained: the next tests need it serving
            fleet.lbctl_all("undrain", "pi4", str(grown))


def rollout(lab, fleet, cluster_file, *args):
    """lbctl rollout from the client namespace, as a person on a laptop runs it."""
    return lab.sh("client", [sys.executable, "-m", "lbctl", "rollout", str(cluster_file), *args,
                             "--yes", "--ssh-config", fleet.config], check=False, timeout=1200)


def test_remove_all_leaves_no_trace_of_lbctl(lab, fleet, pair_file):
    grown = lab.files / "fleet-grow.yaml"
    removed = fleet.lbctl_all("apply", str(grown), "--remove")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    # Balancers first, backup before master, so no request is sent to a worker
    # that has let go of the VIP.
    order = order_of(removed.stdout)
    assert order[:2] == ["lb2", "lb1"] and set(order[2:]) == {"pi1", "pi2", "pi3", "pi4"}
    after = {name: node_trace(lab, name) for name in NODES}
    for name in NODES:
        assert after[name] == PRISTINE[name], name


# The dependencies' wheels `./dev.sh setup` fetched: the lab VM has no network.
NODE_WHEELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           ".venv", "node-wheels")
GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "docs", "real-cluster.md")
GUIDE_NODES = ["lb1", "lb2", "pi1", "pi2", "pi3"]


def guide_steps(text):
    """docs/real-cluster.md as the lab acts it out, in order: ("file", the
    cluster file's YAML), ("run", argv, the exit status its comment names
    (0 if none), the output shown after it or None) for each `lbctl` or
    `ssh` line of a sh block, and ("lab", what) for a `<!-- lab: ... -->`
    mark, where a person acts by hand (pulls a cable)."""
    import shlex

    steps, fence, block, waiting_for_file = [], None, [], False
    for line in text.splitlines():
        if fence is None:
            if line.startswith("```"):
                fence, block = line[3:].strip(), []
                # Commands the lab runs are in sh blocks, what it cannot run
                # in text blocks: any other kind would be skipped unseen.
                assert fence in ("sh", "text", "yaml"), f"a {fence!r} block in the guide"
            elif line.lstrip().startswith("```"):  # inside a list item: not run either
                assert line.strip() in ("```", "```text"), f"an indented block: {line!r}"
            elif line.startswith("<!-- lab: ") and line.endswith(" -->"):
                what = line[len("<!-- lab: "):-len(" -->")]
                waiting_for_file = what == "the cluster file"
                if not waiting_for_file:
                    steps.append(("lab", what))
            elif line.strip():
                waiting_for_file = False
            continue
        if not line.startswith("```"):
            block.append(line)
            continue
        if fence == "yaml" and waiting_for_file:
            steps.append(("file", "\n".join(block) + "\n"))
            waiting_for_file = False
        elif fence == "sh":
            for command in block:
                words = shlex.split(command, comments=True)
                if not words:
                    continue
                # The guide says the lab runs every command of a sh block:
                # one it cannot run belongs in a text block.
                assert words[0] in ("lbctl", "ssh"), f"the lab cannot run {command!r}"
                if "--watch" in words:
                    steps.append(("watch", words))
                    continue
                exits = re.search(r"# exits (\d+)", command)
                steps.append(["run", words, int(exits[1]) if exits else 0, None])
        elif fence == "text" and steps and steps[-1][0] == "run" and steps[-1][3] is None:
            steps[-1][3] = block
        fence = None
    return [tuple(step) for step in steps]


def _shown(text):
    """Output lines as the guide compares them: durations, which vary
    between runs (12.3s, and status's 18s, 2m or 1h), read as N."""
    return re.sub(r"\b\d+(\.\d+)?[smh]\b", "N", text.rstrip())


def not_as_shown(shown, output):
    """Why `output` is not what the guide `shows` after a command, or None
    if it is.  The guide's lines come in the output's order; lines with no
    `...` between them follow each other there; and a block that does not
    start (end) with `...` shows the output's first (last) line.  Blank
    lines count on neither side."""
    printed = [_shown(line) for line in output.splitlines() if line.strip()]
    runs, run = [], []  # the guide's lines between its `...`s
    for line in [line for line in shown if line.strip()]:
        if line.strip() == "...":
            runs.append(run)
            run = []
        else:
            run.append(_shown(line))
    runs.append(run)
    at = 0
    for number, run in enumerate(runs):
        if not run:
            continue
        first, last = number == 0, number == len(runs) - 1
        starts = [i for i in range(at, len(printed) - len(run) + 1)
                  if printed[i:i + len(run)] == run
                  and (not first or i == 0) and (not last or i + len(run) == len(printed))]
        if not starts:
            where = ("the first lines" if first else "the last lines" if last
                     else "lines in this order")
            return f"the guide shows {run} as {where}, after {printed[:at][-1:]}"
        at = starts[0] + len(run)
    return None


def test_the_first_hour_guide_runs_as_written(lab, fleet):
    """docs/real-cluster.md, from a client onto nodes with nothing of lbctl
    but the system's python3 and sshd: each of its lbctl and ssh commands
    run in order, each exits as the guide says, and prints every line the
    guide shows after it (... elides).  The cable it pulls is pulled.  The
    lab differs from a laptop in three things only: ssh logs in as root
    (lbctl there runs without sudo), the nodes install offline (--wheels), and the
    wheel is this checkout's.  In the end each node is as it was found:
    install, apply, uninstall left nothing behind."""
    from lbctl.commands import cluster_install

    steps = guide_steps(open(GUIDE).read())
    ((_, spec),) = [s for s in steps if s[0] == "file"]
    assert "  user: pi\n" in spec, spec
    path = lab.files / "cluster.yaml"
    path.write_text(spec.replace("  user: pi\n", "  user: root\n"))
    before = {name: node_trace(lab, name) for name in GUIDE_NODES}
    fleet.use_installed(GUIDE_NODES)
    cluster, watch, unlike, seen = yaml.safe_load(spec)["cluster"], None, [], {}
    known_hosts = os.path.join(fleet.dir, "known_hosts")
    with open(known_hosts) as fh:
        recorded = fh.read()
    with cluster_install._wheel(None) as wheel:
        try:
            # The laptop has met no Pi yet: the guide's first ssh lines
            # record their host keys, which lbctl then checks.
            open(known_hosts, "w").close()
            met = fleet.lbctl_all("plan", str(path))
            assert "Host key verification failed." in met.stdout + met.stderr, met.stdout + met.stderr
            for step in steps:
                if step[0] == "lab":
                    act_out(lab, step[1], cluster, watch, seen)
                elif step[0] == "watch":
                    watch = watch_from_the_guide(fleet, step[1])
                elif step[0] == "run":
                    _, words, exits, shown = step
                    started = time.monotonic()
                    done = run_from_the_guide(fleet, words, str(path), wheel)
                    took = time.monotonic() - started  # where the suite's time goes
                    output = (done.stdout + done.stderr).replace(str(path), "cluster.yaml")
                    said = (f"$ {' '.join(words)}   (exit {done.returncode}, {took:.1f} s)\n"
                            f"{output}")
                    print(said)  # what the guide's samples are taken from
                    if words[1:2] == ["install"] and "nothing to change" not in output:
                        measured("install --all: 5 bare nodes, offline",
                                 seconds=f"{done.seconds:.1f}", nodes=node_seconds(output))
                    assert done.returncode == exits, said
                    differs = not_as_shown(shown or ["..."], output)
                    if differs is not None:  # every such difference, shown at the end
                        unlike.append(f"{differs}, but:\n{said}")
            assert not unlike, "\n\n".join(unlike)
        finally:
            if watch is not None:
                watch.close()
            with open(known_hosts, "w") as fh:
                fh.write(recorded)
            fleet.use_installed([])
    after = {name: node_trace(lab, name) for name in GUIDE_NODES}
    for name in GUIDE_NODES:
        assert lbctls_doing(trace_changes(before[name], after[name])) == {}, name


def run_from_the_guide(fleet, words, path, wheel):
    """One command of the guide, from the client: `cluster.yaml` is the
    lab's file; apply --all (with or without --remove) on a terminal,
    answered y, as a person runs it."""
    import subprocess

    if words[0] == "ssh":
        return fleet.lab.sh("client", ssh_as_the_lab(fleet, words), check=False)
    args = [path if w == "cluster.yaml" else w for w in words[1:]]
    if "--wheel" in args:
        args[args.index("--wheel") + 1] = wheel
        args += ["--wheels", NODE_WHEELS]
    if args[0] == "apply" and "--all" in args and "--yes" not in args:
        args.remove("--all")
        status, shown, asked = fleet.lbctl_all_on_a_terminal(*args, answer="y\n")
        assert asked, shown
        done = subprocess.CompletedProcess(args, status, shown, "")
        done.seconds = 0.0
        return done
    if "--all" in args:
        args += ["--ssh-config", fleet.config]
    return fleet.from_client(args, timeout=1200, merged=True)


def ssh_as_the_lab(fleet, words):
    """The guide's `ssh [OPTION...] pi@ADDRESS [sudo] COMMAND...` as the lab
    runs it: with the lab's ssh config, logged in as root, so without sudo."""
    at = next(i for i, word in enumerate(words) if "@" in word)
    remote = words[at + 1:]
    if remote[:1] == ["sudo"]:
        remote = remote[1:]
    return ["ssh", "-F", fleet.config, *words[1:at], "root@" + words[at].rpartition("@")[2],
            *remote]


def watch_from_the_guide(fleet, words):
    """The guide's `ssh -t pi@ADDRESS sudo lbctl status --watch`, in a
    terminal on the client, left running."""
    import shlex

    from terminal import Tmux

    argv = ["ip", "netns", "exec", fleet.lab.nodes["client"].netns,
            *ssh_as_the_lab(fleet, words)]
    watch = Tmux("lbctl-guide")
    try:
        watch.start(["bash", "-c", f"{shlex.join(argv)}; echo exited $?; exec sleep 600"])
    except BaseException:
        watch.close()
        raise
    return watch


def frame_time(screen):
    """The clock time in the header of the status --watch frame on `screen`."""
    found = re.search(r"lbctl status --watch +(\d\d:\d\d:\d\d)", screen)
    return found and found[1]


def act_out(lab, what, cluster, watch, seen):
    """What a person does by hand at a `<!-- lab: ... -->` mark of the
    guide; `watch`: the terminal running the guide's status --watch;
    `seen`: what one mark noted for a later one."""
    if what == "pull lb1's cable":
        watch.wait_for(lab, lambda screen: f"cluster {cluster}: VRRP BACKUP" in screen,
                       timeout=60, what="the watch to show lb2 as the backup")
        lab.set_link("lb1", False)
        lab.wait_for(lambda: lab.vrrp_state("lb2", cluster) == "MASTER", what="lb2 to take over")
        watch.wait_for(lab, lambda screen: f"cluster {cluster}: VRRP MASTER" in screen,
                       timeout=30, what="the watch to show lb2 taking over")
    elif what == "plug lb1's cable back in":
        lab.set_link("lb1", True)
        lab.wait_for(lambda: lab.vrrp_state("lb1", cluster) == "BACKUP",
                     what="lb1 back as the backup")
        seen["lb1 back"] = frame_time(watch.screen())
    elif what == "leave the watch":
        # lb1 came back as the backup: lb2 is still the master, as the guide
        # says, in a frame drawn since (the one on screen may be older).
        watch.wait_for(lab, lambda screen: frame_time(screen) != seen["lb1 back"], timeout=30,
                       what="a frame drawn after lb1 came back")
        assert f"cluster {cluster}: VRRP MASTER" in watch.screen(), watch.screen()
        watch.keys("q")
        watch.wait_for(lab, lambda screen: "exited " in screen, timeout=30,
                       what="the watch to end")
        assert "exited 0" in watch.screen(), watch.screen()
    elif what == "the pair serves":
        # Each worker by its name: an earlier test's rollout left pi3's page a
        # new version ("served by pi3 v2").
        def workers(answers):
            return [a.split()[2] for a in answers if a.startswith("served by ")]

        lab.wait_for(lambda: set(workers(lab.ask(f"http://{WEB_VIP}/", 12))) == {"pi1", "pi2", "pi3"},
                     timeout=30, what="the pair serving through the lbctl installed on the nodes")
        # pi3 twice as often as each of the others, as the guide says: its weight is 2.
        served = workers(lab.ask(f"http://{WEB_VIP}/", 40))
        counts = {name: served.count(name) for name in ("pi1", "pi2", "pi3")}
        assert len(served) == 40 and counts["pi3"] >= 1.5 * max(counts["pi1"], counts["pi2"]), counts
    else:
        raise AssertionError(f"the guide marks a step the lab does not know: {what!r}")
