"""When apply last ran on this balancer and whether it succeeded, for the exporter.

Kept under /run beside keepalived's state: it describes this boot's node, and
a second apply of the same file still changes nothing the node keeps.
"""

import json
import os
import time


def _path(root, cluster_name):
    return os.path.join(root, "run/lbctl", cluster_name, "last-apply.json")


def record_last_apply(root, cluster_name, ok, error=None, now=None):
    """Best effort: a node whose /run cannot be written still applies."""
    from lbctl.adapters.files import FilesRoot

    entry = {"time": time.time() if now is None else now, "ok": ok, "error": error}
    try:
        FilesRoot(root).write(f"/run/lbctl/{cluster_name}/last-apply.json",
                              json.dumps(entry) + "\n", 0o644)
    except OSError:
        pass


def read_last_apply(root, cluster_name):
    """{"time", "ok", "error"}, or None if no apply ran since boot."""
    try:
        with open(_path(root, cluster_name), encoding="utf-8") as fh:
            entry = json.load(fh)
        return entry if isinstance(entry, dict) and {"time", "ok"} <= set(entry) else None
    except (OSError, ValueError):
        return None
