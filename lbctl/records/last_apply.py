"""When apply last ran on this balancer and whether it succeeded, for the exporter.

Kept under /run beside keepalived's state: it describes this boot's node, and
a second apply of the same file still changes nothing the node keeps.
"""

import json
import time

from lbctl.layout import Layout


def record_last_apply(root, cluster_name, ok, error=None, now=None):
    """Best effort: a node whose /run cannot be written still applies."""
    from lbctl.adapters.files import FilesRoot

    entry = {"time": time.time() if now is None else now, "ok": ok, "error": error}
    try:
        FilesRoot(root).write(Layout(cluster_name).last_apply, json.dumps(entry) + "\n", 0o644)
    except OSError:
        pass


def read_last_apply(root, cluster_name):
    """{"time", "ok", "error"}, or None if no apply ran since boot."""
    try:
        layout = Layout(cluster_name, root)
        with open(layout.real(layout.last_apply), encoding="utf-8") as fh:
            entry = json.load(fh)
        return entry if isinstance(entry, dict) and {"time", "ok"} <= set(entry) else None
    except (OSError, ValueError):
        return None
