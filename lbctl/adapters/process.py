"""A daemon lbctl runs itself where systemd does not (the lab, containers):
started in a session of its own so it outlives the apply, logging to a file
in the cluster's run folder, and found again through its pid file.
"""

import os
import signal
import subprocess
import tempfile
import time

from lbctl.adapters.files import ensure_dir
from lbctl.adapters.programs import run
from lbctl.errors import ApplyError


class DaemonProcess:
    """One daemon of one cluster: `name` names its pid and log files, and
    `conf` (a path as the node sees it) must be on its command line, so a
    recycled pid or another cluster's daemon is never taken for it."""

    def __init__(self, layout, name, conf):
        self.layout = layout
        self.name = name
        self.conf = conf

    def running(self, systemd, unit):
        """Its unit is active, where systemd can say; else its pid file says.
        (systemctl cannot ask systemd for a reader that is not root, such as
        the exporter's dynamic user, on a host without a D-Bus system bus.)"""
        if systemd.runs:
            active = systemd.is_active(unit)
            if active is not None:
                return active
        return self.pid() is not None

    def check_config(self, text, argv):
        """(exit status, output lines) of `argv` + [a copy of `text`]: the
        daemon's own verdict on a candidate config.  The copy is private, in
        the run folder, and named in the output as the config it will be."""
        run_dir = ensure_dir(self.layout.root, self.layout.run_dir)
        fd, path = tempfile.mkstemp(prefix=f".{self.name}-test-", suffix=".conf", dir=run_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            result = run([*argv, path])
        finally:
            os.unlink(path)
        shown = self.layout.real(self.conf)
        return result.returncode, [line.replace(path, shown).strip() for line in
                                   (result.stdout + result.stderr).splitlines() if line.strip()]

    def pid(self):
        """Its pid, if it is alive and runs on this cluster's config."""
        try:
            with open(self.layout.real(self.layout.pid_file(self.name))) as fh:
                pid = int(fh.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if self.layout.real(self.conf).encode() in argv else None

    def spawn(self, argv):
        """Start it and wait for its pid file."""
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(log)
        self.wait(lambda: self.pid() is not None or proc.poll() is not None, "start")
        if self.pid() is None:
            raise ApplyError("start", self.name, f"it exited at once:\n  {self.log_tail()}")

    def send_signal(self, signum, verb):
        found = self.pid()
        if found is None:
            raise ApplyError(verb, self.name, "it is not running")
        os.kill(found, signum)

    def terminate(self):
        """SIGTERM, and wait until it has gone; nothing if it is not running."""
        found = self.pid()
        if found is not None:
            os.kill(found, signal.SIGTERM)
            self.wait(lambda: self.pid() is None, "stop")

    def wait(self, done, verb, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.05)
        raise ApplyError(verb, self.name, f"not done after {timeout}s; see {self.log}")

    @property
    def log(self):
        return self.layout.real(self.layout.log_file(self.name))

    def log_tail(self, lines=5):
        try:
            with open(self.log, encoding="utf-8", errors="replace") as fh:
                return "\n  ".join(fh.read().splitlines()[-lines:])
        except OSError:
            return "(no log)"
