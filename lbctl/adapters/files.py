"""Files under a root directory ("/" on a node, a per-node folder in the lab).

Writes go to a private temporary file in the target's own directory and are
renamed into place, so a reader never sees half a file and an interrupted
write leaves the old file intact.
"""

import os
import stat
import tempfile


class FilesRoot:
    def __init__(self, root="/"):
        self.root = root

    def _real(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def read(self, path):
        real = self._real(path)
        try:
            if os.path.islink(real):
                return None
            with open(real, encoding="utf-8") as fh:
                return fh.read(), stat.S_IMODE(os.stat(real).st_mode)
        except FileNotFoundError:
            return None

    def write(self, path, content, mode):
        real = self._real(path)
        directory = os.path.dirname(real)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".lbctl-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, real)
        except BaseException:
            os.unlink(tmp)
            raise

    def remove(self, path):
        try:
            os.unlink(self._real(path))
        except FileNotFoundError:
            pass

    def readlink(self, path):
        try:
            return os.readlink(self._real(path))
        except (FileNotFoundError, OSError):
            return None

    def symlink(self, path, target):
        real = self._real(path)
        os.makedirs(os.path.dirname(real), mode=0o755, exist_ok=True)
        tmp = os.path.join(os.path.dirname(real), f".lbctl-{os.getpid()}-{os.path.basename(real)}")
        if os.path.lexists(tmp):  # left by an interrupted run
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, real)


def remove_runtime_dirs(root, cluster_name):
    """After `apply --remove`: the cluster's runtime folder (keepalived's log, pid
    and health state) and lbctl's own folders once nothing else is in them."""
    import shutil

    from lbctl.adapters.protocols import OWNERSHIP_DIR
    from lbctl.drains import DRAIN_DIR, drain_path
    from lbctl.lock import remove_lock
    from lbctl.render.keepalived import KeepalivedLayout

    layout = KeepalivedLayout(cluster_name, root)
    shutil.rmtree(layout.real(layout.run_dir), ignore_errors=True)
    # The drain record goes with the cluster: its workers are not lbctl's here any more.
    FilesRoot(root).remove(drain_path(cluster_name))
    remove_lock(root, cluster_name)
    for folder in (os.path.dirname(layout.run_dir), layout.etc_dir,
                   os.path.dirname(layout.etc_dir), DRAIN_DIR, OWNERSHIP_DIR):
        try:
            os.rmdir(layout.real(folder))
        except OSError:
            pass  # missing, or holds another cluster's files: leave it
