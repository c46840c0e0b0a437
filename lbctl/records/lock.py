"""One lbctl at a time changing a cluster on this node.

apply, drain and undrain each read the node, decide and write: two at once (a
rollout's drain and a person's apply) would each write back what they read,
and one would undo the other.  The lock is a file only root can open, so no
other user can hold lbctl up.  It lives under /run: runtime state, gone at
boot, and never part of what apply declares.

`apply --remove` takes the lock file away with the rest of lbctl, and does
so as its holder lets go (NodeLock.remove_on_release), never before: a
newcomer that then makes a new file finds no one inside.  One that waited on
the old file sees that the path names another file now and locks that one.
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
    lock_dir = os.path.dirname(layout.lock)
    folder = layout.real(lock_dir)
    deadline = time.monotonic() + timeout
    while True:
        try:
            ensure_dir(root, lock_dir)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError as exc:
            # A removing holder took the lock's folder away just now: make it
            # again.  Anything else missing (the root itself) is an error.
            if exc.filename not in (folder, path) or time.monotonic() >= deadline:
                raise
            time.sleep(poll)
            continue
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
    held = NodeLock(fd, path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {holder or _this_command()}\n".encode(), 0)
        yield held
    finally:
        held.release()


class NodeLock:
    """The lock node_locked() holds; released when its block ends."""

    def __init__(self, fd, path):
        self.fd, self.path, self.remove = fd, path, False

    def remove_on_release(self):
        """Take the lock file, and its folder if nothing else is in it, away
        as the lock is let go (apply --remove: no trace of lbctl is left)."""
        self.remove = True

    def release(self):
        try:
            if self.remove and _still_the_lock(self.fd, self.path):
                os.unlink(self.path)
                try:
                    os.rmdir(os.path.dirname(self.path))
                except OSError:
                    pass  # another cluster's lock, or its runtime folder, is there
        finally:
            os.close(self.fd)  # and with it the lock


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

