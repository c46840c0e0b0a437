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


def lock_path(cluster_name):
    return f"/run/lbctl/{cluster_name}.lock"


@contextmanager
def node_locked(root, cluster_name, timeout=300.0, poll=0.2):
    import fcntl

    path = os.path.join(root, lock_path(cluster_name).lstrip("/"))
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise NodeError(f"another lbctl has been changing cluster {cluster_name} on "
                                    f"this node for over {timeout:.0f}s (apply, drain or "
                                    f"undrain; it holds {lock_path(cluster_name)})") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # and with it the lock


def remove_lock(root, cluster_name):
    """After apply --remove: the lock goes with the cluster's other files."""
    try:
        os.unlink(os.path.join(root, lock_path(cluster_name).lstrip("/")))
    except FileNotFoundError:
        pass
