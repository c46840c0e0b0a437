"""apply --all and rollout show what they will do and ask first (remote/confirm.py)."""

import io
from types import SimpleNamespace

import pytest

from lbctl.remote.confirm import NotConfirmed, ask, require_a_way_to_ask
from lbctl.remote.ssh import Outcome

PAIR = """\
cluster: pi-web
balancers:
  lb1: {address: 192.168.1.2, interface: eth0, priority: 150}
  lb2: {address: 192.168.1.5, interface: eth0, priority: 100}
workers:
  pi1: {address: 192.168.1.3}
services:
  web: {vip: 192.168.1.10, port: 80}
"""


class Terminal(io.StringIO):
    """A terminal's end: isatty() as a real one answers."""

    def isatty(self):
        return True


class Fleet:
    """The nodes' answers over SSH: `pending` nodes have changes to plan."""

    def __init__(self, pending):
        from lbctl import __version__

        self.pending, self.calls, self.version = set(pending), [], __version__
        self.versions = {}  # node: the version its lbctl says, where not this one

    def run_on_each(self, targets_, args_for, stdin_text, ssh_config=None, **kw):
        found = {}
        for t in targets_:
            argv = args_for(t)
            self.calls.append((t.node, argv[0]))
            if argv[0] == "plan":
                changed = t.node in self.pending
                found[t.node] = Outcome(t, 2 if changed else 0,
                                        "  ~ weight\n" if changed else "no changes\n", "")
            elif argv == ["--version"]:
                found[t.node] = Outcome(t, 0, f"lbctl {self.versions.get(t.node, self.version)}\n",
                                        "")
            else:
                found[t.node] = Outcome(t, 0, f"{argv[0]} {t.node}: ok\n", "")
        return found

    def applied(self):
        return [node for node, what in self.calls if what == "apply"]


@pytest.fixture
def fleet(monkeypatch):
    from lbctl.commands import cluster_apply, cluster_plan
    from lbctl.remote import fleet as fleet_module

    def make(pending=("pi1",)):
        found = Fleet(pending)
        for module in (cluster_apply, cluster_plan, fleet_module):
            monkeypatch.setattr(module, "run_on_each", found.run_on_each)
        # The master is asked for its role while the workers apply: none here.
        monkeypatch.setattr(cluster_apply, "balancers_now", lambda *a: {})
        return found
    return make


def pi1_plans(nodes, monkeypatch, returncode, stderr):
    """pi1's plan ends with `returncode` and `stderr`; the other nodes answer as `nodes` do."""
    from lbctl.commands import cluster_plan

    def answers(targets_, args_for, stdin_text, ssh_config=None, **kw):
        found = nodes.run_on_each(targets_, args_for, stdin_text, ssh_config)
        if "pi1" in found and args_for(targets_[0])[0] == "plan":
            found["pi1"] = Outcome(found["pi1"].target, returncode, "", stderr)
        return found
    monkeypatch.setattr(cluster_plan, "run_on_each", answers)


def apply_all(tmp_path, monkeypatch, answer=None, yes=False, remove=False, text=PAIR):
    """Run apply --all; `answer`: what the person types (None: no terminal)."""
    from lbctl.commands import cluster_apply

    path = tmp_path / "pair.yaml"
    path.write_text(text)
    out = Terminal() if answer is not None else io.StringIO()
    monkeypatch.setattr("sys.stdin", io.StringIO() if answer is None else Terminal(answer))
    args = SimpleNamespace(file=str(path), node=None, ssh_config=None, remove=remove,
                           force=False, yes=yes)
    return cluster_apply.run(args, out), out.getvalue()


def test_without_a_terminal_apply_all_refuses_before_any_node_is_contacted(
        tmp_path, monkeypatch, fleet):
    nodes = fleet()
    with pytest.raises(NotConfirmed, match="pass --yes"):
        apply_all(tmp_path, monkeypatch)
    assert nodes.calls == []


def test_answered_no_apply_all_shows_the_plans_and_changes_nothing(tmp_path, monkeypatch,
                                                                   fleet):
    nodes = fleet(pending=["pi1", "lb2"])
    status, text = apply_all(tmp_path, monkeypatch, answer="n\n")
    assert status == 1
    assert nodes.applied() == []
    assert "== pi1 (worker, 192.168.1.3)" in text and "~ weight" in text
    assert "Apply these changes to lb2, pi1? [y/N] " in text
    assert text.endswith("cancelled; nothing was changed\n")


def test_end_of_input_is_a_no(tmp_path, monkeypatch, fleet):
    nodes = fleet()
    status, text = apply_all(tmp_path, monkeypatch, answer="")
    assert status == 1 and nodes.applied() == []


def test_answered_yes_apply_all_goes_ahead_in_its_order(tmp_path, monkeypatch, fleet):
    nodes = fleet()
    status, text = apply_all(tmp_path, monkeypatch, answer="y\n")
    assert status == 0, text
    assert nodes.applied() == ["pi1", "lb2", "lb1"]


def test_with_yes_nothing_is_asked(tmp_path, monkeypatch, fleet):
    nodes = fleet()
    status, text = apply_all(tmp_path, monkeypatch, yes=True)
    assert status == 0, text
    assert "[y/N]" not in text and ("pi1", "plan") not in nodes.calls
    assert nodes.applied() == ["pi1", "lb2", "lb1"]


def test_in_mode_ecmp_with_yes_every_node_plans_before_any_changes(tmp_path, monkeypatch,
                                                                  fleet):
    """A balancer that refuses the file (a worker its mh table cannot take
    there) stops apply --all --yes before the other balancers have changed:
    else their tables would differ until it was mended."""
    from lbctl.commands import cluster_apply, cluster_plan
    from helpers import PI_ECMP

    nodes = fleet()
    monkeypatch.setattr(cluster_apply, "bgp_offers", lambda *a: {})

    def lb3_refuses(targets_, args_for, stdin_text, ssh_config=None, **kw):
        found = nodes.run_on_each(targets_, args_for, stdin_text, ssh_config)
        if "lb3" in found and args_for(targets_[0])[0] == "plan":
            found["lb3"] = Outcome(found["lb3"].target, 1, "",
                                   "<stdin>:13:3: services.web: worker pi9 is new\n")
        return found
    monkeypatch.setattr(cluster_plan, "run_on_each", lb3_refuses)
    status, text = apply_all(tmp_path, monkeypatch, yes=True, text=PI_ECMP)
    assert status == 1 and nodes.applied() == []
    assert "[y/N]" not in text
    # The node read the file from standard input: its error names the operator's file.
    assert f"   {tmp_path / 'pair.yaml'}:13:3: services.web: worker pi9 is new" in text, text
    assert text.endswith("could not plan on lb3; nothing was changed "
                         "(to go on without it: --node lb1,lb2,pi1,pi2)\n"), text
    monkeypatch.setattr(cluster_plan, "run_on_each", nodes.run_on_each)
    nodes.calls.clear()
    status, text = apply_all(tmp_path, monkeypatch, yes=True, text=PI_ECMP)
    assert status == 0, text
    assert [what for _, what in nodes.calls] == ["plan"] * 5 + ["apply"] * 5
    assert "[y/N]" not in text


def test_nothing_planned_asks_nothing_and_applies_to_check_the_nodes(tmp_path, monkeypatch,
                                                                    fleet):
    """apply does more than its plan shows (it checks keepalived's table against
    its config): with no change planned it still runs, as with --yes."""
    nodes = fleet(pending=[])
    status, text = apply_all(tmp_path, monkeypatch, answer="n\n")
    assert status == 0, text
    assert "[y/N]" not in text
    assert "no changes planned on 3 node(s); applying to check them\n" in text
    assert nodes.applied() == ["pi1", "lb2", "lb1"]


def test_a_node_that_cannot_plan_stops_before_the_question_naming_the_others(
        tmp_path, monkeypatch, fleet):
    nodes = fleet()
    pi1_plans(nodes, monkeypatch, 1, "lbctl: something broke\n")
    status, text = apply_all(tmp_path, monkeypatch, answer="y\n")
    assert status == 1 and nodes.applied() == []
    assert "[y/N]" not in text
    assert text.endswith("could not plan on pi1; nothing was changed "
                         "(to go on without it: --node lb1,lb2)\n"), text


def test_asking_apply_all_checks_each_node_s_lbctl_with_the_plans_alone(tmp_path, monkeypatch,
                                                                        fleet):
    """The plans run with --expect-version: no separate pass over the nodes
    (a start of lbctl on each, seconds on a Pi) before them."""
    nodes = fleet()
    status, text = apply_all(tmp_path, monkeypatch, answer="y\n")
    assert status == 0, text
    assert [what for _, what in nodes.calls] == ["plan"] * 3 + ["apply"] * 3


def test_a_node_with_another_lbctl_found_by_the_plans_stops_before_the_question(
        tmp_path, monkeypatch, fleet):
    from lbctl import __version__

    nodes = fleet()
    pi1_plans(nodes, monkeypatch, 3, f"lbctl: this node runs lbctl 0.1.9, not {__version__}\n")
    status, text = apply_all(tmp_path, monkeypatch, answer="y\n")
    assert status == 1 and nodes.applied() == []
    assert "[y/N]" not in text
    assert "== pi1 (worker, 192.168.1.3): this node runs lbctl 0.1.9, not" in text, text
    assert text.endswith(f"stopped before any change: pi1 must run lbctl {__version__} first; "
                         "not touched: lb1, lb2, pi1\n"), text


def test_a_plan_refused_as_a_usage_error_is_asked_its_lbctl_s_version(tmp_path, monkeypatch,
                                                                      fleet):
    """An lbctl that checks --expect-version only after the flags answers a
    flag it does not know with a usage error: apply --all asks its version,
    and names it, rather than offer to go on without the node."""
    from lbctl import __version__

    nodes = fleet()
    nodes.versions["pi1"] = "0.2.9"
    pi1_plans(nodes, monkeypatch, 64, "lbctl: error: unrecognized arguments: --fingerprint\n")
    status, text = apply_all(tmp_path, monkeypatch, answer="y\n")
    assert status == 1 and nodes.applied() == []
    assert ("pi1", "--version") in nodes.calls and ("lb1", "--version") not in nodes.calls
    assert f"this node runs lbctl 0.2.9, not {__version__}" in text, text
    assert text.endswith(f"stopped before any change: pi1 must run lbctl {__version__} first; "
                         "not touched: lb1, lb2, pi1\n"), text


def test_remove_asks_in_its_own_words(tmp_path, monkeypatch, fleet):
    fleet(pending=["lb1"])
    status, text = apply_all(tmp_path, monkeypatch, answer="no\n", remove=True)
    assert status == 1 and "Remove lbctl from lb1? [y/N] " in text


def test_rollout_without_a_terminal_refuses_and_answered_no_drains_nothing(
        tmp_path, monkeypatch):
    from lbctl.commands import rollout

    path = tmp_path / "pair.yaml"
    path.write_text(PAIR)
    drained = []
    monkeypatch.setattr(rollout, "on_balancers", lambda *a: drained.append(a) or True)
    args = SimpleNamespace(file=str(path), exec="true", batch=1, pause=0, start_at=None,
                           timeout=5, exec_timeout=5, ssh_config=None, yes=False)
    with pytest.raises(NotConfirmed, match="rollout asks"):
        rollout.run(args, io.StringIO())
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    out = Terminal()
    assert rollout.run(args, out) == 1
    assert drained == []
    assert "  1. pi1\n" in out.getvalue() and "Roll out to 1 worker(s)? [y/N] " in out.getvalue()


@pytest.mark.parametrize("typed, agreed", [("y\n", True), ("YES\n", True), (" yes \n", True),
                                           ("\n", False), ("n\n", False), ("yep\n", False)])
def test_only_y_or_yes_agrees(typed, agreed):
    assert ask("Go?", stdin=io.StringIO(typed), out=io.StringIO()) is agreed


def test_a_terminal_to_answer_on_or_yes_is_needed():
    pipe = io.StringIO
    require_a_way_to_ask("x", yes=True, stdin=pipe(), out=pipe(), err=pipe())
    require_a_way_to_ask("x", yes=False, stdin=Terminal(), out=Terminal(), err=pipe())
    require_a_way_to_ask("x", yes=False, stdin=Terminal(), out=pipe(), err=Terminal())  # | tee
    for stdin, out, err in ((Terminal(), pipe(), pipe()), (pipe(), Terminal(), Terminal())):
        with pytest.raises(NotConfirmed):
            require_a_way_to_ask("x", yes=False, stdin=stdin, out=out, err=err)


def test_with_the_output_in_a_pipe_the_question_goes_to_the_terminal_on_stderr():
    log, terminal = io.StringIO(), Terminal()
    assert ask("Go?", stdin=io.StringIO("y\n"), out=log, err=terminal)
    assert log.getvalue() == "" and terminal.getvalue() == "Go? [y/N] "


def test_ctrl_c_at_the_question_ends_the_line_and_says_nothing_changed():
    class Interrupted(Terminal):
        def readline(self):
            raise KeyboardInterrupt

    out = Terminal()
    with pytest.raises(KeyboardInterrupt):
        ask("Go?", stdin=Interrupted(), out=out)
    assert out.getvalue() == "Go? [y/N] \ncancelled; nothing was changed\n"


def test_rollout_answered_yes_runs_every_batch(tmp_path, monkeypatch):
    from lbctl.commands import rollout

    path = tmp_path / "pair.yaml"
    path.write_text(PAIR.replace("  pi1: {address: 192.168.1.3}\n",
                                 "  pi1: {address: 192.168.1.3}\n  pi2: {address: 192.168.1.4}\n"))
    ran = []
    monkeypatch.setattr(rollout, "_one_batch", lambda args, c, b, batch, out: ran.append(batch))
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    args = SimpleNamespace(file=str(path), exec="true", batch=1, pause=0, start_at=None,
                           timeout=5, exec_timeout=5, ssh_config=None, yes=False)
    out = Terminal()
    assert rollout.run(args, out) == 0, out.getvalue()
    assert ran == [["pi1"], ["pi2"]]
    assert "Roll out to 2 worker(s)? [y/N] " in out.getvalue()
