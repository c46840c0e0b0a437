"""The system programs lbctl runs as root: by absolute path, never from $PATH,
and each with a bound on how long it may take.

Debian bookworm and Raspberry Pi OS bookworm merge /usr, so these paths hold
on both.  A program that does not answer in time is an error naming it,
rather than an apply that hangs a boot unit or an ssh session for ever.
"""

import subprocess

from lbctl.errors import ApplyError

IP = "/usr/sbin/ip"
MODPROBE = "/usr/sbin/modprobe"
NFT = "/usr/sbin/nft"
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
    """CompletedProcess with text output; raises ApplyError if it outlives `timeout`."""
    try:
        return subprocess.run(argv, input=input, capture_output=True, text=True, check=False,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ApplyError("run", " ".join(argv[:3]), f"no answer after {timeout} s") from None
