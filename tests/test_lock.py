"""One apply, drain or undrain at a time per cluster and node."""

import os
import subprocess
import sys
import threading
import time

import pytest

from lbctl.errors import NodeError
from lbctl.records.lock import node_locked

HOLD = """
import sys, time
from lbctl.records.lock import node_locked
with node_locked(sys.argv[1], "pi-web", holder="lbctl apply"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print("released", flush=True)
"""


def hold_in_another_process(root, seconds):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_lbctl_waits_a_bounded_time_then_says_who_holds_the_lock(tmp_path):
    holder = hold_in_another_process(tmp_path, 30)
    try:
        with pytest.raises(NodeError) as raised:
            with node_locked(str(tmp_path), "pi-web", timeout=0.5, poll=0.05):
                pytest.fail("entered while another process held the lock")
        assert str(raised.value) == (
            f"another lbctl (pid {holder.pid}, lbctl apply) has been changing cluster pi-web on "
            "this node for over 0s; it holds /run/lbctl/pi-web.lock")
    finally:
        holder.kill()
        holder.wait()


def test_two_at_once_both_finish_one_after_the_other(tmp_path):
    holder = hold_in_another_process(tmp_path, 1)
    with node_locked(str(tmp_path), "pi-web", poll=0.05):
        assert holder.stdout.readline() == "released\n"  # the first had finished
    holder.wait()
    # Threads of one process too (the lock is on the open file, not the process).
    inside, overlap = [], []

    def one():
        with node_locked(str(tmp_path), "pi-web", poll=0.01):
            overlap.append(len(inside))
            inside.append(1)
            time.sleep(0.1)
            inside.pop()
    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == [0, 0, 0]


def test_a_lock_file_removed_by_its_holder_is_not_held_by_two_afterwards(tmp_path):
    """apply --remove takes the lock file away.  One that waited on the old
    file and one that comes after it is gone must still take turns."""
    first_in, waiting, inside, overlap = threading.Event(), threading.Event(), [], []

    def remover():
        with node_locked(str(tmp_path), "pi-web", poll=0.01) as lock:
            first_in.set()
            waiting.wait(5)
            time.sleep(0.2)  # the waiter is polling the old file now
            lock.remove_on_release()  # as apply --remove does

    def one(name):
        with node_locked(str(tmp_path), "pi-web", poll=0.01):
            overlap.append((name, list(inside)))
            inside.append(name)
            time.sleep(0.3)
            inside.remove(name)

    a = threading.Thread(target=remover)
    a.start()
    first_in.wait(5)
    b = threading.Thread(target=one, args=("waiter",))
    b.start()
    waiting.set()
    a.join()
    c = threading.Thread(target=one, args=("newcomer",))
    c.start()
    b.join()
    c.join()
    assert sorted(name for name, _ in overlap) == ["newcomer", "waiter"]
    assert all(others == [] for _, others in overlap), overlap


def test_apply_remove_keeps_its_lock_until_it_has_finished(tmp_path):
    """The lock file goes with lbctl's other files, but only as the removing
    apply lets go: a newcomer meanwhile waits, and none is left after."""
    from lbctl.adapters.files import remove_runtime_dirs
    from lbctl.layout import RUN_DIR, Layout

    layout = Layout("pi-web", str(tmp_path))
    newcomer_in = threading.Event()

    def newcomer():
        with node_locked(str(tmp_path), "pi-web", poll=0.01):
            newcomer_in.set()

    with node_locked(str(tmp_path), "pi-web", poll=0.01) as lock:
        remove_runtime_dirs(str(tmp_path), "pi-web")  # what apply --remove takes away
        assert os.path.exists(layout.real(layout.lock))
        lock.remove_on_release()
        arriving = threading.Thread(target=newcomer)
        arriving.start()
        # The removing apply still prints its report here.
        assert not newcomer_in.wait(0.5), "a newcomer got in while apply --remove held the lock"
    arriving.join(5)
    assert newcomer_in.is_set()
    with node_locked(str(tmp_path), "pi-web", poll=0.01) as lock:
        lock.remove_on_release()
    assert not os.path.exists(layout.real(RUN_DIR))  # no trace of lbctl


def test_a_folder_removed_under_a_newcomer_is_made_again(tmp_path, monkeypatch):
    """apply --remove takes /run/lbctl away as it lets go: one that made the
    folder a moment before must not fail on it."""
    from lbctl.adapters import files
    from lbctl.layout import Layout

    layout = Layout("pi-web", str(tmp_path))
    real_ensure_dir, calls = files.ensure_dir, []

    def ensure_dir_then_lose_it(root, path):
        real_ensure_dir(root, path)
        calls.append(path)
        if len(calls) == 1:  # the remover's rmdir, between ensure_dir's mkdir and its stat
            os.rmdir(layout.real(path))
            os.stat(layout.real(path))
    monkeypatch.setattr(files, "ensure_dir", ensure_dir_then_lose_it)
    with node_locked(str(tmp_path), "pi-web", poll=0.01):
        assert os.path.exists(layout.real(layout.lock))
    assert len(calls) == 2


def test_a_lock_whose_file_was_replaced_while_waiting_is_taken_again(tmp_path, monkeypatch):
    """Locked, but the path names another file by then (removed and made
    anew): the lock is on the file at the path, or it is no lock."""
    import fcntl

    from lbctl.layout import Layout

    layout = Layout("pi-web", str(tmp_path))
    path = layout.real(layout.lock)
    real_flock, calls = fcntl.flock, []

    def flock_after_a_replacement(fd, operation):
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(path)
            open(path, "w").close()
        return real_flock(fd, operation)
    monkeypatch.setattr(fcntl, "flock", flock_after_a_replacement)
    with node_locked(str(tmp_path), "pi-web", poll=0.01, holder="lbctl apply"):
        assert len(calls) == 2
        assert open(path).read() == f"{os.getpid()} lbctl apply\n"  # the file at the path is ours
