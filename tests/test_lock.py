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
    """apply --remove deletes the lock file while holding it.  One that waited
    on the old file and one that comes after must still take turns."""
    from lbctl.layout import Layout

    layout = Layout("pi-web", str(tmp_path))
    first_in, waiting, inside, overlap = threading.Event(), threading.Event(), [], []

    def remover():
        with node_locked(str(tmp_path), "pi-web", poll=0.01):
            first_in.set()
            waiting.wait(5)
            time.sleep(0.2)  # the waiter is polling the old file now
            os.unlink(layout.real(layout.lock))  # as apply --remove does

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
