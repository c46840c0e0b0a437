"""--all shares one ssh connection per node for the whole command (remote/connections.py)."""

import os
import re
import shutil
import socket
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import PI_SINGLE
from lbctl.remote import connections
from lbctl.remote.ssh import Target, ssh_argv


@pytest.fixture(autouse=True)
def no_folder_yet(monkeypatch):
    """Each test starts as a new lbctl process would: no folder made or tried."""
    monkeypatch.setattr(connections, "_folder", None)
    monkeypatch.setattr(connections, "_tried", False)
    yield
    connections.close_all()


def test_every_ssh_of_a_command_shares_one_private_folder_of_masters():
    first = ssh_argv(Target("pi1", "worker", "192.168.1.3"), ["validate", "-"])
    second = ssh_argv(Target("lb1", "balancer", "192.168.1.2"), ["apply", "-"])
    path = next(o for o in first if o.startswith("ControlPath="))
    assert path in second and "ControlMaster=auto" in first
    folder = os.path.dirname(path.split("=", 1)[1])
    info = os.stat(folder)
    # Only this user may reach the masters (a socket there is a login to every node).
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    # A random name, so no other user can make it first.
    assert re.fullmatch(r"lbctl-ssh-\w{8}", os.path.basename(folder))
    connections.close_all()
    assert not os.path.exists(folder)


def _folder_of(options):
    path = next(o for o in options if o.startswith("ControlPath="))
    return os.path.dirname(path.split("=", 1)[1])


@pytest.fixture
def short_tmp(monkeypatch):
    """A private $TMPDIR whose length the test sets (pytest's own is too deep)."""
    base = tempfile.mkdtemp(prefix="s", dir="/tmp")
    monkeypatch.setattr(connections.tempfile, "tempdir", None)

    def at_length(length):
        connections.close_all()
        path = os.path.join(base, "d" * (length - len(base) - 1))
        os.makedirs(path, exist_ok=True)
        monkeypatch.setenv("TMPDIR", path)
        connections.tempfile.tempdir = None
        return path

    yield at_length
    connections.close_all()
    shutil.rmtree(base)


def test_every_master_socket_ssh_would_bind_fits_whatever_the_tmpdir(short_tmp):
    """ssh binds a master's socket as PATH.<16 random characters> before it
    renames it to PATH (%C: 40 hex digits): the kernel must take that name
    under the folder chosen, at every $TMPDIR depth around the limit."""
    for length in range(20, 41):  # $TMPDIR of 30 characters is the deepest that fits
        tmpdir = short_tmp(length)
        folder = _folder_of(connections.sharing_options())
        # Under $TMPDIR while it is short enough, else under /tmp.
        assert os.path.dirname(folder) == (tmpdir if length <= 30 else "/tmp"), length
        longest = os.path.join(folder, "c" * 40 + "." + "r" * 16)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(longest)  # OSError "AF_UNIX path too long" if it did not fit
        os.unlink(longest)
        with socket.socket(socket.AF_UNIX) as sock, pytest.raises(OSError):
            sock.bind(longest + "x" * (108 - len(longest)))  # the limit is real


def test_threads_starting_at_once_share_one_folder(short_tmp, monkeypatch):
    tmpdir = short_tmp(25)
    real_mkdtemp = tempfile.mkdtemp

    def slow_mkdtemp(**kwargs):  # the others arrive while the first makes it
        time.sleep(0.05)
        return real_mkdtemp(**kwargs)

    monkeypatch.setattr(connections.tempfile, "mkdtemp", slow_mkdtemp)
    with ThreadPoolExecutor(8) as pool:
        folders = set(pool.map(lambda _: _folder_of(connections.sharing_options()), range(64)))
    assert len(folders) == 1
    assert os.listdir(tmpdir) == [os.path.basename(folders.pop())]


def test_no_folder_short_enough_shares_nothing(monkeypatch):
    monkeypatch.setattr(connections, "_fits", lambda folder: False)
    try:
        assert connections.sharing_options() == []
        argv = ssh_argv(Target("pi1", "worker", "192.168.1.3"), ["validate", "-"])
        assert not any(o.startswith("Control") for o in argv)  # a plain login each time
    finally:
        connections.close_all()



@pytest.fixture
def ssh_calls(monkeypatch):
    """The ssh command lines run, each answered as a node that is down."""
    import subprocess

    from lbctl.remote import ssh

    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, ssh.SSH_FAILED, "", "ssh: No route to host\n")
    monkeypatch.setattr(ssh.subprocess, "run", run)
    return calls


@pytest.mark.parametrize("command", ["doctor", "plan", "status"])
def test_a_command_that_reaches_each_node_once_starts_no_master(ssh_calls, tmp_path, command):
    """A master started for one session, then told to exit, costs a fork and
    an ssh -O exit per node for nothing."""
    import importlib
    import io
    from types import SimpleNamespace

    path = tmp_path / "pair.yaml"
    path.write_text(PI_SINGLE)
    module = importlib.import_module(f"lbctl.commands.cluster_{command}")
    args = SimpleNamespace(file=str(path), node=None, ssh_config=None, json=False,
                           no_drift=False, remove=False, force=False, detailed_exitcode=False)
    module.run(args, io.StringIO())
    assert sorted(argv[argv.index("--") + 1] for argv in ssh_calls) == [
        "192.168.100.2", "192.168.100.3", "192.168.100.4", "192.168.100.6"]
    assert not any(option.startswith("Control") for argv in ssh_calls for option in argv)
    assert connections._folder is None  # no folder of sockets made either


def test_a_command_that_asks_again_shares_its_connections(ssh_calls, tmp_path):
    from lbctl.config import load_cluster
    from lbctl.remote.fleet import select, statuses

    path = tmp_path / "pair.yaml"
    path.write_text(PI_SINGLE)
    cluster = load_cluster(str(path))
    statuses(cluster, select(cluster), None)  # what rollout and apply --all ask between steps
    assert len(ssh_calls) == 4
    assert all("ControlMaster=auto" in argv for argv in ssh_calls)
