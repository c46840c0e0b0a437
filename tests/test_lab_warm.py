"""The lab's warm lbctl (lbctl.lab.warm): a command run through it answers
as a new `lbctl` process would, in the namespace named, and no longer."""

import os
import signal
import subprocess
import sys
import time

import pytest

from lbctl.errors import LabError
from lbctl.lab import warm as warm_module
from lbctl.lab.warm import WarmLbctl

CLUSTER = """\
cluster: warm
balancers:
  lb1: {address: 10.77.0.2, interface: eth0}
workers:
  pi1: {address: 10.77.0.3}
services:
  web: {vip: 10.77.0.10, port: 80}
"""


@pytest.fixture
def node(tmp_path):
    """A namespace of its own, and the warm lbctl for it."""
    assert os.geteuid() == 0, "dev.sh runs the unit tests as root"
    name = f"lbctl-warm-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    warm = WarmLbctl(name, str(folder / "node.sock"))
    try:
        yield name, warm
    finally:
        warm.stop()
        subprocess.run(["ip", "netns", "del", name], check=False)


def as_a_process(name, *args, cwd=None, env=None):
    return subprocess.run(["ip", "netns", "exec", name, sys.executable, "-m", "lbctl", *args],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_a_command_answers_as_a_new_lbctl_process_would(node, tmp_path, monkeypatch):
    name, warm = node
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "bad.yaml").write_text(CLUSTER + "surprise: 1\n")
    warm.run(["--version"], timeout=60)  # the server starts in another folder
    monkeypatch.chdir(tmp_path)  # relative paths are the caller's
    (tmp_path / "root" / "run").mkdir(parents=True)
    monkeypatch.setenv("LBCTL_ROOT", str(tmp_path / "root"))  # not this machine's own files
    for args in (["--version"], ["no-such-command"], ["validate", "c.yaml"],
                 ["validate", "bad.yaml"], ["plan", "c.yaml", "--node", "pi1"]):
        warm_done = warm.run(args, timeout=60)
        cold = as_a_process(name, *args, cwd=tmp_path)
        assert (warm_done.returncode, warm_done.stdout, warm_done.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr), args
    # The codes differ between them: usage 64, a bad file 1.
    assert warm.run(["no-such-command"], timeout=60).returncode == 64
    assert "bad.yaml:8:1: top level: unknown key" in warm.run(["validate", "bad.yaml"], timeout=60).stderr


def test_the_callers_environment_reaches_the_command(node, tmp_path, monkeypatch):
    _, warm = node
    (tmp_path / "c.yaml").write_text(CLUSTER)
    root = tmp_path / "no-such-root"
    monkeypatch.setenv("LBCTL_ROOT", str(root))
    done = warm.run(["apply", str(tmp_path / "c.yaml"), "--node", "pi1"], timeout=60)
    # apply looks for its folders under the root the environment names.
    assert done.returncode == 1 and f"{root}/run: no such file" in done.stderr, done
    monkeypatch.setenv("SUDO_USER", "someone")
    refused = warm.run(["plan", str(tmp_path / "c.yaml"), "--node", "pi1"], timeout=60)
    assert refused.returncode == 1 and "refused under sudo" in refused.stderr, refused


def test_a_command_past_its_time_is_stopped(node, tmp_path):
    _, warm = node
    started = time.monotonic()
    with pytest.raises(LabError, match="no answer after 2 s"):
        warm.run(["status", "--watch", "--interval", "1", "--root", str(tmp_path)], timeout=2)
    assert time.monotonic() - started < 10
    assert warm.run(["--version"], timeout=60).returncode == 0  # the server goes on


def test_a_namespace_made_anew_gets_a_server_of_its_own(node):
    name, warm = node
    assert warm.run(["--version"], timeout=60).returncode == 0
    first = warm.process.pid
    subprocess.run(["ip", "netns", "del", name], check=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert warm.run(["--version"], timeout=60).returncode == 0
    assert warm.process.pid != first
    with open(f"/proc/{warm.process.pid}/ns/net") as fh:
        in_server = os.fstat(fh.fileno()).st_ino
    assert in_server == os.stat(f"/run/netns/{name}").st_ino


def test_the_server_ends_with_the_lab_and_leaves_no_socket(node):
    name, warm = node
    assert warm.run(["--version"], timeout=60).returncode == 0
    server = warm.process
    warm.stop()
    assert server.returncode == 0  # it ended by itself once the lab's end closed
    assert not os.path.exists(warm.path)
    assert warm.run(["--version"], timeout=60).returncode == 0  # and starts again when asked


def test_a_namespace_gone_is_an_error_that_names_it(node):
    name, warm = node
    subprocess.run(["ip", "netns", "del", name], check=True)
    with pytest.raises(LabError, match=f"no network namespace {name}"):
        warm.run(["--version"], timeout=60)


RELAY = os.path.join(os.path.dirname(warm_module.__file__), "warm_relay.py")


def relayed(name, warm, *args, stdin="", cwd=None):
    """`lbctl ARGS` as a node's sshd runs it: the relay, started bare in the
    namespace, with the session's stdin."""
    warm.ensure()
    return subprocess.run(["ip", "netns", "exec", name, sys.executable, "-I", "-S", RELAY,
                           warm.path, *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=60)


def test_a_relayed_command_answers_as_a_new_lbctl_process_would(node, tmp_path, monkeypatch):
    """What `--all` reads from a node: the cluster file on stdin, its
    environment's root and its output and exit status as lbctl's own."""
    name, warm = node
    subprocess.run(["ip", "-n", name, "address", "add", "10.77.0.3/24", "dev", "lo"], check=True)
    (tmp_path / "root" / "run").mkdir(parents=True)
    monkeypatch.setenv("LBCTL_ROOT", str(tmp_path / "root"))
    bad = CLUSTER + "surprise: 1\n"
    for args, stdin in ((["--version"], ""), (["--expect-version", "0.0.1", "--version"], ""),
                        (["plan", "-", "--node", "pi1"], CLUSTER),
                        (["validate", "-"], bad), (["no-such-command"], "")):
        through = relayed(name, warm, *args, stdin=stdin, cwd=tmp_path)
        cold = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-m", "lbctl", *args],
                              input=stdin, capture_output=True, text=True, cwd=tmp_path)
        assert (through.returncode, through.stdout, through.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr), args
    # The cases differ: a plan (0), another version (3), a bad file read from stdin (1).
    planned = relayed(name, warm, "plan", "-", "--node", "pi1", stdin=CLUSTER)
    assert planned.returncode == 0 and "10.77.0.10" in planned.stdout, planned
    assert relayed(name, warm, "--expect-version", "0.0.1", "--version").returncode == 3
    assert "<stdin>:8:1: top level: unknown key" in relayed(name, warm, "validate", "-",
                                                           stdin=bad).stderr


def in_namespace(name):
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return {int(pid) for pid in listed.stdout.split()}


def test_a_relay_ended_by_a_signal_ends_its_command_the_same_way(node, tmp_path):
    """ssh's session closing or a timeout's TERM reaches the command: it does
    not run on in the node after the caller has gone."""
    name, warm = node
    warm.ensure()
    # Waits on stdin that never closes: a command that runs until stopped.
    relay = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-I", "-S", RELAY,
                              warm.path, "validate", "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1)
        assert relay.poll() is None, relay.communicate()
        relay.terminate()
        assert relay.wait(timeout=30) == -signal.SIGTERM
        # Nothing of the command is left in the node, only the server.
        deadline = time.monotonic() + 10
        while in_namespace(name) != {warm.process.pid} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert in_namespace(name) == {warm.process.pid}
    finally:
        relay.kill()
        relay.wait()
        relay.stdin.close()
    assert warm.run(["--version"], timeout=60).returncode == 0  # the server goes on
