"""The cluster file as last applied on this balancer (its saved copy).

Commands that act on the running cluster rather than roll out a file (drain,
undrain, status --connections) take names and weights from it, so they never
carry out edits of the file that were not applied yet.
"""

import os

from lbctl.errors import NodeError
from lbctl.layout import OWNERSHIP_DIR, Layout


def _real(root, name):
    layout = Layout(name, root)
    return layout.real(layout.saved_copy)


def saved_clusters(root, strict=True, leave_out=None, load=None):
    """The clusters applied here that have a saved copy, loaded from it (but
    the one named `leave_out`).  `strict` False (status, the exporter,
    apply's look at its neighbours): a copy that no longer loads is left out
    rather than stopping a report on the rest.  `load(path)`: load_cluster
    unless given (SavedCopies)."""
    from lbctl.errors import LbctlError
    from lbctl.records.ownership import applied_here

    if load is None:
        from lbctl.config import load_cluster as load
    found = []
    for name, _node in applied_here(root, OWNERSHIP_DIR):
        if name != leave_out and os.path.exists(_real(root, name)):
            try:
                found.append(load(_real(root, name)))
            except LbctlError:
                if strict:
                    raise
    return found


class SavedCopies:
    """saved_clusters(root, strict=False) for a process that asks again and
    again (the exporter, at each scrape): a saved copy is read and validated
    again only once it changed.  apply renames a new copy into place, so a
    copy is the same while its inode, size and time are."""

    def __init__(self, root):
        self.root = root
        self._loaded = {}  # {path: ((device, inode, size, mtime), Cluster)}

    def __call__(self):
        used = {}
        found = saved_clusters(self.root, strict=False,
                               load=lambda path: self._load(path, used))
        self._loaded = used  # what is no longer applied here is forgotten
        return found

    def _load(self, path, used):
        from lbctl.config import load_cluster

        try:
            info = os.stat(path)
        except OSError:
            # Gone since it was listed (an apply --remove): load_cluster says
            # so as an LbctlError, which leaves it out of this scrape.
            return load_cluster(path)
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        kept = self._loaded.get(path)
        # Stat first, then read: a copy replaced in between is read anew next time.
        cluster = kept[1] if kept is not None and kept[0] == identity else load_cluster(path)
        used[path] = (identity, cluster)
        return cluster


def applied_cluster(root, name=None, worker=None):
    """(Cluster, path of its saved copy) of the cluster applied on this balancer:
    the one named, else the only one here (with `worker`, if given)."""
    from lbctl.config import load_cluster

    def real(name):
        return _real(root, name)

    if name is not None:
        if not os.path.exists(real(name)):
            raise NodeError(f"cluster {name} has no saved copy here ({Layout(name).saved_copy}): "
                            "this is not one of its balancers, or it was applied by an lbctl "
                            "before 0.2; `lbctl apply` it here first")
        return load_cluster(real(name)), real(name)
    found = saved_clusters(root)
    if worker is not None:
        found = [c for c in found if worker in c.workers] or found
    if len(found) == 1:
        return found[0], real(found[0].name)
    if not found:
        raise NodeError("no cluster applied on this host has a saved copy, so this is not a "
                        "balancer lbctl runs; name the cluster file, or `lbctl apply` it first")
    raise NodeError(f"several clusters are applied here ({', '.join(c.name for c in found)}): "
                    "name the cluster file")
