"""One lbctl at a time changing a cluster on this node.

apply, drain and undrain each read the node, decide and write: two at once (a
rollout's drain and a person's apply) would each write back what they read,
and one would undo the other.  The lock is a file only root can open, so no
other user can hold lbctl up.  It lives under /run: runtime state, gone at
boot, and never part of what apply declares.
"""

import os
import time
from contextlib import contextmanager

from lbctl.errors import NodeError
from lbctl.layout import Layout


@contextmanager
def node_locked(root, cluster_name, timeout=300.0, poll=0.2, holder=None):
    """Hold the cluster's lock on this node, waiting up to `timeout` seconds.
    The holder (pid and command) is written into the lock file, so one that
    waits too long can say who holds it."""
    import fcntl

    from lbctl.adapters.files import ensure_dir

    layout = Layout(cluster_name, root)
    path = layout.real(layout.lock)
    deadline = time.monotonic() + timeout
    while True:
        ensure_dir(root, os.path.dirname(layout.lock))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                other = _holder_of(fd)
                os.close(fd)
                raise NodeError(f"another lbctl ({other}) has been changing "
                                f"cluster {cluster_name} on this node for over "
                                f"{timeout:.0f}s; it holds {layout.lock}") from None
            os.close(fd)
            time.sleep(poll)
            continue
        if _still_the_lock(fd, path):
            break
        # `apply --remove` deleted the file while this one waited on it: a
        # lock on a file nobody else can open is no lock.  Take the new one.
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {holder or _this_command()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # and with it the lock


def _still_the_lock(fd, path):
    """Whether the file locked through `fd` is still the one at `path`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _this_command():
    import sys

    return " ".join(w for w in ["lbctl", *sys.argv[1:2]] if w.isprintable())[:60]


def _holder_of(fd):
    """'pid 1234, lbctl apply' from the lock file, as its holder wrote it."""
    text = os.pread(fd, 128, 0).decode("ascii", "replace").strip()
    pid, _, command = text.partition(" ")
    if not pid.isdigit():
        return "its holder is not known"
    shown = "".join(c if c.isprintable() else "?" for c in command)
    return f"pid {pid}, {shown}"

