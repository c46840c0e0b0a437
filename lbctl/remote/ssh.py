"""lbctl on another node, through the system's ssh client.

The user's ~/.ssh/config, agent, known_hosts and jump hosts all apply, as they
do for ssh itself.  The cluster file travels on standard input, so nothing is
copied to a temporary file on either side.  The remote side always parses
the command through the login shell, so every word is quoted here; the words
come from lbctl's own flags and from names the validator held to tight
patterns.
"""

import shlex
import subprocess
import time
from dataclasses import dataclass

from lbctl import __version__
from lbctl.remote.connections import sharing_options

CONNECT_TIMEOUT = 10  # seconds for ssh to reach a node
SSH_FAILED = 255  # ssh's own exit status when it could not connect or log in
NOT_FOUND = 127  # the node's shell found no lbctl
TIMED_OUT = -1  # lbctl there did not finish in time: its state is not known
INSTALL_HINT = ("put this lbctl there from here: lbctl install FILE --all --node NAME "
                "(or on the node, as the README's \"Install on a node\" says)")


@dataclass(frozen=True)
class Target:
    node: str
    role: str  # balancer or worker
    host: str
    user: str | None = None
    port: int | None = None
    sudo: bool = False


@dataclass(frozen=True)
class Outcome:
    target: Target
    returncode: int
    stdout: str
    stderr: str
    seconds: float = 0.0  # from ssh's start to its end

    @property
    def unreachable(self):
        return self.returncode == SSH_FAILED

    @property
    def missing_lbctl(self):
        return self.returncode == NOT_FOUND or (
            self.returncode != 0 and "sudo: lbctl: command not found" in self.stderr)

    @property
    def other_version(self):
        from lbctl.errors import EXIT_VERSION

        # An lbctl before 0.2 knows no --expect-version: argparse's usage error,
        # which takes the version for the command's name.
        older = self.returncode == 2 and ("--expect-version" in self.stderr or
                                          f"invalid choice: '{__version__}'" in self.stderr)
        return older or (self.returncode == EXIT_VERSION and "runs lbctl" in self.stderr)

    @property
    def runs_other_lbctl(self):
        """No lbctl on the node, or another version of it: install first."""
        return self.missing_lbctl or self.other_version

    def problem(self):
        """What went wrong on this node, in one line a person can act on; None if nothing."""
        err = self.stderr.strip()
        if self.returncode == TIMED_OUT:
            return (f"no answer within {self.seconds:.0f}s; what lbctl did there is not known: "
                    "see `lbctl plan FILE --all`")
        if self.unreachable:
            return f"unreachable: {err.splitlines()[-1] if err else 'ssh failed'}"
        if self.missing_lbctl:
            return f"lbctl is not installed (or not on the PATH); {INSTALL_HINT}"
        if self.other_version:
            found = err.removeprefix("lbctl: ") if self.returncode != 2 else \
                "this node runs an lbctl older than 0.2"
            return (f"{found}; --all runs {__version__} and needs the same on every node: "
                    f"{INSTALL_HINT}")
        return None


def targets(cluster):
    """{node: Target} for every node of the file, balancers first."""
    ssh = cluster.ssh
    found = {}
    for role, nodes in (("balancer", cluster.balancers), ("worker", cluster.workers)):
        for name, node in nodes.items():
            found[name] = Target(name, role, ssh.hosts.get(name, str(node.address)), ssh.user,
                                 ssh.port, ssh.uses_sudo)
    return found


def ssh_argv(target, lbctl_args, ssh_config=None, share=True):
    """The ssh command line that runs `lbctl lbctl_args` on the target.
    `share`: through this lbctl's one connection to the node
    (connections.py); a command that reaches each node once passes False,
    since a master it starts and then stops costs more than it saves."""
    return program_argv(target, ["lbctl", "--expect-version", __version__, *lbctl_args],
                        ssh_config, share)


def program_argv(target, program, ssh_config=None, share=True):
    """ssh's argv to run `program` (argv, each word quoted) on the node, as
    root: through sudo where the file says so."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            # A node that vanishes mid-command (power, cable) is noticed in a minute.
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
            # A rollout lends no node the user's agent or display, whatever
            # ~/.ssh/config says (options given here win over it).
            "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
            *(sharing_options() if share else [])]
    if ssh_config:
        argv += ["-F", ssh_config]
    if target.user:
        argv += ["-l", target.user]
    if target.port:
        argv += ["-p", str(target.port)]
    command = shlex.join(program)
    if target.sudo:
        # A login that is root already (from ~/.ssh/config) needs no sudo, and
        # may have none installed.
        command = (f'if [ "$(id -u)" = 0 ]; then exec {command}; '
                   f'else exec sudo -n {command}; fi')
    return argv + ["--", target.host, command]


def run_on(target, lbctl_args, stdin_text="", ssh_config=None, timeout=600, show_stderr=False,
           share=True):
    """`show_stderr`: the node's progress goes straight to this terminal as it
    comes (drain --wait), and Outcome.stderr stays empty."""
    return _ssh(target, ssh_argv(target, lbctl_args, ssh_config, share), stdin_text, timeout,
                show_stderr)


def run_program_on(target, program, payload=b"", ssh_config=None, timeout=600):
    """Run `program` (an argv, not lbctl) on the node as root, with the
    bytes `payload` on its standard input: lbctl install --all."""
    return _ssh(target, program_argv(target, program, ssh_config, share=False), payload,
                timeout)


def _ssh(target, argv, stdin, timeout, show_stderr=False):
    """`stdin`: text, or bytes (then the node's output is read as UTF-8 too)."""
    started = time.monotonic()
    as_text = isinstance(stdin, str)
    try:
        done = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE,
                              stderr=None if show_stderr else subprocess.PIPE, text=as_text,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome(target, TIMED_OUT, "", "", timeout)
    except FileNotFoundError:
        from lbctl.errors import LbctlError

        raise LbctlError("--all needs the OpenSSH client: apt install openssh-client") from None
    stdout, stderr = done.stdout, done.stderr or ("" if as_text else b"")
    if not as_text:
        stdout, stderr = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    return Outcome(target, done.returncode, stdout, stderr, time.monotonic() - started)


def run_on_each(targets_, lbctl_args_for, stdin_text, ssh_config=None, max_parallel=8,
                timeout=600, share=True):
    """Run on several nodes at once; {node: Outcome} in the order given."""
    from concurrent.futures import ThreadPoolExecutor

    targets_ = list(targets_)
    if not targets_:
        return {}
    with ThreadPoolExecutor(max_workers=min(max_parallel, len(targets_))) as pool:
        futures = {t.node: pool.submit(run_on, t, lbctl_args_for(t), stdin_text, ssh_config,
                                       timeout, share=share) for t in targets_}
        return {node: future.result() for node, future in futures.items()}
