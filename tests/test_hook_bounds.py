"""No keepalived hook waits without bound on a lock: one held for good (a
hung hook, a stuck apply) makes the next hook give up and say so, instead of
piling up behind it.  And apply's own wait on the takeover hook's lock ends."""

import fcntl
import os
import subprocess
import threading
import time

import pytest

from helpers import install_hook

BOUND = "flock -w 30 9"


def hook_waiting_briefly(folder, name):
    """The hook as apply installs it, its 30 s wait cut to 1 s for the test."""
    script = install_hook(folder, name)
    text = script.read_text()
    assert text.count(BOUND) == 1, f"{name} no longer bounds its wait as {BOUND!r}"
    script.write_text(text.replace(BOUND, "flock -w 1 9"))
    return script


def lock_and_args(name, folder):
    """(the path the hook locks, its arguments) for one run of the hook."""
    state = folder / "state"
    state.mkdir()
    if name == "lbctl-notify":
        return state / ".lock.vrrp", [state, "vrrp", "INSTANCE", "lbctl_pi-web", "MASTER", "150"]
    if name == "lbctl-announce":
        (folder / "map").write_text("192.0.2.10 TCP-192.0.2.10-80\n")
        return state, [state, folder / "bird.ctl", folder / "map", folder / "drained", "event",
                       "TCP-192.0.2.10-80", "up"]
    rules = folder / "takeover.nft"
    rules.write_text("")
    return rules, [rules, "lbctl-pi-web", "192.0.2.250", "master"]


@pytest.mark.parametrize("name", ["lbctl-notify", "lbctl-announce", "lbctl-takeover"])
def test_a_hook_gives_up_on_a_lock_held_for_good_and_says_so(tmp_path, name):
    script = hook_waiting_briefly(tmp_path, name)
    locked, args = lock_and_args(name, tmp_path)
    locked.touch()
    holder = os.open(locked, os.O_RDONLY)  # a hook or an apply that never ends
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        done = subprocess.run([str(script), *map(str, args)], capture_output=True, text=True,
                              timeout=20)
        took = time.monotonic() - started
    finally:
        os.close(holder)
    assert done.returncode == 1, done.stderr
    assert "30s" in done.stderr and name in done.stderr, done.stderr
    assert took < 10
    # Nothing written without the lock.
    if name == "lbctl-notify":
        assert not (tmp_path / "state" / "vrrp").exists()
    elif name == "lbctl-announce":
        # Nothing offered; the event is recorded first, under a lock of its
        # own, so that keepalived killing a waiting hook loses nothing.
        assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
            "TCP-192.0.2.10-80.lock", "TCP-192.0.2.10-80.state"]


def test_the_announce_hook_gives_up_on_a_record_locked_for_good(tmp_path):
    script = install_hook(tmp_path, "lbctl-announce")
    text = script.read_text()
    assert text.count("flock -w 10 8") == 1
    script.write_text(text.replace("flock -w 10 8", "flock -w 1 8"))
    locked, args = lock_and_args("lbctl-announce", tmp_path)
    holder = os.open(locked / "TCP-192.0.2.10-80.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        done = subprocess.run([str(script), *map(str, args)], capture_output=True, text=True,
                              timeout=20)
    finally:
        os.close(holder)
    assert (done.returncode, done.stderr) == (
        1, f"lbctl-announce: {locked}/TCP-192.0.2.10-80.state stayed locked for 10s\n")
    assert not (locked / "TCP-192.0.2.10-80.state").exists()


def test_apply_waits_on_the_takeover_hook_for_a_bounded_time(tmp_path):
    from lbctl.adapters.files import flock_within
    from lbctl.errors import ApplyError

    rules = tmp_path / "takeover.nft"
    rules.write_text("")
    holder = os.open(rules, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a hook that never ends
    waiter = os.open(rules, os.O_RDONLY)
    outcome = []

    def wait():
        try:
            flock_within(waiter, str(rules), 0.3)
            outcome.append("locked")
        except ApplyError as exc:
            outcome.append(str(exc))
    thread = threading.Thread(target=wait, daemon=True)
    try:
        thread.start()
        thread.join(5)
        assert outcome and "has held it for over 0.3s; run the command again" in outcome[0], outcome
        # Once the hook is done, apply takes the lock.
        fcntl.flock(holder, fcntl.LOCK_UN)
        flock_within(waiter, str(rules), 0.3)
    finally:
        os.close(holder)
        os.close(waiter)
