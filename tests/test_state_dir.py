"""What root reads from keepalived's state folder, which its script user owns."""

import os
import signal
import subprocess
from contextlib import contextmanager

import pytest

from helpers import install_hook
from lbctl.status.health import read_state_dir, read_transitions
from lbctl.render.keepalived import script_text


@contextmanager
def must_finish_within(seconds):
    def hung(*_):
        raise AssertionError(f"still reading after {seconds} s")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_hook_files_are_read_with_their_states(tmp_path):
    (tmp_path / "vrrp").write_text("MASTER 1700000000.5\n")
    (tmp_path / "health.web@pi1").write_text("up 1700000001.25\n")
    found = read_state_dir(str(tmp_path))
    assert {name: (r.state, r.since) for name, r in found.items()} == {
        "vrrp": ("MASTER", 1700000000.5), "health.web@pi1": ("up", 1700000001.25)}


def test_a_fifo_and_links_to_devices_neither_hang_nor_exhaust_memory(tmp_path):
    os.mkfifo(tmp_path / "vrrp")
    (tmp_path / "health.web@pi1").symlink_to("/dev/zero")
    (tmp_path / "health.web@pi2").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("up 1700000001\n")
    (tmp_path / "vrrp.transitions").symlink_to("/dev/zero")
    with must_finish_within(5):
        assert read_state_dir(str(tmp_path)) == {}
        assert read_transitions(str(tmp_path)) == 0


def test_only_the_states_hooks_write_are_believed(tmp_path):
    (tmp_path / "vrrp").write_text("\x1b]0;owned\x07 1700000000\n")
    (tmp_path / "health.web@pi1").write_text("MASTER 1700000000\n")  # not a health state
    (tmp_path / "health.web@pi2").write_text("up nan\n")
    (tmp_path / "health.web@pi3").write_text("up " + "1" * 4096 + "\n")  # past a hook's size
    (tmp_path / "health.web@\x1b[2J").write_text("up 1700000000\n")  # not a name lbctl makes
    (tmp_path / "vrrp.transitions").write_text("2**64\n")
    assert read_state_dir(str(tmp_path)) == {}
    assert read_transitions(str(tmp_path)) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_of_another_user_is_ignored(tmp_path):
    (tmp_path / "vrrp").write_text("MASTER 1700000000\n")
    os.chown(tmp_path / "vrrp", 12345, 12345)
    (tmp_path / "vrrp.transitions").write_text("7\n")
    os.chown(tmp_path / "vrrp.transitions", 12345, 12345)
    assert read_state_dir(str(tmp_path)) == {}
    assert read_transitions(str(tmp_path)) == 0
    os.chown(tmp_path / "vrrp.transitions", 0, 0)
    assert read_transitions(str(tmp_path)) == 7


def test_the_check_script_does_no_arithmetic_with_what_it_reads(tmp_path):
    script = tmp_path / "lbctl-check"
    script.write_text(script_text("lbctl-check"))
    script.chmod(0o755)
    state = tmp_path / "check.state"
    witness = tmp_path / "ran"
    # bash evaluates $((count + 1)) as an expression, command substitution included.
    state.write_text(f"up a[$(touch {witness})]\n")
    done = subprocess.run([str(script), str(state), "1", "3", "0.5", "exec", "127.0.0.1", "80",
                           "--", "/bin/false"], capture_output=True, text=True)
    assert not witness.exists()
    assert done.returncode == 0  # one failure of three allowed: still up
    assert state.read_text() == "up 1\n"
    state.write_text("sideways 99999999999999999999\n")
    subprocess.run([str(script), str(state), "1", "3", "0.5", "exec", "127.0.0.1", "80",
                    "--", "/bin/true"], capture_output=True)
    assert state.read_text() == "up 0\n"  # read as down with no count, then one pass rises


def _script(tmp_path, name):
    return str(install_hook(tmp_path, name))


@pytest.mark.parametrize("trap", ["fifo", "zero", "sparse"])
def test_the_hooks_finish_whatever_their_own_files_are(tmp_path, trap):
    """A hook that never ends holds its lock, and burns a CPU, for ever."""
    state = tmp_path / "state"
    state.mkdir()
    for name in ("vrrp", "vrrp.transitions", "check.state", ".lock.vrrp"):
        if name == ".lock.vrrp" and trap != "fifo":
            continue  # the lock is only opened, never read
        if trap == "fifo":
            os.mkfifo(state / name)
        elif trap == "zero":
            (state / name).symlink_to("/dev/zero")
        else:  # a regular file of NULs that bash's read would skip to its end
            with open(state / name, "wb") as fh:
                fh.truncate(1 << 40)
    notify = subprocess.run([_script(tmp_path, "lbctl-notify"), str(state), "vrrp", "lab", "x",
                             "MASTER"], capture_output=True, text=True, timeout=10)
    assert notify.returncode == 0, notify.stderr
    assert (state / "vrrp").read_text().startswith("MASTER ")
    assert (state / "vrrp.transitions").read_text() == "1\n"
    check = subprocess.run([_script(tmp_path, "lbctl-check"), str(state / "check.state"), "1",
                            "3", "0.5", "exec", "127.0.0.1", "80", "--", "/bin/true"],
                           capture_output=True, text=True, timeout=10)
    assert check.returncode == 0 and (state / "check.state").read_text() == "up 0\n"

