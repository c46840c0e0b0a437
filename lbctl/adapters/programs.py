"""The system programs lbctl runs as root: by absolute path, never from $PATH,
and each with a bound on how long it may take.

Debian bookworm and Raspberry Pi OS bookworm merge /usr, so these paths hold
on both.  A program that does not answer in time is an error naming it,
rather than an apply that hangs a boot unit or an ssh session for ever.
"""

import os
import signal
import subprocess

from lbctl.errors import ApplyError

IP = "/usr/sbin/ip"
MODPROBE = "/usr/sbin/modprobe"
NFT = "/usr/sbin/nft"
IPVSADM = "/usr/sbin/ipvsadm"  # only in keepalived's announce hook (mode ecmp)
KEEPALIVED = "/usr/sbin/keepalived"
BIRD = "/usr/sbin/bird"
BIRDC = "/usr/sbin/birdc"
USERADD = "/usr/sbin/useradd"
SYSTEMCTL = "/usr/bin/systemctl"
JOURNALCTL = "/usr/bin/journalctl"
SS = "/usr/bin/ss"

QUICK = 30  # ip, nft, modprobe, useradd, a config test: seconds even on a slow Pi
# systemd waits up to 90 s (DefaultTimeoutStartSec) for a unit to start or stop.
SYSTEMD = 120


def run(argv, timeout=QUICK, input=None):
    """CompletedProcess with text output; raises ApplyError if it outlives `timeout`.

    The program runs in a process group of its own, and a timeout kills the
    whole group: a hook's own children (birdc under lbctl-announce) would
    otherwise run on, holding what the hook had locked."""
    with subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else None,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except BaseException as exc:
            # Past its bound, or lbctl itself interrupted (Ctrl-C, a hang-up,
            # which no longer reach a group of its own): the group goes too.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()  # (not its output: something that left the group may hold the pipe)
            if isinstance(exc, subprocess.TimeoutExpired):
                raise ApplyError("run", " ".join(argv[:3]),
                                 f"no answer after {timeout} s") from None
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
