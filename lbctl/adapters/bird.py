"""This cluster's BIRD (mode ecmp): its config test, and starting, reloading
and stopping it.

BIRD offers the router what keepalived's checks allow: the files keepalived's
announce hook keeps in the announce folder.  So it starts after keepalived
and stops before it (the plan orders them), and under systemd its unit is
bound to keepalived's.
"""

import os
import pwd
import shutil
import time
from contextlib import suppress

from lbctl.adapters.files import ensure_dir
from lbctl.adapters.process import DaemonProcess
from lbctl.adapters.programs import BIRD, BIRDC, run
from lbctl.adapters.systemd import Systemd
from lbctl.errors import ApplyError
from lbctl.render.bird import BIRD_USER, bird_argv

# After BIRD has closed its session the router moves the flows to the other
# balancers; whatever stops next (keepalived and its table) waits this long.
WITHDRAW_SECONDS = 1
# What `birdc configure` says when BIRD took the config, or queued it.
TAKEN = ("Reconfigured", "Reconfiguration in progress", "queueing new config")


class BirdDaemon:
    name = "bird"

    def __init__(self, layout, systemd=None, binary=BIRD, client=BIRDC):
        self.layout = layout
        self.binary = binary
        self.client = client
        self.systemd = systemd or Systemd(layout.root)
        self.process = DaemonProcess(layout, "bird", layout.bird_conf)

    @classmethod
    def for_balancer(cls, layout, systemd, mode):
        return cls(layout, systemd)

    def running(self):
        return self.process.running(self.systemd, self.layout.bird_unit)

    def test(self, text):
        """BIRD's own parser on a candidate config: a list of problems, empty if fine."""
        self._require_installed()
        status, lines = self.process.check_config(text, [self.binary, "-p", "-c"])
        if status == 0:
            return []
        return lines or [f"bird -p exited with status {status}"]

    def prepare(self, programs=frozenset()):
        """BIRD installed with its user, and the folder of offers its config includes."""
        self._require_installed()
        try:
            self.user = pwd.getpwnam(BIRD_USER)
        except KeyError:
            raise ApplyError("run", "BIRD", f"its user {BIRD_USER} does not exist; the bird2 "
                             "package makes it: reinstall it with `apt install --reinstall "
                             "bird2`; nothing on this node was changed") from None
        ensure_dir(self.layout.root, self.layout.announce_dir)

    def _pid_file_for_bird(self):
        """BIRD writes its pid file once it runs as its user: an empty file it
        owns, made (never through a link) in root's run folder."""
        path = self.layout.real(self.layout.pid_file("bird"))
        with suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.fchown(fd, self.user.pw_uid, self.user.pw_gid)
        finally:
            os.close(fd)

    def start(self):
        self.prepare()
        if self.systemd.runs:
            self.systemd.start(self.layout.bird_unit, "BIRD")  # its unit makes the pid file
            # Type=simple: systemctl returns once BIRD is forked, and keepalived's
            # reload, next in the plan, has BIRD read the offers over its socket.
            self._wait_answering()
        elif self.process.pid() is None:
            self._pid_file_for_bird()
            self.process.spawn(bird_argv(self.layout, self.binary))

    def _wait_answering(self, timeout=15):
        socket = self.layout.real(self.layout.bird_socket)
        deadline = time.monotonic() + timeout
        while True:
            said = run([self.client, "-s", socket, "show", "status"])
            if said.returncode == 0 and "Daemon is up and running" in said.stdout:
                return
            if time.monotonic() >= deadline:
                raise ApplyError("start", "BIRD", f"its control socket {socket} did not answer "
                                 f"within {timeout}s: {(said.stdout + said.stderr).strip()}")
            time.sleep(0.2)

    def reload(self):
        """BIRD reads its config again; a changed BGP setting restarts the session."""
        if self.systemd.runs:
            self.systemd.reload(self.layout.bird_unit, "BIRD")
            return
        if self.process.pid() is None:
            raise ApplyError("reload", "BIRD", "it is not running")
        done = run([self.client, "-s", self.layout.real(self.layout.bird_socket), "configure"])
        said = (done.stdout + done.stderr).strip()
        # Taken now, or queued behind a reconfiguration still running (as
        # keepalived's announce hook reads it).
        if done.returncode != 0 or not any(word in said for word in TAKEN):
            raise ApplyError("reload", "BIRD", said or f"birdc exited with status {done.returncode}")

    def stop(self):
        """The router withdraws this balancer's offers as the session closes;
        the offers go too, so a later start offers nothing stale."""
        if self.systemd.runs:
            self.systemd.stop(self.layout.bird_unit, "BIRD")  # its unit waits after
        elif self.process.pid() is not None:
            self.process.terminate()
            time.sleep(WITHDRAW_SECONDS)
        shutil.rmtree(self.layout.real(self.layout.announce_dir), ignore_errors=True)

    def _require_installed(self):
        for program in (self.binary, self.client):
            if not os.access(program, os.X_OK):
                raise ApplyError("run", "BIRD", f"it is not installed ({program} not found), "
                                 "and the balancers of mode ecmp announce the VIPs with it: "
                                 "install it with `apt install bird2`; nothing on this node "
                                 "was changed")
