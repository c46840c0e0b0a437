"""Files under a root directory ("/" on a node, a per-node folder in the lab).

Writes go to a private temporary file in the target's own directory and are
renamed into place, so a reader never sees half a file and an interrupted
write leaves the old file intact.
"""

import os
import stat
import tempfile
import time
from contextlib import contextmanager

from lbctl.errors import ApplyError
from lbctl.layout import OWN_FOLDERS
from lbctl.trust import first_unsafe, others_can_change

# How long lbctl waits for a lock keepalived's hooks hold: they hold it for
# an nft call, or an ipvsadm call or two for each drained worker of a VIP,
# so a lock held longer is a hook that hangs (or a great many drained).
HOOK_LOCK_SECONDS = 30


def ensure_dir(root, path):
    """Make `path` (inside `root`) and its missing parents, mode 0755 whatever
    the umask, and refuse to write under a directory that someone other than
    root could change: root would then write where that user points it.
    Returns the real path."""
    me = os.geteuid()  # root on a node; the tests' own user in a private tree
    current, inside = root, ""
    for part in path.strip("/").split("/"):
        if not part:
            continue
        current, inside = os.path.join(current, part), f"{inside}/{part}"
        try:
            os.mkdir(current, 0o755)
            os.chmod(current, 0o755)  # mkdir's mode passes through the umask
        except FileExistsError:
            pass
        info = os.stat(current)  # a link such as /var/run -> /run is fine if its target is
        if not stat.S_ISDIR(info.st_mode):
            raise ApplyError("write under", current, "it is not a directory")
        if os.path.islink(current):
            unsafe = first_unsafe([os.path.realpath(current)])
            if unsafe is not None:
                raise ApplyError("write under", current,
                                 f"it leads to {os.path.realpath(current)}, and {unsafe[0]} "
                                 "can be changed by a user other than root")
        # lbctl's own folders.  An older lbctl made them through the umask, so
        # under umask 077 they are 0700, and keepalived's script user cannot
        # reach the check scripts and state in them: they are put back to 0755.
        if inside.startswith(OWN_FOLDERS) and info.st_uid in (0, me) \
                and stat.S_IMODE(info.st_mode) & 0o755 != 0o755:
            os.chmod(current, stat.S_IMODE(info.st_mode) | 0o755)
            info = os.stat(current)
        if others_can_change(info, me):
            raise ApplyError("write under", current,
                             f"it is owned by uid {info.st_uid} with mode "
                             f"{stat.S_IMODE(info.st_mode):04o}; lbctl writes only where no "
                             "user but root can change what is there (chown root and chmod "
                             "go-w it, or remove it)")
    return current


class FilesRoot:
    def __init__(self, root="/"):
        self.root = root

    def _real(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def read(self, path):
        """(content, mode, owner uid), or None for a missing file or a link."""
        real = self._real(path)
        try:
            if os.path.islink(real):
                return None
            with open(real, encoding="utf-8") as fh:
                info = os.fstat(fh.fileno())
                return fh.read(), stat.S_IMODE(info.st_mode), info.st_uid
        except FileNotFoundError:
            return None

    def write(self, path, content, mode):
        real = self._real(path)
        directory = ensure_dir(self.root, os.path.dirname(path))
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
        sync_dir(directory)

    @contextmanager
    def locked(self, lock):
        """Hold `lock`, the flock a keepalived hook holds while it reads a
        file and acts on it, so that the hook acts on the file before this
        write or after it, never on the old one once it is replaced.  No lock
        while its folder does not exist: no hook runs then."""
        try:
            fd = os.open(self._real(lock), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except FileNotFoundError:
            yield
            return
        try:
            flock_within(fd, lock)
            yield
        finally:
            os.close(fd)

    def remove(self, path):
        real = self._real(path)
        try:
            os.unlink(real)
        except FileNotFoundError:
            return
        sync_dir(os.path.dirname(real))

    def readlink(self, path):
        try:
            return os.readlink(self._real(path))
        except (FileNotFoundError, OSError):
            return None

    def symlink(self, path, target):
        real = self._real(path)
        ensure_dir(self.root, os.path.dirname(path))
        tmp = os.path.join(os.path.dirname(real), f".lbctl-{os.getpid()}-{os.path.basename(real)}")
        if os.path.lexists(tmp):  # left by an interrupted run
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, real)
        sync_dir(os.path.dirname(real))


def flock_within(fd, path, seconds=HOOK_LOCK_SECONDS, poll=0.05):
    """flock `fd` (the file at `path`, which a keepalived hook locks too)."""
    import fcntl

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ApplyError("lock", path, f"a keepalived hook has held it for over "
                                 f"{seconds}s; run the command again once it is done") from None
            time.sleep(poll)


def sync_dir(directory):
    """A rename or unlink in `directory` survives a power cut only once the
    directory itself is on disk: a drain, or a drain taken back, must outlive
    the reboot that follows it."""
    import errno

    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot sync a folder: the write itself stands.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def remove_runtime_dirs(root, cluster_name):
    """After `apply --remove`: the cluster's runtime folder (keepalived's log, pid
    and health state) and lbctl's own folders once nothing else is in them.
    The lock file, and /run/lbctl with it, go as the lock is released
    (records.lock.NodeLock.remove_on_release)."""
    import shutil

    from lbctl.layout import DRAIN_DIR, ETC_DIR, OWNERSHIP_DIR, Layout
    from lbctl.state import DAEMON_ORDER

    layout = Layout(cluster_name, root)
    shutil.rmtree(layout.real(layout.run_dir), ignore_errors=True)
    files = FilesRoot(root)
    # The drain record goes with the cluster: its workers are not lbctl's here any more.
    for path in (layout.drain_record, layout.balancer_drained,
                 *map(layout.loaded, DAEMON_ORDER)):
        files.remove(path)
    for folder in (layout.etc_dir, ETC_DIR, DRAIN_DIR, OWNERSHIP_DIR):
        try:
            os.rmdir(layout.real(folder))
        except OSError:
            pass  # missing, or holds another cluster's files: leave it
