"""The lab's warm lbctl (lbctl.lab.warm): a command run through it answers
as a new `lbctl` process would, in the namespace named, and no longer."""

import os
import subprocess
import sys
import time

import pytest

from lbctl.errors import LabError
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
