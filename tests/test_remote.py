"""--all's pure parts: which nodes, in what order, and the ssh command line."""

import json
import os
import shlex
from pathlib import Path

import pytest

from helpers import PI_ECMP, cluster_from, keepalived_status, node_status, service_status
from lbctl import __version__
from lbctl.errors import NodeError
from lbctl.remote.fleet import advert_changes, balancer_order, rollout_stages, select
from lbctl.render.keepalived import vrrp_anchor
from lbctl.remote.ssh import Outcome, Target, ssh_argv, targets

PAIR = """\
cluster: pi-web
balancers:
  lb1: {address: 192.168.100.2, interface: eth0, priority: 150}
  lb2: {address: 192.168.100.5, interface: eth0, priority: 100}
workers:
  pi1: {address: 192.168.100.3}
  pi2: {address: 192.168.100.4}
services:
  web: {vip: 192.168.100.10, port: 80}
"""
PAIR_WITH_CHECKS = PAIR.replace("port: 80}", "port: 80, health: {http: {path: /}}}")


def stages(text, states, removing=False, names=None, vips=None):
    """`states`: {node: VRRP state}, each advertising `vips` (None: says nothing)."""
    cluster = cluster_from(text)
    reported = {node: {"state": state, "advertised_addresses": vips} for node, state in states.items()}
    return [(label, [t.node for t in group]) for label, group in
            rollout_stages(cluster, select(cluster, names), lambda: reported, removing)]


def test_workers_first_then_the_backup_then_the_master_as_they_are_now():
    # lb2 is master after a failover without preemption: it goes last.
    assert stages(PAIR, {"lb1": "BACKUP", "lb2": "MASTER"}) == [
        ("workers", ["pi1", "pi2"]), ("backup balancer", ["lb1"]), ("master balancer", ["lb2"])]
    # Nothing reported: the lower priority goes first.
    assert stages(PAIR, {}) == [
        ("workers", ["pi1", "pi2"]), ("backup balancer", ["lb2"]), ("master balancer", ["lb1"])]
    # Both answered and no keepalived runs yet: the first to start becomes
    # master, and stays so without preemption, so the higher priority starts first.
    assert stages(PAIR, {"lb1": None, "lb2": None}) == [
        ("workers", ["pi1", "pi2"]), ("master balancer", ["lb1"]), ("backup balancer", ["lb2"])]
    # Taking away a pair that runs nothing: the same order, the same names.
    assert stages(PAIR, {"lb1": None, "lb2": None}, removing=True)[:2] == [
        ("master balancer", ["lb1"]), ("backup balancer", ["lb2"])]


def test_the_master_goes_first_when_what_its_adverts_carry_changes():
    # A backup reloaded with other advertised addresses than its master's would
    # ignore the master's adverts and take the VIPs: an lbctl that advertised
    # the VIPs themselves is followed by one that advertises its fixed anchor.
    now = {"lb1": "MASTER", "lb2": "BACKUP"}
    assert stages(PAIR, now, vips=["192.168.100.10"]) == [
        ("workers", ["pi1", "pi2"]), ("master balancer", ["lb1"]), ("backup balancer", ["lb2"])]
    anchor = [vrrp_anchor(cluster_from(PAIR))]
    assert stages(PAIR, now, vips=anchor)[1:] == [("backup balancer", ["lb2"]),
                                                  ("master balancer", ["lb1"])]
    assert stages(PAIR, now, vips=None)[1:] == [("backup balancer", ["lb2"]),
                                                ("master balancer", ["lb1"])]
    # Taking lbctl away: the backup still stops first.
    assert stages(PAIR, now, removing=True, vips=["192.168.100.11"])[:2] == [
        ("backup balancer", ["lb2"]), ("master balancer", ["lb1"])]




def test_ecmp_balancers_go_one_at_a_time_and_none_is_asked_for_a_vrrp_role():
    def never():
        raise AssertionError("mode ecmp has no VRRP role to ask for")

    cluster = cluster_from(PI_ECMP)
    found = [(label, [t.node for t in group])
             for label, group in rollout_stages(cluster, select(cluster), never)]
    assert found == [("workers", ["pi1", "pi2"]), ("balancer", ["lb1"]),
                     ("balancer", ["lb2"]), ("balancer", ["lb3"])]
    removing = [(label, [t.node for t in group])
                for label, group in rollout_stages(cluster, select(cluster), never, True)]
    assert removing == [("balancer", ["lb1"]), ("balancer", ["lb2"]), ("balancer", ["lb3"]),
                        ("workers", ["pi1", "pi2"])]


def test_remove_takes_the_balancers_away_before_the_workers():
    assert stages(PAIR, {"lb1": "MASTER", "lb2": "BACKUP"}, removing=True) == [
        ("backup balancer", ["lb2"]), ("master balancer", ["lb1"]), ("workers", ["pi1", "pi2"])]


def test_node_selects_some_and_an_unknown_name_fails_before_any_contact():
    assert stages(PAIR, {}, names="pi2,lb1") == [("workers", ["pi2"]), ("balancer", ["lb1"])]
    with pytest.raises(NodeError, match="--node: pi9 not in"):
        select(cluster_from(PAIR), "pi1,pi9")


def test_the_ssh_command_quotes_every_word_and_uses_the_file_s_settings():
    cluster = cluster_from(PAIR + "ssh: {user: pi, port: 2222, hosts: {lb1: lb1.lan}}\n")
    found = targets(cluster)
    argv = ssh_argv(found["lb1"], ["apply", "-", "--node", "lb1"], ssh_config="/etc/x y")
    assert argv[:6] == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    # The user's agent and X display stay at home.
    options = {argv[i + 1] for i, word in enumerate(argv) if word == "-o"}
    assert {"ForwardAgent=no", "ForwardX11=no"} <= options
    assert argv[-9:-1] == ["-F", "/etc/x y", "-l", "pi", "-p", "2222", "--", "lb1.lan"]
    # A user other than root runs lbctl through sudo; the remote shell sees one quoted line.
    words = ["lbctl", "--expect-version", __version__, "apply", "-", "--node", "lb1"]
    assert argv[-1] == (f'if [ "$(id -u)" = 0 ]; then exec {shlex.join(words)}; '
                        f'else exec sudo -n {shlex.join(words)}; fi')
    assert found["pi1"].host == "192.168.100.3"  # by default a node is reached at its address
    # The login may come from ~/.ssh/config: sudo unless the file says root.
    default = targets(cluster_from(PAIR))["pi1"]
    assert default.sudo and "-l" not in ssh_argv(default, ["plan", "-"])
    # The remote side runs it through its shell, sudo only when not root already.
    import subprocess

    fake = subprocess.run(["sh", "-c", ssh_argv(default, ["plan", "-"])[-1].replace(
        "exec lbctl", "exec echo lbctl").replace("exec sudo -n", "exec echo sudo -n")],
        capture_output=True, text=True).stdout.split()
    assert fake[:3] == (["lbctl", "--expect-version", __version__] if os.geteuid() == 0 else
                        ["sudo", "-n", "lbctl"])
    root = targets(cluster_from(PAIR + "ssh: {user: root}\n"))["pi1"]
    assert not root.sudo and shlex.split(ssh_argv(root, ["plan", "-"])[-1])[0] == "lbctl"


def test_a_node_s_failure_is_told_in_words_a_person_can_act_on():
    t = targets(cluster_from(PAIR))["pi1"]
    assert Outcome(t, 255, "", "ssh: connect to host 192.168.100.3 port 22: Connection refused\n"
                   ).problem() == "unreachable: ssh: connect to host 192.168.100.3 port 22: " \
                                  "Connection refused"
    assert "lbctl is not installed" in Outcome(t, 127, "", "sh: 1: lbctl: not found").problem()
    assert "lbctl is not installed" in Outcome(t, 1, "", "sudo: lbctl: command not found").problem()
    # An apply error that quotes a unit's journal is lbctl's own error, not a missing lbctl.
    assert Outcome(t, 1, "", "lbctl: apply: ...\n  modprobe: command not found").problem() is None
    other = Outcome(t, 3, "", "lbctl: this node runs lbctl 0.1.0, not 0.2.0\n").problem()
    assert other.startswith(f"this node runs lbctl 0.1.0, not 0.2.0; --all runs {__version__} and")
    assert "lbctl install FILE --all --node NAME" in other
    older = Outcome(t, 2, "", "lbctl: error: unrecognized arguments: --expect-version 0.2.0")
    assert older.problem().startswith("this node runs an lbctl older than 0.2; --all runs")
    assert Outcome(t, 1, "", "lbctl: apply: failed").problem() is None  # lbctl's own error


def test_workers_give_up_old_vips_only_after_every_balancer_stopped_using_them():
    from lbctl.commands.cluster_apply import _second_pass

    cluster = cluster_from(PAIR)
    every = select(cluster)
    workers = [t for t in every if t.role == "worker"]
    finish, wait, _ = _second_pass(cluster, every, workers, draining=set())
    assert [t.node for t in finish] == ["pi1", "pi2"] and wait == []
    # pi2 still has connections draining on a balancer: its VIP stays for now.
    finish, wait, why = _second_pass(cluster, every, workers, draining={"192.168.100.4"})
    assert [t.node for t in finish] == ["pi1"] and wait == ["pi2"]
    assert why == "a balancer still drains connections to them"
    # Only some nodes in this run (--node pi1,pi2): the balancers still send the old VIP.
    some = select(cluster, "pi1,pi2,lb1")
    finish, wait, why = _second_pass(cluster, some, workers, draining=set())
    assert finish == [] and wait == ["pi1", "pi2"]
    assert why == "not every balancer was applied in this run"


def test_rollout_waits_a_detection_time_then_for_every_balancer_to_see_the_worker_up():
    from lbctl.commands.rollout import detection_seconds, checked_services, wait_healthy

    cluster = cluster_from(PAIR_WITH_CHECKS)
    balancers = [t for t in targets(cluster).values() if t.role == "balancer"]
    now = [100.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    answers = iter([{"lb1": {("web", "pi2"): "up"}, "lb2": {("web", "pi2"): "down"}},
                    {"lb1": {("web", "pi2"): "up"}, "lb2": None},
                    {"lb1": {("web", "pi2"): "up"}, "lb2": {("web", "pi2"): "up"}}])
    ok, how = wait_healthy(cluster, balancers, "pi2", 100.0, 60, None, clock=lambda: now[0],
                           sleep=sleep, ask=lambda: next(answers))
    assert ok and how == "healthy on lb1, lb2"
    # First a whole detection time: a server the command broke is seen down before "up" counts.
    assert slept[0] == detection_seconds(checked_services(cluster, "pi2")) == 2 * (2 + 1) + 2


def test_rollout_gives_up_naming_what_is_not_healthy_where():
    from lbctl.commands.rollout import wait_healthy

    cluster = cluster_from(PAIR_WITH_CHECKS)
    balancers = [t for t in targets(cluster).values() if t.role == "balancer"]
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    ok, why = wait_healthy(cluster, balancers, "pi2", 0.0, 30, None, clock=lambda: now[0],
                           sleep=sleep, ask=lambda: {"lb1": {("web", "pi2"): "down"}, "lb2": {}})
    assert not ok
    assert why == "web on lb1: down; web on lb2: not reported"


def test_rollout_without_checks_needs_no_wait():
    from lbctl.commands.rollout import wait_healthy

    cluster = cluster_from()
    ok, how = wait_healthy(cluster, [], "pi2", 0.0, 30, None, ask=lambda: 1 / 0)
    assert ok and "no health check" in how


def _apply_all_yes(monkeypatch, tmp_path, answer):
    """apply --all --yes of PAIR, each node answering `answer(target)`: (exit
    status, what it printed, the arguments each node was given)."""
    import io
    from types import SimpleNamespace

    from lbctl.commands import cluster_apply

    asked = []

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        asked.extend(tuple(args_for(t)) for t in targets_)
        return {t.node: answer(t) for t in targets_}
    monkeypatch.setattr(cluster_apply, "run_on_each", on_each)
    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)
    out = io.StringIO()
    args = SimpleNamespace(file=str(path), node=None, ssh_config=None, remove=False, force=False,
                           yes=True)
    return cluster_apply.run(args, out), out.getvalue(), asked


def test_apply_all_names_a_node_with_another_lbctl_before_any_node_changes(monkeypatch, tmp_path):
    status, text, asked = _apply_all_yes(monkeypatch, tmp_path, lambda t: (
        Outcome(t, 3, "", f"lbctl: this node runs lbctl 0.1.9, not {__version__}\n")
        if t.node == "pi2" else Outcome(t, 0, f"lbctl {__version__}\n", "")))
    assert status == 1
    assert set(asked) == {("--version",)}  # only the check ran
    assert "== pi2 (worker, 192.168.100.4): this node runs lbctl 0.1.9, not" in text
    assert "lbctl install FILE --all --node NAME" in text
    assert text.endswith(f"stopped before any change: pi2 must run lbctl {__version__} first; "
                         "not touched: lb1, lb2, pi1, pi2\n"), text


def test_an_lbctl_that_answers_the_version_check_with_another_version_is_named(monkeypatch,
                                                                              tmp_path):
    """An lbctl from before --version answered --expect-version prints its
    version and exits 0: apply --all still stops before any change."""
    status, text, asked = _apply_all_yes(monkeypatch, tmp_path, lambda t: Outcome(
        t, 0, "lbctl 0.2.9\n" if t.node == "lb2" else f"lbctl {__version__}\n", ""))
    assert status == 1 and set(asked) == {("--version",)}
    assert f"== lb2 (balancer, 192.168.100.5): this node runs lbctl 0.2.9, not {__version__}" \
        in text, text
    assert text.endswith(f"stopped before any change: lb2 must run lbctl {__version__} first; "
                         "not touched: lb1, lb2, pi1, pi2\n"), text


def test_the_version_check_reads_past_what_a_login_shell_prints():
    from lbctl.commands.cluster_apply import _version_told

    target = Target("pi1", "worker", "192.168.100.3")
    welcome = "Welcome to pi1\nlbctl 9.9 is what the motd says\n"
    same = _version_told(Outcome(target, 0, f"{welcome}lbctl {__version__}\n", ""))
    assert not same.other_version and same.returncode == 0
    other = _version_told(Outcome(target, 0, f"{welcome}lbctl 0.2.9\n", ""))
    assert other.other_version
    assert other.problem().startswith(f"this node runs lbctl 0.2.9, not {__version__}")


def test_an_lbctl_older_than_the_version_check_is_named_as_older():
    """Before 0.2, argparse took the version after --expect-version for the command."""
    target = Target("pi1", "worker", "192.168.100.3")
    older = Outcome(target, 2, "", "usage: lbctl [-h] COMMAND ...\nlbctl: error: argument "
                    f"COMMAND: invalid choice: '{__version__}' (choose from 'plan', 'apply')\n")
    assert older.other_version
    assert "older than 0.2" in older.problem()


def test_drain_all_asks_every_balancer_first_and_changes_none_when_one_refuses(monkeypatch,
                                                                                tmp_path):
    import io
    from types import SimpleNamespace

    from lbctl.commands import cluster_drain

    asked = []

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        found = {}
        for t in targets_:
            asked.append((t.node, tuple(args_for(t))))
            refuses = t.node == "lb2" and "--check" in args_for(t)
            found[t.node] = Outcome(t, 64, "", "lbctl: draining pi1 would leave service web "
                                    "with no worker taking new connections\n") if refuses \
                else Outcome(t, 0, "pi1 can be drained\n", "")
        return found
    monkeypatch.setattr(cluster_drain, "run_on_each", on_each)
    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)
    args = SimpleNamespace(command="drain", file=str(path), worker="pi1", service=None,
                           node=None, ssh_config=None, force=False, wait=False, timeout=900)
    out = io.StringIO()
    assert cluster_drain.run(args, out) == 1
    assert [a for _, a in asked] == [("drain", "pi1", "-", "--node", n, "--check")
                                     for n in ("lb1", "lb2")]  # no drain was made anywhere
    assert "== lb2 (balancer, 192.168.100.5)" in out.getvalue()
    assert "would leave service web" in out.getvalue()
    assert out.getvalue().endswith("stopped before any change: lb2 refused to drain pi1; no "
                                   "balancer was changed\n")
    # --force skips the question, as it skips the guard.
    asked.clear()
    assert cluster_drain.run(SimpleNamespace(**{**vars(args), "force": True}), io.StringIO()) == 0
    assert [a[-1] for _, a in asked] == ["--force", "--force"]


def test_in_mode_ecmp_drain_all_wait_refuses_to_leave_a_balancer_out(monkeypatch, capsys):
    # lb2 and lb3 would still send pi1 their share of new connections while
    # the wait on lb1 alone called it idle.
    from lbctl.cli import main
    from lbctl.commands import cluster_drain

    def no_ssh(*args, **kwargs):
        raise AssertionError("a node was asked")
    monkeypatch.setattr(cluster_drain, "run_on_each", no_ssh)
    monkeypatch.setattr(cluster_drain, "run_on", no_ssh)
    ecmp = str(Path(__file__).resolve().parent.parent / "examples" / "pi-ecmp.yaml")
    assert main(["drain", "pi1", ecmp, "--all", "--node", "lb1", "--wait"]) == 64
    assert capsys.readouterr().err == (
        "lbctl: in mode ecmp every balancer the router uses sends pi1 connections: --wait "
        "needs them all, and --node leaves out lb2, lb3 (--force waits on those named alone, "
        "for a balancer that is drained with drain-balancer or down)\n")


def test_doctor_all_checks_every_node_asks_the_lan_from_one_balancer_and_merges(monkeypatch,
                                                                                tmp_path):
    import io
    import json
    from types import SimpleNamespace

    from lbctl.commands import cluster_doctor
    from lbctl.remote.ssh import SSH_FAILED

    def report(node, *findings):
        return json.dumps({"cluster": "pi-web", "run_on": node, "not_run": [], "findings": [
            {"node": n, "check": c, "problem": p, "evidence": "e", "fix": "f"}
            for n, c, p in findings]})

    asked = {}
    answers = {}

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        assert stdin_text == PAIR  # each node gets the file on standard input
        for t in targets_:
            asked[t.node] = args_for(t)
        return {t.node: answers[t.node](t) for t in targets_}
    monkeypatch.setattr(cluster_doctor, "run_on_each", on_each)
    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)

    def run(**found):
        for node in ("lb1", "lb2", "pi1", "pi2"):
            answers[node] = found.get(node, lambda t: Outcome(t, 0, report(t.node), ""))
        out = io.StringIO()
        status = cluster_doctor.run(SimpleNamespace(file=str(path), node=None, ssh_config=None,
                                                    json=True), out)
        return status, json.loads(out.getvalue())

    assert run() == (0, {"cluster": "pi-web", "run_on": "every node of the file over SSH, "
                         "the LAN from lb1", "findings": [], "not_run": []})
    assert asked == {"lb1": ["doctor", "-", "--node", "lb1", "--json"],
                     **{n: ["doctor", "-", "--node", n, "--json", "--no-wire"]
                        for n in ("lb2", "pi1", "pi2")}}
    status, merged = run(
        lb1=lambda t: Outcome(t, 1, report("lb1", ("pi1", "arp-flux", "answers ARP")), ""),
        pi1=lambda t: Outcome(t, 1, report("pi1", ("pi1", "arp-flux", "answers ARP"),
                                           ("pi1", "vip-not-on-lo", "no VIP")), ""),
        pi2=lambda t: Outcome(t, SSH_FAILED, "", "ssh: connect to host 192.168.100.4: "
                              "No route to host\n"))
    assert status == 1
    assert [(f["node"], f["check"]) for f in merged["findings"]] == [
        ("pi1", "arp-flux"), ("pi1", "vip-not-on-lo")]  # the same finding from two sides, once
    assert merged["not_run"] == [{"check": "pi2", "why": "unreachable: ssh: connect to host "
                                  "192.168.100.4: No route to host"}]
    # lbctl's own error on a node (exit 1, as for findings) is shown, and a
    # probing balancer that fails says the LAN went unprobed.
    status, merged = run(lb1=lambda t: Outcome(t, 1, "", "lbctl: doctor: interface eth0 "
                                               "does not exist on this host\n"))
    assert status == 4  # could not check: not "problems found", and no all-clear
    assert merged["not_run"] == [
        {"check": "lb1", "why": "lbctl: doctor: interface eth0 does not exist on this host"},
        {"check": "wire", "why": "the LAN is probed from lb1, which could not be checked; to "
         f"probe it from another balancer: `lbctl doctor {path} --all --node lb2,pi1,pi2`"}]


def test_doctor_all_finds_ecmp_balancers_whose_table_orders_differ(monkeypatch, tmp_path):
    import io
    from types import SimpleNamespace

    from lbctl.commands import cluster_doctor

    def report(node, tables):
        return json.dumps({"cluster": "pi-web", "run_on": node, "not_run": [], "findings": [],
                           **({} if tables is None else {"tables": tables})})

    tables = {}

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        return {t.node: Outcome(t, 0, report(t.node, tables.get(t.node)), "")
                for t in targets_}
    monkeypatch.setattr(cluster_doctor, "run_on_each", on_each)
    path = tmp_path / "ecmp.yaml"
    path.write_text(PI_ECMP)

    def run():
        out = io.StringIO()
        code = cluster_doctor.run(SimpleNamespace(file=str(path), node=None, ssh_config=None,
                                                  json=True), out)
        return code, json.loads(out.getvalue())["findings"]

    from lbctl.status.model import table_parts

    web = "tcp 10.200.0.10:80"
    listed = [("192.168.100.4:80", 1), ("192.168.100.3:80", 1)]
    alike = table_parts(listed, ["mh-port"])
    tables.update(lb1={web: alike}, lb2={web: alike}, lb3={web: alike})
    assert run() == (0, [])
    # lb2 lists them in another order: a restart of its keepalived mends it.
    tables["lb2"] = {web: table_parts(listed[::-1], ["mh-port"])}
    code, (found,) = run()
    assert code == 1
    assert (found["node"], found["check"]) == ("lb1, lb2, lb3", "table-differs")
    assert found["evidence"] == (f"order digests: lb1 {alike['order']}, "
                                 f"lb2 {tables['lb2'][web]['order']}, lb3 {alike['order']}")
    assert "in another order" in found["problem"]
    assert "`sudo lbctl apply FILE` first" in found["fix"]
    assert "lbctl drain-balancer NAME" in found["fix"]
    assert "`sudo systemctl restart lbctl-pi-web-keepalived`" in found["fix"]
    # Not apply --remove: it would wipe the balancer's drain records.
    assert "--remove" not in found["fix"]
    # lb2 still holds pi3, which the file dropped, while it has connections.
    tables["lb2"] = {web: table_parts([("192.168.100.6:80", 0), *listed], ["mh-port"])}
    code, (found,) = run()
    assert found["evidence"].startswith("members digests: lb1 ")
    assert "hold different real servers" in found["problem"]
    assert "restart" not in found["fix"].replace("no restart mends it", "")
    # The same order, pi2 drained on lb2 alone: no restart mends that.
    tables["lb2"] = {web: table_parts([("192.168.100.4:80", 0), listed[1]], ["mh-port"])}
    assert tables["lb2"][web]["order"] == alike["order"]
    code, (found,) = run()
    assert code == 1
    assert found["evidence"].startswith("weights digests: lb1 ")
    assert "alike but with other weights" in found["problem"]
    assert "restart" not in found["fix"] and "lbctl status FILE --all" in found["fix"]
    # A node's odd answer is no crash, and no finding.
    tables["lb2"] = {web: 7}
    assert run() == (0, [])
    tables["lb2"] = {web: {"order": 7}}
    assert run() == (0, [])


def test_the_cluster_view_names_a_checked_worker_with_no_report_yet():
    from lbctl.remote.view import format_cluster

    from lbctl.status.model import NodeStatus

    cluster = cluster_from(PAIR)
    status = node_status(keepalived={"pi-web": keepalived_status(
        vrrp={"state": "MASTER", "since": 90.0}, health=[
            {"service": "web", "worker": "pi1", "state": "up", "since": 40.0},
            {"service": "web", "worker": "pi2", "state": None, "since": None}])},
        services=[service_status(real_servers=[
            {"address": f"192.168.100.{n}:80", "weight": 0 if n == 4 else 1} for n in (3, 4)])])
    report = {"nodes": {"lb1": {"role": "balancer", "host": "192.168.100.2", "error": None,
                                "status": NodeStatus.from_json(status)}}}
    lines = format_cluster(cluster, report, now=100.0).splitlines()
    assert "    worker pi1 (192.168.100.3:80) weight 1  active 0 inactive 0  up for 60s" in lines
    assert ("    worker pi2 (192.168.100.4:80) weight 0  active 0 inactive 0  no health report "
            "yet") in lines


def test_the_cluster_view_shows_each_mh_table_and_names_balancers_whose_tables_differ():
    from lbctl.remote.view import format_cluster
    from lbctl.status.model import NodeStatus

    cluster = cluster_from(PI_ECMP)

    def balancer(*hosts, heavy=None):
        status = node_status(services=[service_status("tcp 10.200.0.10:80", scheduler="mh",
                                                      real_servers=[
            {"address": f"192.168.100.{n}:80", "weight": 2 if n == heavy else 1}
            for n in hosts])])
        return {"role": "balancer", "host": "-", "error": None,
                "status": NodeStatus.from_json(status)}

    def shown(lb1, lb2, lb3, heavy_on_lb2=None):
        report = {"nodes": {"lb1": balancer(*lb1), "lb2": balancer(*lb2, heavy=heavy_on_lb2),
                            "lb3": balancer(*lb3)}}
        return format_cluster(cluster, report, now=100.0).splitlines()

    same = shown((3, 4, 6), (3, 4, 6), (3, 4, 6))
    digests = {line.split(" table ")[1].split(":")[0] for line in same if " table " in line}
    assert len(digests) == 1 and len(digests.pop()) == 8, same
    assert not [line for line in same if line.startswith("!")], same
    moved = shown((3, 4, 6), (6, 3, 4), (3, 4, 6))
    (warning,) = [line for line in moved if line.startswith("!")]
    assert warning.startswith("! service web (tcp 10.200.0.10:80): the balancers fill its "
                              "table differently (their real servers' order, weights or "
                              "flags: lb1 "), warning
    assert warning.endswith("), so a flow moved between them may change worker"), warning
    listed = warning.split("flags: ")[1].split(")")[0]
    digests = dict(part.split() for part in listed.split(", "))
    assert digests["lb1"] == digests["lb3"] != digests["lb2"], warning
    # The same order with another weight fills another table too.
    reweighted = shown((3, 4, 6), (3, 4, 6), (3, 4, 6), heavy_on_lb2=6)
    assert [line for line in reweighted if line.startswith("!")], reweighted


# --- every mode, each fleet helper ------------------------------------------
# A lone balancer without checks runs no keepalived and has no `vrrp:`; with a
# check it runs keepalived (and a VRRP instance of its own) but has no peer.
LONE = """\
cluster: pi-web
balancers:
  lb1: {address: 192.168.100.2, interface: eth0}
workers:
  pi1: {address: 192.168.100.3}
  pi2: {address: 192.168.100.4}
services:
  web: {vip: 192.168.100.10, port: 80}
"""
LONE_WITH_CHECKS = LONE.replace("port: 80}", "port: 80, health: {http: {path: /}}}")
LONE_WITH_VRRP = LONE + "vrrp: {advert_interval: 1s}\n"


def never_asked():
    raise AssertionError("only a pair is asked for its VRRP roles")


@pytest.mark.parametrize("text, mode, has_vrrp", [
    (LONE, "single", False), (LONE_WITH_CHECKS, "single", True),
    (LONE_WITH_VRRP, "single", True)])
def test_a_lone_balancer_goes_after_the_workers_and_no_vrrp_role_is_asked(text, mode, has_vrrp):
    cluster = cluster_from(text)
    assert (cluster.mode, cluster.vrrp is not None) == (mode, has_vrrp)
    found = [(label, [t.node for t in group])
             for label, group in rollout_stages(cluster, select(cluster), never_asked)]
    assert found == [("workers", ["pi1", "pi2"]), ("balancer", ["lb1"])]
    removing = [(label, [t.node for t in group]) for label, group in
                rollout_stages(cluster, select(cluster), never_asked, removing=True)]
    assert removing == [("balancer", ["lb1"]), ("workers", ["pi1", "pi2"])]
    # Only the balancer, or only the workers.
    assert [label for label, _ in rollout_stages(cluster, select(cluster, "lb1"),
                                                 never_asked)] == ["balancer"]
    assert [label for label, _ in rollout_stages(cluster, select(cluster, "pi1,pi2"),
                                                 never_asked)] == ["workers"]


@pytest.mark.parametrize("text", [LONE, LONE_WITH_CHECKS, LONE_WITH_VRRP, PI_ECMP])
def test_no_advert_change_outside_a_pair_whatever_a_balancer_reports(text):
    cluster = cluster_from(text)
    reported = {"lb1": {"state": "MASTER", "advertised_addresses": ["192.168.100.10"]}}
    assert advert_changes(cluster, {}) is False
    assert advert_changes(cluster, reported) is False


def test_a_pair_s_advert_change_is_any_balancer_advertising_other_than_the_anchor():
    cluster = cluster_from(PAIR)
    anchor = vrrp_anchor(cluster)
    assert advert_changes(cluster, {}) is False
    assert advert_changes(cluster, {"lb1": None, "lb2": None}) is False
    assert advert_changes(cluster, {"lb1": {"state": "MASTER", "advertised_addresses": None}}) \
        is False
    assert advert_changes(cluster, {"lb1": {"state": "MASTER", "advertised_addresses": [anchor]},
                                    "lb2": {"state": "BACKUP", "advertised_addresses": [anchor]}}) \
        is False
    assert advert_changes(cluster, {"lb1": {"state": "MASTER", "advertised_addresses": [anchor]},
                                    "lb2": {"state": "BACKUP",
                                            "advertised_addresses": ["192.168.100.10"]}}) is True


@pytest.mark.parametrize("text", [PAIR, PAIR_WITH_CHECKS])
def test_balancer_order_backup_first_by_role_then_by_priority(text):
    cluster = cluster_from(text)
    balancers = [t for t in select(cluster) if t.role == "balancer"]

    def order(reported):
        return [t.node for t in balancer_order(cluster, balancers, reported)]
    assert order({}) == ["lb2", "lb1"]  # lower priority first
    assert order({"lb1": None, "lb2": None}) == ["lb2", "lb1"]
    assert order({"lb1": {"state": "BACKUP"}, "lb2": {"state": "MASTER"}}) == ["lb1", "lb2"]
    assert order({"lb1": {"state": "FAULT"}, "lb2": {"state": "MASTER"}}) == ["lb1", "lb2"]
    assert order({"lb1": {"state": "MASTER"}, "lb2": {}}) == ["lb2", "lb1"]
    # Each answered, and none runs keepalived yet: the file's master first.
    assert order({"lb1": {"state": None}, "lb2": {"state": None}}) == ["lb1", "lb2"]
    assert order({"lb1": {"state": None}, "lb2": None}) == ["lb2", "lb1"]
    # Stopped on both nodes (a clean stop records STOP; a kill leaves the
    # last role): as fresh as a pair that never ran.
    assert order({"lb1": {"state": "STOP"}, "lb2": {"state": "STOP"}}) == ["lb1", "lb2"]
    assert order({"lb1": {"state": "BACKUP", "running": False},
                  "lb2": {"state": "MASTER", "running": False}}) == ["lb1", "lb2"]
    # One runs: the other goes first, whatever the stopped one recorded.
    assert order({"lb1": {"state": "MASTER", "running": False},
                  "lb2": {"state": "MASTER", "running": True}}) == ["lb1", "lb2"]
    assert order({"lb1": {"state": "STOP"}, "lb2": {"state": "BACKUP"}}) == ["lb2", "lb1"]
    # A keepalived that runs but has recorded no role yet is no fresh start.
    assert order({"lb1": {"state": None, "running": False},
                  "lb2": {"state": None, "running": True}}) == ["lb2", "lb1"]
    # A lone balancer of a pair's file (--node lb1) is simply itself.
    assert [t.node for t in balancer_order(cluster, balancers[:1], {})] == ["lb1"]


def test_a_pair_with_one_balancer_selected_is_not_asked_for_roles():
    cluster = cluster_from(PAIR)
    found = [(label, [t.node for t in group]) for label, group in
             rollout_stages(cluster, select(cluster, "lb2,pi1"), never_asked)]
    assert found == [("workers", ["pi1"]), ("balancer", ["lb2"])]


def _status_json(state, advertised):
    """What `lbctl status --json` says of a pair balancer's keepalived."""
    return json.dumps(node_status(keepalived={"pi-web": keepalived_status(
        vrrp={"state": state, "since": 1.0}, advertised_addresses=advertised)}))


@pytest.mark.parametrize("text", [LONE, LONE_WITH_CHECKS, LONE_WITH_VRRP, PI_ECMP])
def test_balancers_now_asks_nobody_outside_a_pair(monkeypatch, text):
    from lbctl.remote import fleet

    monkeypatch.setattr(fleet, "run_on_each", lambda *a, **k: never_asked())
    cluster = cluster_from(text)
    assert fleet.balancers_now(cluster, select(cluster), None) == {}


def test_balancers_now_reads_each_pair_balancer_and_none_for_an_answer_it_cannot_read(
        monkeypatch):
    from lbctl.remote import fleet

    cluster = cluster_from(PAIR)
    answers = {"lb1": _status_json("MASTER", ["169.254.255.1"]), "lb2": "null"}
    asked = []

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        asked.extend((t.node, tuple(args_for(t))) for t in targets_)
        return {t.node: Outcome(t, 0, answers[t.node], "") for t in targets_}
    monkeypatch.setattr(fleet, "run_on_each", on_each)
    found = fleet.balancers_now(cluster, select(cluster), None)
    assert found == {"lb1": {"state": "MASTER", "advertised_addresses": ["169.254.255.1"],
                             "running": True},
                     "lb2": None}
    assert sorted(asked) == [(n, ("status", "-", "--node", n, "--json", "--no-drift"))
                             for n in ("lb1", "lb2")]  # workers are not asked
    for bad in ("", "[]", "{}", '{"keepalived": null}', '{"keepalived": {"pi-web": []}}',
                "not json", '{"keepalived": {"pi-web": {"advertised_addresses": 5}}}',
                '{"keepalived": {"pi-web": {"advertised_addresses": [["x"]]}}}',
                '{"keepalived": {"pi-web": {"vrrp": {"state": ["MASTER"]}}}}'):
        answers["lb2"] = bad
        assert fleet.balancers_now(cluster, select(cluster), None)["lb2"] in (
            None, {"state": None, "advertised_addresses": None, "running": False}), bad


# --- mode ecmp: the next balancer only once the last one serves again --------
def _bgp_json(state, offered, cluster="pi-web"):
    return json.dumps(node_status(keepalived={cluster: keepalived_status(
        pair=False, mode="ecmp", bgp={"router": "192.168.100.1", "state": state,
                                      "offered": [{"vip": v, "since": 1.0} for v in offered]})}))


def test_an_ecmp_balancer_serves_again_once_established_and_offering_what_it_did():
    from lbctl.remote.fleet import back_in_service, parse_status
    from lbctl.remote.fleet import read_bgp as read_status_bgp

    def read_bgp(cluster, text):
        return read_status_bgp(cluster, parse_status(text))

    cluster = cluster_from(PI_ECMP)
    before = read_bgp(cluster, _bgp_json("Established", ["10.200.0.10", "10.200.0.11"]))
    assert before == ("Established", {"10.200.0.10", "10.200.0.11"})
    assert back_in_service(cluster, before, read_bgp(cluster, _bgp_json(
        "Established", ["10.200.0.10", "10.200.0.11"])))
    # The session restarting, or back without every VIP yet: not yet.
    assert not back_in_service(cluster, before, read_bgp(cluster, _bgp_json(
        "Active", ["10.200.0.10", "10.200.0.11"])))
    assert not back_in_service(cluster, before, read_bgp(cluster, _bgp_json(
        "Established", ["10.200.0.10"])))
    assert not back_in_service(cluster, before, read_bgp(cluster, "not json"))
    # A VIP it did not offer (no healthy worker, drained) is not waited for,
    # nor one the file no longer has.
    partly = ("Established", {"10.200.0.10", "10.200.0.99"})
    assert back_in_service(cluster, partly, ("Established", {"10.200.0.10"}))
    # One that served nothing before (a new cluster, no router yet) is not waited for.
    assert back_in_service(cluster, (None, set()), (None, set()))
    assert back_in_service(cluster, ("Connect", set()), ("Active", set()))
    for bad in ("", "null", "[]", '{"keepalived": {"pi-web": {"bgp": null}}}',
                '{"keepalived": {"pi-web": {"bgp": {"offered": [3]}}}}'):
        assert read_bgp(cluster, bad) == (None, set()), bad


def test_apply_all_in_mode_ecmp_stops_when_a_balancer_does_not_serve_again(monkeypatch,
                                                                          tmp_path):
    import io
    from types import SimpleNamespace

    from lbctl.commands import cluster_apply, cluster_plan
    from lbctl.remote import fleet

    path = tmp_path / "ecmp.yaml"
    path.write_text(PI_ECMP)
    vips = ["10.200.0.10", "10.200.0.11"]
    applied, asked = [], []
    # lb1 offers both VIPs until its apply; afterwards its session stays down.
    sessions = {"lb1": "Established", "lb2": "Established", "lb3": "Established"}

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        found = {}
        for t in targets_:
            argv = args_for(t)
            if argv[0] == "apply":
                applied.append(t.node)
                if t.role == "balancer":
                    sessions[t.node] = "Active" if t.node == "lb1" else "Established"
                found[t.node] = Outcome(t, 0, f"{t.role} {t.node}: applied\n", "")
            elif argv[0] == "status":
                asked.append(t.node)
                found[t.node] = Outcome(t, 0, _bgp_json(sessions[t.node], vips), "")
            else:  # the plans every node shows before any change, with --yes too
                assert argv[0] == "plan", argv
                found[t.node] = Outcome(t, 2, f"{t.role} {t.node}: 1 change\n", "")
        return found
    monkeypatch.setattr(cluster_apply, "run_on_each", on_each)
    monkeypatch.setattr(cluster_plan, "run_on_each", on_each)
    monkeypatch.setattr(fleet, "run_on_each", on_each)
    monkeypatch.setattr(cluster_apply, "ECMP_SETTLE_TIMEOUT", 0.3)
    monkeypatch.setattr(cluster_apply, "ECMP_SETTLE_POLL", 0.05)
    out = io.StringIO()
    args = SimpleNamespace(file=str(path), node=None, ssh_config=None, remove=False, force=False,
                           yes=True)
    assert cluster_apply.run(args, out) == 1
    assert applied == ["pi1", "pi2", "lb1"]  # lb2 and lb3 keep serving
    text = out.getvalue()
    assert text.endswith("stopped: lb1 is not serving again 0.3s after its apply (BGP Active); "
                         "the other balancers were left as they are; done on pi1, pi2, lb1; "
                         "not touched: lb2, lb3\n"), text
    # Once every balancer is back each time, the rollout goes through.
    sessions.update(lb1="Established")
    applied.clear()
    monkeypatch.setattr(cluster_apply, "ECMP_SETTLE_TIMEOUT", 5)

    def healthy(targets_, args_for, stdin_text, ssh_config=None, **kw):
        found = on_each(targets_, args_for, stdin_text)
        sessions["lb1"] = "Established"
        return found
    monkeypatch.setattr(cluster_apply, "run_on_each", healthy)
    monkeypatch.setattr(fleet, "run_on_each", healthy)
    assert cluster_apply.run(args, io.StringIO()) == 0
    assert applied == ["pi1", "pi2", "lb1", "lb2", "lb3"]


def test_status_all_shows_every_node_when_some_answer_nonsense(monkeypatch, tmp_path):
    import io
    from types import SimpleNamespace

    from lbctl.commands import cluster_status

    cluster_text = PAIR.replace("  pi2: {address: 192.168.100.4}\n",
                                "  pi2: {address: 192.168.100.4}\n"
                                "  pi3: {address: 192.168.100.6}\n"
                                "  pi4: {address: 192.168.100.7}\n"
                                "  pi5: {address: 192.168.100.8}\n")
    path = tmp_path / "pair.yaml"
    path.write_text(cluster_text)
    good_balancer = node_status(
        keepalived={"pi-web": keepalived_status(vrrp={"state": "MASTER", "since": 1.0})},
        services=[service_status(scheduler="wlc", connections=3)], drift=[], drift_error=None)
    answers = {
        "lb1": json.dumps(good_balancer),
        "lb2": "null",
        "pi1": json.dumps(node_status("worker", vips_on_lo=["192.168.100.10"],
                                      arp={"all": {"arp_ignore": "1", "arp_announce": "2"}})),
        "pi2": "[]",
        "pi3": json.dumps(node_status("worker", vips_on_lo=[
            "\x1b]0;owned\x07\x1b[2J\nbalancer lb9: VRRP MASTER\u202e"], arp={"all": {}})),
        "pi4": json.dumps(node_status("worker", vips_on_lo=["x" * (10 << 20)], arp={"all": {}})),
        # A node whose ARP table is a list where each interface's settings
        # belong: one line for it, naming the field.
        "pi5": json.dumps(node_status("worker", arp={"all": []})),
    }

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        return {t.node: Outcome(t, 0, answers[t.node], "") for t in targets_}
    monkeypatch.setattr(cluster_status, "run_on_each", on_each)
    out = io.StringIO()
    args = SimpleNamespace(file=str(path), node=None, ssh_config=None, no_drift=False,
                           json=False, detailed_exitcode=False)
    assert cluster_status.run(args, out) == 4  # some nodes did not report
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == "cluster pi-web: 7 node(s), 3 not reporting (lb2, pi2, pi5)"
    assert "balancer lb1 (192.168.100.2): VRRP MASTER" in text
    assert "worker pi1 (192.168.100.3): VIPs on lo 192.168.100.10; ARP arp_ignore=1" in text
    assert ("balancer lb2 (192.168.100.5): lbctl status answered JSON that is not a node's "
            "status (the status: null, not an object)") in lines
    assert ("worker pi2 (192.168.100.4): lbctl status answered JSON that is not a node's "
            "status (the status: a list, not an object)") in lines
    assert [line for line in lines if line.startswith("worker pi5 ")] == [
        "worker pi5 (192.168.100.8): lbctl status answered JSON that is not a node's status "
        "(arp.all: a list, not an object)"]
    assert "\x1b" not in text and "\x07" not in text
    assert "worker pi3 (192.168.100.6): VIPs on lo ?]0;owned??[2J?balancer lb9: VRRP MASTER?;" \
        in text
    # Each node is one block; the 10 MB answer is cut, and nothing else is lost.
    assert sum(1 for line in lines if line.startswith(("balancer ", "worker "))) == 7
    assert len(text) < 20000
    assert any(line.endswith(" characters)") and line.startswith("worker pi4 ") for line in lines)


def test_status_all_detailed_exitcode_is_2_when_any_node_drifted(monkeypatch, tmp_path):
    import io
    from types import SimpleNamespace

    from lbctl.commands import cluster_status

    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)
    drifts = {"lb1": [], "lb2": [], "pi1": [], "pi2": []}
    unreachable = set()

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        from lbctl.remote.ssh import SSH_FAILED

        # Each node is asked for JSON with its drift, not for an exit code of its own.
        assert all("--detailed-exitcode" not in args_for(t) for t in targets_)
        return {t.node: Outcome(t, SSH_FAILED, "", "ssh: connect to host: No route to host\n")
                if t.node in unreachable else Outcome(t, 0, json.dumps(node_status(
            t.role, drift=drifts[t.node],
            drift_error=None if drifts[t.node] is not None else "no IPVS")), "")
            for t in targets_}
    monkeypatch.setattr(cluster_status, "run_on_each", on_each)

    def exit_code(detailed=True):
        args = SimpleNamespace(file=str(path), node=None, ssh_config=None, no_drift=False,
                               json=False, detailed_exitcode=detailed)
        return cluster_status.run(args, io.StringIO())
    assert exit_code() == 0
    drifts["pi2"] = ["+ address 192.168.100.10/32 on lo"]
    assert (exit_code(), exit_code(detailed=False)) == (2, 0)
    # A node not heard from does not hide one that drifted; alone, it is 4.
    drifts["lb2"] = None  # not known there: not every node was checked
    assert exit_code() == 2
    unreachable.add("pi1")
    assert exit_code() == 2
    drifts["pi2"] = []
    assert exit_code() == 4
    drifts["lb2"] = []
    assert (exit_code(), exit_code(detailed=False)) == (4, 4)
    unreachable.clear()
    assert exit_code() == 0


@pytest.mark.parametrize("command", ["doctor", "plan", "status"])
def test_with_no_node_answering_all_says_so_and_exits_4_not_all_clear(monkeypatch, tmp_path,
                                                                       command):
    """Every node unreachable is no "no problems found" nor "no changes": the
    answer says how many nodes it covers and exits 4, apart from problems
    found (1) and pending changes (2)."""
    import importlib
    import io
    from types import SimpleNamespace

    from lbctl.remote.ssh import SSH_FAILED

    module = importlib.import_module(f"lbctl.commands.cluster_{command}")
    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)

    def on_each(targets_, args_for, stdin_text, ssh_config=None, **kw):
        return {t.node: Outcome(t, SSH_FAILED, "", f"ssh: connect to host {t.host} port 22: "
                                "No route to host\n") for t in targets_}
    monkeypatch.setattr(module, "run_on_each", on_each)
    out = io.StringIO()
    args = SimpleNamespace(file=str(path), node=None, ssh_config=None, json=False,
                           no_drift=False, remove=False, force=False, detailed_exitcode=True)
    assert module.run(args, out) == 4
    text = out.getvalue()
    if command == "doctor":
        assert text.splitlines()[-2:] == [
            "checked 0 of 4 node(s); could not check lb1, lb2, pi1, pi2",
            "no problems found on the 0 node(s) checked"], text
    elif command == "plan":
        assert text.splitlines()[-1] == ("changes pending on no node; could not plan on lb1, "
                                         "lb2, pi1, pi2"), text
    else:
        assert text.splitlines()[0] == ("cluster pi-web: 4 node(s), 4 not reporting (lb1, lb2, "
                                        "pi1, pi2)"), text


def test_a_rollout_command_that_hangs_is_stopped_with_what_it_started(tmp_path):
    """--exec-timeout: a command past it is stopped, its children too, and
    rollout stops there rather than wait for ever with a worker drained."""
    import io
    import os
    import time

    from lbctl.commands.rollout import run_command

    cluster = cluster_from(PAIR)
    pid_file = tmp_path / "child.pid"
    began = time.monotonic()
    code = run_command(f"sleep 120 & echo $! > {pid_file}; wait", cluster, "pi1",
                       io.StringIO(), timeout=1)
    assert code is None and time.monotonic() - began < 15
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        with open(f"/proc/{child}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    else:
        assert not os.path.exists(f"/proc/{child}"), "the command's child runs on"
    # A command that ends in time gives its status, and sees the worker.
    assert run_command('test "$LBCTL_WORKER" = pi1', cluster, "pi1", io.StringIO(),
                       timeout=30) == 0


def test_a_stopped_command_cannot_leave_behind_what_it_starts_when_told_to_stop(tmp_path):
    """A command that answers SIGTERM by starting something new and going on:
    the SIGKILL that follows reaches the newcomer too, not only the processes
    there were when the stop began."""
    import os
    import subprocess
    import time

    from lbctl.commands.rollout import _stop_tree

    started, ready = tmp_path / "started.pid", tmp_path / "ready"
    proc = subprocess.Popen(["sh", "-c", f"trap 'sleep 300 & echo $! > {started}' TERM; "
                             f"touch {ready}; while :; do sleep 0.1; done"])
    while not ready.exists():
        time.sleep(0.02)
    _stop_tree(proc, grace=1)
    assert proc.returncode is not None
    newcomer = int(started.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{newcomer}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(newcomer, 9)
        raise AssertionError("the process the command started on SIGTERM runs on")
