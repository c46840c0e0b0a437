"""This cluster's keepalived: its config test, and starting, reloading and stopping it.

Where systemd runs, keepalived runs as lbctl's own unit.  Without systemd (the
lab, containers) lbctl starts it directly in its own session, so it outlives
the apply, and finds it again through its pid file.
"""

import fcntl
import os
import pwd
import signal
import subprocess
import tempfile
import time

from lbctl.errors import ApplyError
from lbctl.render.keepalived import SCRIPT_USER, keepalived_argv

KEEPALIVED = "/usr/sbin/keepalived"
NFT = "/usr/sbin/nft"
MIN_VERSION = (2, 2, 2)


def systemd_running():
    return os.path.isdir("/run/systemd/system")


class KeepalivedProcess:
    def __init__(self, layout, use_systemd=None, binary=KEEPALIVED, takeover=False, nft=NFT):
        """`takeover`: this balancer is one of a pair and has the takeover grace
        (keepalived/lbctl-takeover); otherwise any table of it is deleted."""
        self.layout = layout
        self.binary = binary
        self.takeover = takeover
        self.nft = nft
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
        self._require_recent()
        if self.takeover and not os.access(self.nft, os.X_OK):
            raise ApplyError("run", "nft", f"it is not installed ({self.nft} not found), and a "
                             "failover pair's balancers need it for the takeover grace: install "
                             "it with `apt install nftables`; nothing on this node was changed")
        ensure_system_user(SCRIPT_USER)
        self._make_run_dirs()

    def start(self):
        self.prepare()
        state_dir = self.layout.real(self.layout.state_dir)
        # State from an earlier run would show health keepalived no longer has.
        for name in os.listdir(state_dir):
            os.unlink(os.path.join(state_dir, name))
        self._load_takeover_rules(self.takeover)
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
        self._load_takeover_rules(self.takeover)
        if self.use_systemd:
            self._systemctl("reload")
            return
        pid = self._pid()
        if pid is None:
            raise ApplyError("reload", "keepalived", "it is not running")
        os.kill(pid, signal.SIGHUP)

    def stop(self):
        self._load_takeover_rules(False)  # before keepalived's stop hooks run
        if self.use_systemd:
            self._systemctl("stop")
            return
        pid = self._pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            self._wait(lambda: self._pid() is None, "stop")

    # -- helpers -------------------------------------------------------------
    def _load_takeover_rules(self, wanted):
        """Before keepalived (re)reads its config or stops: with the grace
        `wanted`, its rules as the file has them now, the armed set left as
        keepalived's hook last set it (only the hook knows when this balancer
        took over).  Without it, the table goes, so no rule of an earlier pair
        drops anything."""
        table = self.layout.nft_table
        rules = self.layout.real(self.layout.takeover_rules)
        if wanted:
            self._nft(f'include "{rules}"\n')
            return
        # The rules go first, under the lock keepalived's hook takes on them: a
        # hook that runs after this finds none and leaves the table gone.
        try:
            held = os.open(rules, os.O_RDONLY)
        except FileNotFoundError:
            held = None
        try:
            if held is not None:
                fcntl.flock(held, fcntl.LOCK_EX)
                os.unlink(rules)
            if os.access(self.nft, os.X_OK):
                # (nft 1.0.6 has no "destroy": adding first makes the delete safe.)
                self._nft(f"add table ip {table}\ndelete table ip {table}\n")
        finally:
            if held is not None:
                os.close(held)

    def _nft(self, batch):
        done = subprocess.run([self.nft, "-f", "-"], input=batch, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise ApplyError("load", f"nftables table {self.layout.nft_table}",
                             done.stderr.strip())

    def _require_installed(self):
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            raise ApplyError("run", "keepalived", f"it is not installed ({self.binary} not "
                             "found), and this cluster's balancers need it: install it with "
                             "`apt install keepalived`; nothing on this node was changed")

    def _require_recent(self):
        """keepalived applies a changed weight on reload only from 2.2.2 on; an
        older one keeps the old weight, so drains and weight edits never reach
        IPVS while lbctl's table check waits for them."""
        found = _version(self.binary)
        if found is not None and found < MIN_VERSION:
            shown = ".".join(map(str, found))
            raise ApplyError("run", "keepalived", f"version {shown} is too old: lbctl needs "
                             f"{'.'.join(map(str, MIN_VERSION))} or later, which applies a "
                             "changed weight on reload (Debian bookworm has 2.2.7); nothing "
                             "on this node was changed")

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
            said = (result.stderr or result.stdout).strip() or f"status {result.returncode}"
            # systemctl only points at the journal: show what the unit said there.
            try:
                journal = _run(["journalctl", "--no-pager", "-q", "-o", "cat", "-n", "8",
                                "-u", self.layout.unit]).stdout.strip()
            except OSError:
                journal = ""
            if journal:
                said += "\n  the unit's last lines in the journal:\n    " + \
                    "\n    ".join(journal.splitlines())
            raise ApplyError(verb, f"keepalived ({self.layout.unit})", said)

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


def _version(binary):
    """(major, minor, patch) from `keepalived --version`, or None if it says no number."""
    import re

    done = _run([binary, "--version"])
    found = re.search(r"Keepalived v(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    return tuple(int(n) for n in found.groups()) if found else None
