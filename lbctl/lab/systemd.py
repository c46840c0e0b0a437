"""Lab nodes that boot with systemd as PID 1, as a Pi does.

Each node is a systemd-nspawn container inside its lab namespace, on a
copy-on-write view of this machine's root whose upper layer outlives the
container: a power cycle keeps the node's files (the units lbctl wrote,
/opt/lbctl) and loses everything in its kernel, because the namespace is
made anew (Lab.wire).  So the boot units alone must bring the node back.
"""

import os
import signal
import subprocess
import sys
import time
import uuid

from lbctl.errors import LabError
from lbctl.lab.shell import netns_path, run

NSPAWN = "/usr/bin/systemd-nspawn"
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Units that have nothing to do in a lab node: consoles, the host's network
# configuration (the lab wires eth0 itself), timers and the host's own sshd.
MASKED = ("console-getty.service", "container-getty@.service", "getty@.service",
          "serial-getty@.service", "networking.service", "systemd-networkd.service",
          "systemd-networkd-wait-online.service", "systemd-resolved.service",
          "systemd-timesyncd.service", "ssh.service", "ssh.socket", "cron.service",
          "apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer",
          "fstrim.timer", "logrotate.timer", "systemd-tmpfiles-clean.timer",
          "dpkg-db-backup.timer", "exim4.service", "rsyslog.service")
WEB_UNIT = """\
[Unit]
Description=lab web server (busybox httpd) on every address
After=network.target

[Service]
ExecStart=/bin/busybox httpd -f -p 0.0.0.0:80 -h {docroot}
Restart=always

[Install]
WantedBy=multi-user.target
"""


def _in_cgroup(path, argv):
    """argv, started inside the cgroup at `path`.

    The shell moves itself there and execs argv, so nspawn begins life in
    it.  (Not Popen's preexec_fn: Python code between fork and exec may
    deadlock on a lock another thread held at the fork.)  Only paths and
    the lab's own arguments go through it, as "$0" and "$@"."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
            os.path.join(path, "cgroup.procs"), *argv]


def _say(name, what, since):
    """A timestamped boot step on stderr: a stalled boot shows where it stopped."""
    sys.stderr.write(f"[boot {time.monotonic() - since:6.1f}s] {name}: {what}\n")
    sys.stderr.flush()


def _mount_cgroup2():
    """systemd in a container needs the unified cgroup hierarchy of the host."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        os.makedirs("/sys/fs/cgroup", exist_ok=True)
        run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"])


class BootedNodes:
    def __init__(self, lab, names):
        if not os.path.exists(NSPAWN):
            raise LabError(f"{NSPAWN} is missing: apt install systemd-container")
        self.lab = lab
        self.names = list(names)
        self.base = os.path.join(lab.workdir, "booted")
        self.spawned = {}  # name: the systemd-nspawn process
        self.launched = {}  # name: when its last boot began (monotonic)
        self.leaders = {}  # name: the container's PID 1, as this machine numbers it

    def _dirs(self, name):
        top = os.path.join(self.base, name)
        return {k: os.path.join(top, k) for k in ("upper", "work", "root")}

    def setup(self):
        _mount_cgroup2()
        try:
            self._mount_and_boot()
        except BaseException:
            # The caller never gets these nodes to shut down: a node that did
            # not boot is stopped and unmounted here, not left spinning.
            self.shutdown()
            raise
        return self

    def _mount_and_boot(self):
        for name in self.names:
            dirs = self._dirs(name)
            for path in dirs.values():
                os.makedirs(path, exist_ok=True)
            run(["mount", "-t", "overlay", f"lab-{name}", "-o",
                 f"lowerdir=/,upperdir={dirs['upper']},workdir={dirs['work']}", dirs["root"]])
            units = os.path.join(dirs["root"], "etc/systemd/system")
            os.makedirs(units, exist_ok=True)
            # Whatever this machine itself starts at boot (databases, timers)
            # has no place in a lab node either.
            host_wants = "/etc/systemd/system/multi-user.target.wants"
            extra = os.listdir(host_wants) if os.path.isdir(host_wants) else []
            for unit in set(MASKED) | set(extra):
                path = os.path.join(units, unit)
                if os.path.lexists(path):
                    os.unlink(path)
                os.symlink("/dev/null", path)
            if self.lab.nodes[name].role == "worker":
                self._install_web_server(name, units)
        for name in self.names:
            self.boot(name, wait=False)
        for name in self.names:
            self.wait_booted(name)

    def _install_web_server(self, name, units):
        docroot = "/srv/lab-www"
        real = os.path.join(self._dirs(name)["root"], docroot.lstrip("/"))
        os.makedirs(real, exist_ok=True)
        with open(os.path.join(real, "index.html"), "w") as fh:
            fh.write(f"served by {name}\n")
        with open(os.path.join(units, "lab-web.service"), "w") as fh:
            fh.write(WEB_UNIT.format(docroot=docroot))
        wants = os.path.join(units, "multi-user.target.wants")
        os.makedirs(wants, exist_ok=True)
        link = os.path.join(wants, "lab-web.service")
        if not os.path.lexists(link):
            os.symlink("/etc/systemd/system/lab-web.service", link)

    # -- power ------------------------------------------------------------------
    def boot(self, name, wait=True):
        node = self.lab.nodes[name]
        log = open(os.path.join(self.base, name, "console.log"), "ab")
        cgroup = self._fresh_cgroup(name)
        self.spawned[name] = subprocess.Popen(_in_cgroup(cgroup, [
            # No machined or system bus in the lab VM: no registration, no
            # scope unit, no journal linked to the VM's.
            NSPAWN, "--quiet", "--boot", "--register=no", "--keep-unit", "--link-journal=no",
             "--private-users=no", f"--uuid={self._machine_id(name)}",
             f"--machine={name}", f"--directory={self._dirs(name)['root']}",
             f"--network-namespace-path={netns_path(node.netns)}",
             # The node's own namespace is its network: it may configure it; and
             # its units' `modprobe ip_vs` runs as on a Pi (the VM loaded it already).
             "--capability=CAP_NET_ADMIN,CAP_SYS_MODULE",
             # The modules of the running kernel: modprobe in a boot unit finds
             # ip_vs loaded already, as on a node that loaded it earlier.
             "--bind-ro=/lib/modules",
             # This checkout and its venv, wherever they live (a CI clone under
             # /tmp is not in the node's /tmp).
             f"--bind={CHECKOUT}", f"--bind-ro={sys.prefix}"]),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            # /proc/sys/net writable: the node sets its ARP and IPVS sysctls.
            # /tmp stays nspawn's fresh tmpfs, empty at each boot as a Pi's is.
            # The lower layer's /tmp is this machine's, over 9p in the VM: a
            # node that saw it would spend minutes of its first boot in
            # systemd-tmpfiles-setup, emptying it file by file into whiteouts
            # (`D /tmp` in tmp.conf).  The checkout and venv are bound in above.
            env={**os.environ, "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "network"})
        log.close()
        self.launched[name] = time.monotonic()
        _say(name, f"container launched (pid {self.spawned[name].pid})", self.launched[name])
        self.leaders.pop(name, None)
        if wait:
            self.wait_booted(name)

    def _fresh_cgroup(self, name):
        """A cgroup of its own for each boot: with --keep-unit the container's
        cgroups go below the one nspawn runs in, and one left by an earlier boot
        or another node would be in the way."""
        self.boots = getattr(self, "boots", 0) + 1
        path = self._cgroup_path(name, self.boots)
        os.makedirs(path, exist_ok=True)
        return path

    def _cgroup_path(self, name, boot):
        return f"/sys/fs/cgroup/lbctl-lab-{os.path.basename(self.lab.workdir)}-{name}-{boot}"

    def _machine_id(self, name):
        """Each node's own machine id, the same across its reboots."""
        path = os.path.join(self.base, name, "machine-id")
        if not os.path.exists(path):
            with open(path, "w") as fh:
                fh.write(uuid.uuid4().hex)
        with open(path) as fh:
            return fh.read().strip()

    def wait_booted(self, name, timeout=240):
        """Until systemd in the node has finished starting its units.  Each
        step is said on stderr as it happens; a boot that does not finish
        shows systemd's pending jobs and the node's whole console."""
        since = self.launched.get(name, time.monotonic())
        deadline = time.monotonic() + timeout
        said = None
        while time.monotonic() < deadline:
            if self.spawned[name].poll() is not None:
                raise LabError(f"{name}: the container exited ({self._console_tail(name)})")
            leader = self._find_leader(name)
            if leader is not None:
                try:
                    state = self.run(name, ["systemctl", "is-system-running"],
                                     timeout=30).stdout.strip()
                except subprocess.TimeoutExpired:
                    state = "no answer from systemctl in 30 s"
                if state != said:
                    _say(name, f"is-system-running: {state}", since)
                    said = state
                if state in ("running", "degraded"):
                    return state
            time.sleep(1)
        raise LabError(f"{name}: systemd did not finish booting in {timeout}s\n"
                       f"{self._pending_jobs(name)}\n--- {name}'s console:\n"
                       f"{self._console_tail(name, lines=None, sep=chr(10))}")

    def _pending_jobs(self, name):
        try:
            return self.run(name, ["systemctl", "list-jobs", "--no-pager"], timeout=30).stdout
        except (subprocess.TimeoutExpired, LabError) as exc:
            return f"(systemctl list-jobs: {exc})"

    def power_off(self, name, timeout=120):
        """A clean shutdown: systemd stops every unit, then the container ends."""
        proc = self.spawned.pop(name)
        leader = self.leaders.pop(name, None) or self._find_leader(name, remember=False)
        if leader is not None:
            os.kill(leader, signal.SIGRTMIN + 4)  # systemd: power off
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _say(name, f"still running {timeout}s after power off: killed",
                 self.launched.get(name, time.monotonic()))
            proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                raise LabError(f"{name}: systemd-nspawn (pid {proc.pid}) does not end even "
                               f"when killed\n{self._console_tail(name)}") from None

    def power_cycle(self, name):
        """Off, a fresh kernel state (new namespace), and on: a reboot."""
        self.power_off(name)
        self.lab.wire(name)
        self.boot(name)

    def shutdown(self):
        try:
            for name in list(self.spawned):
                self.power_off(name, timeout=30)
        finally:  # a node that would not end is still unmounted
            for name in self.names:
                run(["umount", "-l", self._dirs(name)["root"]], check=False)
        for boot in range(1, getattr(self, "boots", 0) + 1):
            for name in self.names:
                path = self._cgroup_path(name, boot)
                for child in ("payload", ""):  # nspawn's own below ours; empty ones only
                    try:
                        os.rmdir(os.path.join(path, child) if child else path)
                    except OSError:
                        pass

    # -- inside a node -----------------------------------------------------------
    def run(self, name, argv, input=None, timeout=300):
        """argv inside the node: its mounts, PID namespace and network, as a login would."""
        leader = self._find_leader(name)
        if leader is None:
            raise LabError(f"{name}: not running")
        return subprocess.run(["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p",
                               "--", *argv], input=input, capture_output=True, text=True,
                              timeout=timeout)

    def main_pid(self, name, unit):
        out = self.run(name, ["systemctl", "show", "-p", "MainPID", "--value", unit]).stdout
        return int(out.strip() or 0)

    def failed_units(self, name):
        out = self.run(name, ["systemctl", "--failed", "--plain", "--no-legend"]).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def root_of(self, name):
        """The node's / as this machine sees it."""
        return self._dirs(name)["root"]

    def is_active(self, name, unit):
        return self.run(name, ["systemctl", "is-active", unit]).stdout.strip()

    def _find_leader(self, name, remember=True):
        """The container's PID 1: the process in the node's namespace that is PID 1
        of its own PID namespace."""
        if name in self.leaders and os.path.exists(f"/proc/{self.leaders[name]}"):
            return self.leaders[name]
        try:
            netns = os.stat(netns_path(self.lab.nodes[name].netns)).st_ino
        except FileNotFoundError:
            return None
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{pid}/ns/net").st_ino != netns:
                    continue
                with open(f"/proc/{pid}/status") as fh:
                    nspid = next(line for line in fh if line.startswith("NSpid:")).split()
            except (OSError, StopIteration):
                continue
            if len(nspid) > 2 and nspid[-1] == "1":
                if remember:
                    self.leaders[name] = int(pid)
                return int(pid)
        return None

    def _console_tail(self, name, lines=8, sep=" | "):
        """The end of the node's console (all of it with lines=None)."""
        try:
            with open(os.path.join(self.base, name, "console.log"), errors="replace") as fh:
                kept = fh.read().splitlines()
                return sep.join(kept if lines is None else kept[-lines:])
        except OSError:
            return "no console output"
