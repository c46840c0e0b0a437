"""This cluster's keepalived: its config test, and starting, reloading and stopping it.

Where systemd runs, keepalived runs as lbctl's own unit.  Without systemd (the
lab, containers) lbctl starts it directly in its own session, so it outlives
the apply, and finds it again through its pid file.
"""

import os
import pwd
import signal
import subprocess
import tempfile
import time

from lbctl.errors import ApplyError
from lbctl.render.keepalived import SCRIPT_USER, keepalived_argv

KEEPALIVED = "/usr/sbin/keepalived"


def systemd_running():
    return os.path.isdir("/run/systemd/system")


class KeepalivedProcess:
    def __init__(self, layout, use_systemd=None, binary=KEEPALIVED):
        self.layout = layout
        self.binary = binary
        # A node root other than "/" is a lab node: systemd there is the host's.
        self.use_systemd = (systemd_running() and layout.root == "/") if use_systemd is None \
            else use_systemd

    # -- queries ---------------------------------------------------------------
    def running(self):
        if self.use_systemd:
            return _run(["systemctl", "is-active", "--quiet", self.layout.unit]).returncode == 0
        return self._pid() is not None

    def _pid(self):
        """keepalived's parent pid, if that process is alive and is this cluster's."""
        try:
            with open(self.layout.real(self.layout.pid_file())) as fh:
                pid = int(fh.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except (OSError, ValueError):
            return None
        conf = self.layout.real(self.layout.conf).encode()
        return pid if conf in argv else None

    def test(self, text):
        """keepalived's own verdict on a candidate config: a list of problems, empty if fine."""
        self._require_installed()
        run_dir = self._make_run_dirs()
        fd, path = tempfile.mkstemp(prefix=".keepalived-test-", suffix=".conf", dir=run_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            result = _run([self.binary, "--config-test", "--use-file", path])
        finally:
            os.unlink(path)
        lines = [line.replace(path, self.layout.real(self.layout.conf)).strip()
                 for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        # keepalived 2.2.7 ends its config test with SIGTERM whenever script_user
        # is set (fixed in 2.2.8), so that status alone means nothing; its
        # findings are what it prints, and lbctl's config should draw none.
        if result.returncode in (0, -signal.SIGTERM) and not lines:
            return []
        return lines or [f"keepalived --config-test exited with status {result.returncode}"]

    # -- changes ---------------------------------------------------------------
    def prepare(self):
        """The script user and the state folder its hooks write to."""
        # apply prepares and tests before it changes anything: a missing keepalived
        # must stop it here, with nothing on the node changed.
        self._require_installed()
        ensure_system_user(SCRIPT_USER)
        self._make_run_dirs()

    def start(self):
        self.prepare()
        state_dir = self.layout.real(self.layout.state_dir)
        # State from an earlier run would show health keepalived no longer has.
        for name in os.listdir(state_dir):
            os.unlink(os.path.join(state_dir, name))
        if self.use_systemd:
            self._systemctl("start")
            return
        log = os.open(self._log(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            proc = subprocess.Popen(keepalived_argv(self.layout, self.binary),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(log)
        self._wait(lambda: self._pid() is not None or proc.poll() is not None, "start")
        if self._pid() is None:
            raise ApplyError("start", "keepalived", f"it exited at once:\n  {self._log_tail()}")

    def reload(self):
        if self.use_systemd:
            self._systemctl("reload")
            return
        pid = self._pid()
        if pid is None:
            raise ApplyError("reload", "keepalived", "it is not running")
        os.kill(pid, signal.SIGHUP)

    def stop(self):
        if self.use_systemd:
            self._systemctl("stop")
            return
        pid = self._pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            self._wait(lambda: self._pid() is None, "stop")

    # -- helpers -------------------------------------------------------------
    def _require_installed(self):
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            raise ApplyError("run", "keepalived", f"it is not installed ({self.binary} not "
                             "found), and this cluster's balancers need it: install it with "
                             "`apt install keepalived`; nothing on this node was changed")

    def _make_run_dirs(self):
        run_dir = self.layout.real(self.layout.run_dir)
        state_dir = self.layout.real(self.layout.state_dir)
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        user = _user(SCRIPT_USER)
        if user is not None:
            os.chown(state_dir, user.pw_uid, user.pw_gid)
        os.chmod(state_dir, 0o755)
        return run_dir

    def _log(self):
        return self.layout.real(f"{self.layout.run_dir}/keepalived.log")

    def _log_tail(self, lines=5):
        try:
            with open(self._log(), encoding="utf-8", errors="replace") as fh:
                return "\n  ".join(fh.read().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _systemctl(self, verb):
        result = _run(["systemctl", verb, self.layout.unit])
        if result.returncode != 0:
            raise ApplyError(verb, f"keepalived ({self.layout.unit})",
                             (result.stderr or result.stdout).strip() or f"status {result.returncode}")

    def _wait(self, done, verb, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.05)
        raise ApplyError(verb, "keepalived", f"not done after {timeout}s; see {self._log()}")


def _user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def ensure_system_user(name):
    """A system user with no home and no login, as packages create them."""
    for _ in range(20):
        if _user(name) is not None:
            return
        result = _run(["useradd", "--system", "--user-group", "--no-create-home",
                       "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name])
        if result.returncode == 0 or _user(name) is not None:
            return
        time.sleep(0.1)  # another apply holds the user database lock
    raise ApplyError("add", f"system user {name}", result.stderr.strip() or "useradd failed")


def _run(argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False)
