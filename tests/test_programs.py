"""The programs root runs: by absolute path, bounded in time, as the right user."""

import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import cluster_from
from lbctl.adapters import keepalived
from lbctl.adapters.addrs import AddressIp
from lbctl.adapters.programs import run
from lbctl.errors import ApplyError
from lbctl.status.health import MAX_SETTLE_WAIT, settle_seconds

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def test_a_program_that_does_not_answer_is_an_error_naming_it():
    with pytest.raises(ApplyError, match=r"run /bin/sleep 5: no answer after 0.5 s"):
        run(["/bin/sleep", "5"], timeout=0.5)


def test_ip_comes_from_its_absolute_path_not_from_path(tmp_path, monkeypatch):
    witness = tmp_path / "ran"
    fake = tmp_path / "ip"
    fake.write_text(f"#!/bin/sh\ntouch {witness}\necho '[]'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert AddressIp().list()  # this host's own addresses, from the real ip
    assert not witness.exists()


def test_apply_waits_for_checks_a_bounded_time_whatever_their_interval():
    hourly = "health: {tcp: {}, interval: 3600s, timeout: 300s, rise: 10}"
    cluster = cluster_from("""\
cluster: pi-web
balancers:
  lb1: {address: 192.168.100.2, interface: eth0}
workers:
  pi1: {address: 192.168.100.3}
services:
  web: {vip: 192.168.100.10, port: 80, %s}
""" % hourly)
    assert cluster.health_settle_seconds == 10 * 3600 + 300
    assert settle_seconds(cluster) == MAX_SETTLE_WAIT == 120


@pytest.mark.parametrize("uid, shell", [(1000, "/bin/bash"), (998, "/bin/sh"), (1001, "/usr/sbin/nologin"),
                                        (0, "/usr/sbin/nologin")])
def test_a_login_account_named_like_the_script_user_is_not_adopted(monkeypatch, uid, shell):
    account = SimpleNamespace(pw_name="lbctl", pw_uid=uid, pw_gid=uid, pw_shell=shell)
    monkeypatch.setattr(keepalived, "_user", lambda name: account)
    with pytest.raises(ApplyError, match=f"exists as a login account \\(uid {uid}, shell {shell}\\)"):
        keepalived.ensure_system_user("lbctl")


def test_a_system_account_without_a_login_is_used_as_it_is(monkeypatch):
    account = SimpleNamespace(pw_name="lbctl", pw_uid=996, pw_gid=996, pw_shell="/usr/sbin/nologin")
    ran = []
    monkeypatch.setattr(keepalived, "_user", lambda name: account)
    monkeypatch.setattr(keepalived, "run", lambda argv, **kw: ran.append(argv))
    assert keepalived.ensure_system_user("lbctl") is None
    assert ran == []  # no useradd: the account is there


def test_a_missing_script_user_is_added_as_a_system_user_without_a_login(monkeypatch):
    from subprocess import CompletedProcess

    accounts, ran = {}, []

    def useradd(argv, **kw):
        ran.append(argv)
        accounts[argv[-1]] = SimpleNamespace(pw_name=argv[-1], pw_uid=996, pw_gid=996,
                                             pw_shell="/usr/sbin/nologin")
        return CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(keepalived, "_user", accounts.get)
    monkeypatch.setattr(keepalived, "run", useradd)
    keepalived.ensure_system_user("lbctl")
    assert ran == [[keepalived.USERADD, "--system", "--user-group", "--no-create-home",
                    "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "lbctl"]]
    keepalived.ensure_system_user("lbctl")
    assert len(ran) == 1  # added once


@pytest.fixture
def folder_under():
    """folder_under(PARENT): a fresh folder there, mode 0755, removed after the test.
    Under /var/tmp every user may enter it (pytest's own tmp root is closed to
    them); under /run only root can change anything above it (unlike /tmp)."""
    made = []

    def make(parent):
        folder = Path(tempfile.mkdtemp(dir=parent))
        os.chmod(folder, 0o755)
        made.append(folder)
        return folder
    yield make
    for folder in made:
        shutil.rmtree(folder)


@needs_root
def test_an_exec_check_the_script_user_cannot_run_is_named_with_the_reason(folder_under):
    nobody = pwd.getpwnam("nobody")
    closed = folder_under("/var/tmp") / "closed"
    closed.mkdir(mode=0o700)
    program = closed / "check-web"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    with pytest.raises(ApplyError, match=f"who cannot run it \\(it may not enter {closed}\\)"):
        keepalived._require_runnable_by(nobody, str(program))
    closed.chmod(0o755)
    keepalived._require_runnable_by(nobody, str(program))
    program.chmod(0o700)
    with pytest.raises(ApplyError, match="is not an executable file"):
        keepalived._require_runnable_by(nobody, str(program))
    with pytest.raises(ApplyError, match="does not exist"):
        keepalived._require_runnable_by(nobody, str(closed / "missing"))


def venv_with_lbctl(folder):
    """A venv in `folder` with lbctl's package copied into its site-packages."""
    import subprocess

    import lbctl

    venv = folder / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    shutil.copytree(os.path.dirname(lbctl.__file__), site / "lbctl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return venv, site / "lbctl"


@needs_root
def test_the_boot_unit_runs_only_a_python_and_lbctl_that_only_root_can_change(folder_under):
    root_only_folder = folder_under("/run")
    from lbctl.errors import NodeError
    from lbctl.engine.node import require_root_only_python

    venv, package = venv_with_lbctl(root_only_folder)
    python = str(venv / "bin" / "python")
    require_root_only_python(python)
    # A venv in a user's checkout: that user edits lbctl and is root at the next boot.
    os.chown(venv, 1000, 1000)
    with pytest.raises(NodeError, match=f"{venv} is owned by uid 1000 with mode 0755, so another "
                                        "user could change what root runs"):
        require_root_only_python(python)
    os.chown(venv, 0, 0)
    os.chmod(package, 0o775)
    with pytest.raises(NodeError, match=f"{package} is owned by uid 0 with mode 0775"):
        require_root_only_python(python)
    os.chmod(package, 0o755)
    os.chown(package / "cli.py", 1000, 1000)  # one file a user may edit is enough
    with pytest.raises(NodeError, match=f"{package}/cli.py is owned by uid 1000"):
        require_root_only_python(python)
    os.chown(package / "cli.py", 0, 0)
    # A sticky folder such as /tmp protects no name: it is emptied at boot,
    # and anyone may then claim the path the unit runs.
    os.chmod(root_only_folder, 0o1777)
    with pytest.raises(NodeError, match=f"{root_only_folder} is owned by uid 0 with mode 1777"):
        require_root_only_python(python)


@needs_root
def test_a_python_that_cannot_import_lbctl_isolated_gets_no_boot_unit(folder_under):
    from lbctl.errors import NodeError
    from lbctl.engine.node import require_root_only_python

    venv, package = venv_with_lbctl(folder_under("/run"))
    shutil.rmtree(package)  # lbctl only through PYTHONPATH or a user site: -I drops both
    with pytest.raises(NodeError, match="cannot import lbctl"):
        require_root_only_python(str(venv / "bin" / "python"))


@needs_root
def test_a_python_a_user_owns_costs_a_single_balancer_only_its_announcement(
        folder_under, monkeypatch):
    """keepalived brings a single balancer back by itself: its unit runs
    Python only to announce the VIPs.  A venv a user owns leaves that out
    with a warning; the units that need Python refuse it as before."""
    from lbctl.engine.desired import desired_state
    from lbctl.engine.node import _boot_apply
    from lbctl.errors import NodeError
    from lbctl.layout import Layout

    venv, _ = venv_with_lbctl(folder_under("/run"))
    os.chown(venv, 1000, 1000)
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    pair = (Path(__file__).parent.parent / "examples" / "pi-pair.yaml").read_text()
    text = pair.replace("  lb2: {address: 192.168.100.5, interface: eth0, priority: 100}\n", "")
    single = cluster_from(text)
    assert single.engine == "keepalived" and single.mode.value == "single"
    boot, warning = _boot_apply(single, "/")
    assert not boot.announce
    assert warning.startswith("the keepalived unit will not announce the VIPs it puts back at "
                              f"boot (gratuitous ARP): the boot unit would run {venv}/bin/python")
    files = desired_state(single, "lb1", "eth0", layout=Layout(single.name), boot=boot).files
    unit = files[Layout(single.name).unit_file("keepalived")].content
    assert "address replace 192.168.100.10/32" in unit and "garp" not in unit
    # The same Python, root's alone: the unit announces.
    os.chown(venv, 0, 0)
    boot, warning = _boot_apply(single, "/")
    assert boot.announce and warning is None
    os.chown(venv, 1000, 1000)
    with pytest.raises(NodeError, match="owned by uid 1000"):
        _boot_apply(cluster_from((Path(__file__).parent.parent / "examples" /
                                  "pi-single.yaml").read_text()), "/")


def test_a_program_that_outlives_its_bound_is_killed_with_its_children(tmp_path):
    """apply's bound on a hook must not leave the hook's child running with
    what the hook locked (lbctl-announce's birdc held its folder's lock)."""
    import os
    import time

    from lbctl.adapters.programs import run
    from lbctl.errors import ApplyError

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "hook"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    script.chmod(0o755)
    began = time.monotonic()
    with pytest.raises(ApplyError, match="no answer after 1 s"):
        run([str(script)], timeout=1)
    assert time.monotonic() - began < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    state = open(f"/proc/{child}/stat").read().split()[2] if os.path.exists(
        f"/proc/{child}") else "gone"
    assert state in ("gone", "Z"), state
