"""The command line as a user meets it: exit codes, messages, and a light start-up."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lbctl import __version__
from lbctl.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pi-single.yaml"


def test_validate_a_good_file(capsys):
    assert main(["validate", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{EXAMPLE}: valid: cluster pi-web, 1 balancer(s), 3 worker(s), 2 service(s); balancers run by netlink")


def test_usage_errors_exit_64_apart_from_pending_changes(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan"])
    assert exc.value.code == 64  # 2 is plan --detailed-exitcode's "changes pending"
    assert "usage: lbctl" in capsys.readouterr().err


def test_version_prints_the_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"lbctl {__version__}"


def test_an_expected_version_is_answered_before_anything_else(capsys):
    """What apply --all --yes asks each node first is `lbctl --expect-version
    V --version`; and a node of another version names its version even where
    it does not know a flag --all passes it (a usage error would hide why)."""
    with pytest.raises(SystemExit) as exc:
        main(["--expect-version", __version__, "--version"])
    assert (exc.value.code, capsys.readouterr().out) == (0, f"lbctl {__version__}\n")
    for argv in (["--expect-version", "0.0.1", "--version"],
                 ["--version", "--expect-version", "0.0.1"],
                 ["plan", "-", "--expect-version=0.0.1", "--a-flag-of-a-later-lbctl"]):
        assert main(argv) == 3, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == f"lbctl: this node runs lbctl {__version__}, not 0.0.1\n"


def test_global_flags_work_after_the_subcommand_too(capsys):
    bad = str(EXAMPLE) + ".missing"
    assert main(["validate", bad, "--debug"]) == 1  # a config error is never a traceback
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--bogus", str(EXAMPLE)])
    assert exc.value.code == 64
    capsys.readouterr()
    assert main(["validate", str(EXAMPLE), "--expect-version", "0.0.1"]) == 3
    assert "runs lbctl" in capsys.readouterr().err
    assert main(["--expect-version", __version__, "validate", str(EXAMPLE)]) == 0


def test_validate_reads_standard_input():
    text = EXAMPLE.read_text()
    done = subprocess.run([sys.executable, "-m", "lbctl", "validate", "-"], input=text,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "valid: cluster pi-web" in done.stdout
    done = subprocess.run([sys.executable, "-m", "lbctl", "validate", "-"],
                          input=text.replace("cluster: pi-web", "cluster: pi-web\nbogus: 1"),
                          capture_output=True, text=True)
    assert done.returncode == 1
    line = text.splitlines().index("cluster: pi-web") + 2
    assert done.stderr.startswith(f"<stdin>:{line}:1: top level: unknown key 'bogus'")


def test_flags_that_need_each_other_are_usage_errors(capsys):
    for argv in (["apply", "-", "--all"], ["plan", str(EXAMPLE), "--node", "pi1,pi2"],
                 ["status", "--ssh-config", "x"], ["apply", str(EXAMPLE), "--all", "--root", "/x"],
                 ["apply", str(EXAMPLE), "--remove", "--force"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 64, argv
    capsys.readouterr()


def test_validate_imports_neither_pyroute2_nor_jinja2():
    code = ("import sys; from lbctl.cli import main; rc = main(['validate', sys.argv[1]]);"
            "print(rc, 'pyroute2' in sys.modules, 'jinja2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1]
    assert out == "0 False False"


def test_python_dash_m_lbctl_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "lbctl", "validate", str(EXAMPLE)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "valid" in done.stdout


def test_a_reader_that_goes_ends_lbctl_quietly_as_it_would_a_shell_tool(tmp_path):
    # `lbctl status --watch | head -1`: head reads a line and goes.
    watch = subprocess.Popen([sys.executable, "-m", "lbctl", "status", "--watch", "--interval",
                              "0.1", "--root", str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watch.stdout.readline().startswith("lbctl status --watch")
    watch.stdout.close()
    assert watch.wait(timeout=30) == 141
    assert watch.stderr.read() == ""


def test_output_left_in_the_buffer_for_a_reader_that_went_ends_quietly_too():
    # `lbctl validate FILE | true`: the reader is gone before lbctl writes,
    # and what lbctl wrote waits in its buffer until the end.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    validate = subprocess.Popen([sys.executable, "-m", "lbctl", "validate", str(EXAMPLE)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    validate.stdout.close()
    assert validate.wait(timeout=30) == 141
    assert validate.stderr.read() == ""


def drain_all_writing(body):
    """`lbctl drain pi1 EXAMPLE --all` whose run() is `body` (code, with
    `out`), its stdout a pipe whose reader has gone: (exit status, stderr)."""
    code = ("import sys; from lbctl.commands import cluster_drain; from lbctl.errors import *\n"
            f"def run(args, out):\n    {body}\n"
            "cluster_drain.run = run\nfrom lbctl.cli import main\nsys.exit(main(sys.argv[1:]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    drain = subprocess.Popen([sys.executable, "-c", code, "drain", "pi1", str(EXAMPLE), "--all"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    drain.stdout.close()
    return drain.wait(timeout=30), drain.stderr.read()


def test_a_command_that_changes_things_says_a_reader_that_went_stopped_it():
    # `lbctl rollout ... | grep -m1 pi2` stops the rollout where it was, a
    # worker maybe drained: that must not pass without a word.
    assert drain_all_writing("out.write('lb1 drained pi1\\n' * 20000); return 0") == (
        141, "lbctl: drain: stopped part-way, as its output's reader went away (broken pipe): "
             f"`lbctl status {EXAMPLE} --all` shows where the cluster stands\n")


def test_a_command_that_ran_to_its_end_keeps_its_status_when_only_its_output_was_lost():
    # Its few lines waited in the buffer until the end, when the reader had gone.
    assert drain_all_writing("out.write('lb1 drained pi1\\n'); return 0") == (0, "")
    assert drain_all_writing("out.write('lb1 drained pi1\\n'); raise NodeError('lb2 refused')") \
        == (1, "lbctl: lb2 refused\n")


def test_the_wheel_lists_every_package_of_lbctl():
    # pyproject.toml names the packages one by one: a new one left out would
    # be missing from every installed node.
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(p.parent.relative_to(root)).replace("/", ".")
             for p in (root / "lbctl").rglob("__init__.py")}
    assert found <= listed, found - listed


@pytest.mark.parametrize("argv, message", [
    (["status", "--worker", "pi1"], "--service, --worker and --client go with --connections"),
    (["status", str(EXAMPLE), "--connections", "--all"], "run it there, without --all"),
    (["drain", "pi1", "--all"], "drain --all needs the cluster file by its path"),
])
def test_operations_flags_that_cannot_go_together_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 64
    assert message in capsys.readouterr().err


def test_drain_names_an_unknown_worker_or_service_before_touching_anything(capsys, tmp_path):
    assert main(["drain", "pi9", str(EXAMPLE), "--root", str(tmp_path)]) == 64
    assert "no worker 'pi9'" in capsys.readouterr().err
    assert main(["drain", "pi3", str(EXAMPLE), "--service", "dns", "--root", str(tmp_path)]) == 64
    assert "worker pi3 does not serve dns" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_status_connections_names_an_unknown_filter(capsys):
    assert main(["status", "--connections", str(EXAMPLE), "--worker", "pi9"]) == 64
    assert "--worker: no worker 'pi9'" in capsys.readouterr().err
    assert main(["status", "--connections", str(EXAMPLE), "--client", "10.0.0.0/33"]) == 64
    assert "--client:" in capsys.readouterr().err


@pytest.mark.parametrize("error, said", [
    (NotADirectoryError(20, "Not a directory", "/etc/lbctl/pi-web"),
     "lbctl: validate: /etc/lbctl/pi-web: not a directory\n"),
    (PermissionError(13, "Permission denied", "/run/lbctl"),
     "lbctl: validate: /run/lbctl: permission denied; run as root\n"),
    (OSError(22, "Invalid argument"), "lbctl: validate: invalid argument\n"),
    (FileExistsError(17, "File exists", "/a.tmp", None, "/a"), "lbctl: validate: /a.tmp -> /a: file exists\n"),
])
def test_an_error_of_the_system_is_a_message_with_its_path_not_a_traceback(monkeypatch, capsys,
                                                                           error, said):
    import lbctl.commands.validate

    def refused(args, out):
        raise error
    monkeypatch.setattr(lbctl.commands.validate, "run", refused)
    assert main(["validate", str(EXAMPLE)]) == 1
    assert capsys.readouterr().err == said
    with pytest.raises(OSError):
        main(["validate", str(EXAMPLE), "--debug"])


@pytest.mark.parametrize("argv, named", [
    (["plan", str(EXAMPLE), "--all", "--ssh-config", "/home/pi/evil"], "--ssh-config: ssh"),
    (["apply", str(EXAMPLE), "--all"], "apply --all runs ssh from this machine"),
    (["status", str(EXAMPLE), "--all"], "status --all runs ssh"),
    (["rollout", str(EXAMPLE), "--exec", "id > /tmp/x"], "rollout --exec runs a shell command"),
    (["lab", "demo"], "lab builds namespaces"),
    (["exporter"], "exporter is a listener"),
    (["apply", str(EXAMPLE), "--root", "/home/pi/tree"], "--root (or $LBCTL_ROOT)"),
])
def test_under_sudo_what_would_hand_root_the_users_choice_is_refused_before_it_runs(
        monkeypatch, capsys, tmp_path, argv, named):
    """`NOPASSWD: /usr/local/sbin/lbctl` lets a login apply and inspect; a file
    or a command of its choosing run as root would make it root."""
    import lbctl.cli as cli

    monkeypatch.setenv("SUDO_USER", "pi")
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli.importlib, "import_module",
                        lambda name: pytest.fail(f"{name} was loaded under sudo"))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"lbctl: {argv[0]}: refused under sudo (run by pi), before anything "
                          "ran:\n  "), err
    assert named in err


def test_under_sudo_apply_plan_and_status_of_this_node_run_as_usual(monkeypatch, capsys):
    import lbctl.cli as cli

    monkeypatch.setenv("SUDO_USER", "pi")
    monkeypatch.delenv("LBCTL_ROOT", raising=False)
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    for argv in (["apply", str(EXAMPLE)], ["plan", str(EXAMPLE), "--node", "lb1"],
                 ["status"], ["validate", str(EXAMPLE)], ["doctor"]):
        assert cli.refused_under_sudo(cli.build_parser().parse_args(argv)) == [], argv
    # $LBCTL_ROOT kept through sudo is refused as --root is.
    monkeypatch.setenv("LBCTL_ROOT", "/home/pi/tree")
    assert cli.refused_under_sudo(cli.build_parser().parse_args(["apply", str(EXAMPLE)]))
    # Without sudo, as root: nothing refused.
    monkeypatch.delenv("SUDO_USER")
    assert cli.refused_under_sudo(cli.build_parser().parse_args(["lab", "demo"])) == []


def test_every_argument_of_every_command_says_what_it_is_for():
    import argparse

    from lbctl.cli import build_parser

    def silent(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from silent(sub, [*path, name])
            elif action.help is None:
                yield " ".join([*path, *(action.option_strings or [action.dest])])
    assert list(silent(build_parser(), ["lbctl"])) == []


@pytest.mark.parametrize("argv", [
    ["rollout", str(EXAMPLE), "--exec", "true", "--timeout", "-1"],
    ["rollout", str(EXAMPLE), "--exec", "true", "--pause", "-5"],
    ["drain", "pi1", str(EXAMPLE), "--wait", "--timeout", "-1"],
    ["drain-balancer", "lb1", str(EXAMPLE), "--timeout", "-1"],
])
def test_a_negative_time_is_a_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 64
    assert "cannot be negative" in capsys.readouterr().err


def test_under_sudo_the_file_is_read_with_the_rights_of_who_ran_sudo(monkeypatch, capsys):
    """`sudo lbctl validate /etc/shadow` must not print root's secrets in its
    errors: the file is opened as SUDO_UID would open it."""
    import os
    import shutil
    import tempfile

    assert os.geteuid() == 0, "dev.sh runs the unit tests as root"
    folder = tempfile.mkdtemp(prefix="lbctl-sudo-", dir="/run")
    os.chmod(folder, 0o755)
    try:
        secret = os.path.join(folder, "shadow")
        with open(secret, "w") as fh:
            fh.write("root:$6$secret:19000:0:99999:7:::\n")
        os.chmod(secret, 0o600)
        shared = os.path.join(folder, "cluster.yaml")
        shutil.copy(EXAMPLE, shared)
        os.chmod(shared, 0o644)
        monkeypatch.setenv("SUDO_UID", "65534")  # nobody
        monkeypatch.setenv("SUDO_USER", "nobody")
        assert main(["validate", secret]) == 1
        err = capsys.readouterr().err
        assert "$6$secret" not in err and "root:" not in err, err
        assert "Permission denied (read as nobody, who ran sudo" in err, err
        assert os.geteuid() == 0 and os.getegid() == 0  # root again after the read
        assert main(["validate", shared]) == 0  # a file they may read is read as usual
    finally:
        shutil.rmtree(folder)


def test_yes_answers_only_a_fleet_change(capsys):
    with pytest.raises(SystemExit) as done:
        main(["apply", str(EXAMPLE), "--yes"])
    assert done.value.code == 64
    assert "apply on one node does not ask" in capsys.readouterr().err


def test_apply_dry_run_runs_plan_and_not_apply(monkeypatch):
    """Users reach for `apply --dry-run`: it is plan, with plan's exit codes."""
    from lbctl.commands import apply, plan

    planned = []
    monkeypatch.setattr(plan, "run", lambda args, out: planned.append(args) or 0)
    monkeypatch.setattr(apply, "run", lambda args, out: pytest.fail("apply ran"))
    assert main(["apply", str(EXAMPLE), "--dry-run", "--node", "pi1"]) == 0
    (args,) = planned
    assert (args.command, args.node, args.detailed_exitcode) == ("plan", "pi1", False)
