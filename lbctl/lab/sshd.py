"""An OpenSSH server in each lab node, so `--all` is driven as on real Pis.

Keys are made fresh for each lab in a private folder.  Each node's sshd hands
lbctl the node's own file root ($LBCTL_ROOT) and this lbctl on the PATH, the
way a real node has its own / and lbctl installed.  The `lbctl` it finds
there relays the command to the node's warm lbctl (warm_relay.py), which
runs it in a fresh process on the SSH session's stdin, stdout and stderr;
the nodes named `cold`, the boot units and a node given another version
start the installed lbctl anew.
"""

import os
import subprocess
import sys
import time

from lbctl.errors import LabError
from lbctl.lab import warm_relay
from lbctl.lab.shell import run

SSHD = "/usr/sbin/sshd"


class LabSsh:
    def __init__(self, lab, cold=()):
        """`cold`: nodes whose sshd runs the installed lbctl itself, started
        anew for each command as on a Pi, not the relay to the warm one;
        "client" among them: lbctl_all starts lbctl anew on the client too."""
        self.lab = lab
        self.cold = set(cold)
        self.claiming = set()  # nodes whose lbctl claims another version
        # Nodes that find only what `lbctl install --all` put there: the
        # system's python3, and lbctl at their root's /usr/local/sbin.
        self.installed = set()
        self.dir = os.path.join(lab.workdir, "ssh")
        self.config = os.path.join(self.dir, "ssh_config")
        self.processes = {}

    def setup(self):
        if not os.path.exists(SSHD):
            raise LabError(f"{SSHD} is missing: apt install openssh-server")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        for name in ("host_key", "client_key"):
            path = os.path.join(self.dir, name)
            if not os.path.exists(path):
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lbctl-lab-{name}",
                     "-f", path])
        with open(os.path.join(self.dir, "client_key.pub")) as fh:
            self._write("authorized_keys", fh.read())
        with open(os.path.join(self.dir, "host_key.pub")) as fh:
            host_key = " ".join(fh.read().split()[:2])
        nodes = [n for n in self.lab.nodes.values() if n.role != "client"]
        self._write("known_hosts", "".join(f"{n.address} {host_key}\n" for n in nodes))
        self._write("ssh_config", "\n".join([
            "Host *",
            "  User root",
            f"  IdentityFile {self.dir}/client_key",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.dir}/known_hosts",
            "  StrictHostKeyChecking yes",
            # The default post-quantum exchange (sntrup761) costs seconds per
            # login in the emulated lab VM, and the lab logs in hundreds of times.
            "  KexAlgorithms curve25519-sha256",
            "  LogLevel ERROR", ""]))
        for node in nodes:
            self.start(node.name)
        return self

    def _write(self, name, text):
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path

    def _sshd_config(self, node, version=None):
        path = f"{os.path.dirname(sys.executable)}:/usr/sbin:/usr/bin:/sbin:/bin"
        if node.name in self.installed:
            bin_dir = os.path.join(node.root, "usr/local/sbin")
            path = "/usr/sbin:/usr/bin:/sbin:/bin"
        elif version is not None:
            bin_dir = self._lbctl_claiming(node, version)
            self.claiming.add(node.name)
        else:
            bin_dir = self._lbctl_cold_or_relaying(node)
            self.claiming.discard(node.name)
        return self._write(f"sshd_{node.name}", "\n".join([
            f"ListenAddress {node.address}:22",
            f"HostKey {self.dir}/host_key",
            f"PidFile {self.dir}/sshd_{node.name}.pid",
            f"AuthorizedKeysFile {self.dir}/authorized_keys",
            "StrictModes no",  # the keys live under the lab's folder, not a home
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # bash run by sshd sources ~/.bashrc even for `bash -c COMMAND`, and
            # the lab logs in as this machine's root, whose .bashrc may be a
            # developer's (pyenv init took seconds a login).  A node's stock
            # Debian .bashrc returns at once for such a shell; SHLVL=1 makes
            # bash skip it altogether, as a second-level shell does.
            f"SetEnv SHLVL=1 LBCTL_ROOT={node.root} "
            f"PATH={bin_dir}:{path}",
            ""]))

    def use_installed(self, names):
        """From the next login on, the nodes `names`, and no others, have
        nothing of this lbctl: only what `lbctl install --all` puts there."""
        changed, self.installed = self.installed ^ set(names), set(names)
        for name in sorted(changed):
            self.stop(name)
            self.start(name)

    def make_cold(self, names):
        """From the next login on, the nodes `names`, and no others, run the
        installed lbctl anew (a node claiming another version keeps its own)."""
        self.cold = set(names)
        for name in self.processes:
            if name not in self.claiming:
                self._lbctl_cold_or_relaying(self.lab.nodes[name])

    def _lbctl_cold_or_relaying(self, node):
        """The folder first on the node's PATH: its `lbctl` the relay, or for
        a cold node none, so that the venv's own `lbctl` (next) runs."""
        if node.name not in self.cold:
            return self._lbctl_relaying(node)
        return self._bin_dir(node, None)

    def _lbctl_relaying(self, node):
        """A folder whose `lbctl` hands its command to the node's warm lbctl."""
        socket_path = self.lab.warm_socket(node.name)
        return self._bin_dir(node, warm_relay.script_text(sys.executable, socket_path))

    def _bin_dir(self, node, script_text):
        """The node's folder first on its PATH, with `script_text` as its
        `lbctl` (None: no `lbctl` there)."""
        folder = os.path.join(self.dir, f"bin-{node.name}")
        os.makedirs(folder, mode=0o755, exist_ok=True)
        script = os.path.join(folder, "lbctl")
        if script_text is None:
            if os.path.lexists(script):
                os.unlink(script)
            return folder
        # Made whole beside it, then put in place: an sshd still running
        # never starts a half-written script.
        with open(script + ".new", "w") as fh:
            fh.write(script_text)
        os.chmod(script + ".new", 0o755)
        os.replace(script + ".new", script)
        return folder

    def _lbctl_claiming(self, node, version):
        """A folder whose `lbctl` is this one saying it is `version`: a node
        not yet upgraded.  Its PATH puts it before the real one."""
        return self._bin_dir(node, "#!/bin/sh\n"
                             f"exec {sys.executable} -c 'import sys, lbctl; "
                             "lbctl.__version__ = sys.argv.pop(1); "
                             "from lbctl.cli import main; sys.exit(main())' "
                             f'{version} "$@"\n')

    def start(self, name, version=None):
        """sshd for node `name`; `version`: the lbctl there claims that version."""
        node = self.lab.nodes[name]
        # sshd -e logs every login to stderr: into a file, since a pipe nobody
        # reads fills after 64 KiB, and then sshd blocks and --all hangs.
        log = os.open(os.path.join(self.dir, f"sshd_{name}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", node.netns, SSHD, "-D", "-e",
                                     "-f", self._sshd_config(node, version)],
                                    stdout=subprocess.DEVNULL, stderr=log)
        finally:
            os.close(log)
        self.processes[name] = proc
        self.lab._wait_listening(node, 22)

    def stop(self, name):
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)

    def stop_all(self):
        for name in list(self.processes):
            self.stop(name)

    def lbctl_all(self, *args, timeout=600, yes=True):
        """lbctl with --all from the client namespace, as a script on a laptop runs
        it: apply with --yes, since no terminal answers its question."""
        asked = ["--yes"] if yes and args[:1] == ("apply",) else []
        return self.from_client([*args, *asked, "--all", "--ssh-config", self.config],
                                timeout=timeout)

    def from_client(self, argv, timeout=600, merged=False):
        """lbctl `argv` in the client namespace, with no terminal: the
        client's warm lbctl, or a fresh interpreter when "client" is cold.
        `merged`: stderr in stdout, in the order written (WarmLbctl.run)."""
        started = time.monotonic()
        if "client" in self.cold:  # as a laptop's shell starts it
            argv = [sys.executable, "-m", "lbctl", *argv]
            if merged:
                argv = ["sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
            done = self.lab.sh("client", argv, check=False, timeout=timeout)
        else:
            done = self.lab.warm_lbctl("client").run(argv, timeout, merged=merged)
        done.seconds = time.monotonic() - started
        return done

    def lbctl_all_on_a_terminal(self, *args, answer, timeout=600, meanwhile=None):
        """lbctl with --all from the client namespace on a pseudo-terminal, as a
        person types it: `answer` is typed once lbctl asks, after `meanwhile()`
        if given (what happens while the person reads).  Returns (exit status,
        what the terminal showed, whether lbctl asked)."""
        import pty
        import select

        argv = ["ip", "netns", "exec", self.lab.nodes["client"].netns, sys.executable, "-m",
                "lbctl", *args, "--all", "--ssh-config", self.config]
        pid, fd = pty.fork()
        if pid == 0:  # the child: its terminal is the pty
            try:
                os.execvp(argv[0], argv)
            finally:
                os._exit(127)
        shown, asked = b"", False
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([fd], [], [], 1)
                if not ready:
                    continue
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
                if not asked and shown.rstrip().endswith(b"[y/N]"):
                    if meanwhile is not None:
                        meanwhile()
                    os.write(fd, answer.encode())
                    asked = True
            else:
                os.kill(pid, 9)
        finally:
            os.close(fd)
        _, wait_status = os.waitpid(pid, 0)
        text = shown.decode(errors="replace").replace("\r\n", "\n")
        return os.waitstatus_to_exitcode(wait_status), text, asked
