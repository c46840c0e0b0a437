"""Running the lab's helper programs, with failures as LabError."""

import os
import subprocess

from lbctl.errors import LabError

# No lab helper runs this long (the slowest, a rollout driven over SSH, is
# given more by its caller): one that does is stuck, and must say so rather
# than hold the suite until CI's own limit cuts it off without a word.
DEFAULT_TIMEOUT = 600


def run(argv, check=True, timeout=DEFAULT_TIMEOUT, **kw):
    """Run argv (never through a shell) and return the CompletedProcess."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(map(str, argv))}: no answer after {timeout:g} s") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
    return done


def ip_batch(commands, netns=None, check=True, keep_going=False):
    """Several `ip` commands (each as its words after "ip") in one process,
    inside `netns` if given; it stops at the first that fails unless
    `keep_going`.  In the emulated lab a process start costs more than what
    most of these commands do."""
    argv = ["ip", *(["-n", netns] if netns else []), *(["-force"] if keep_going else []),
            "-batch", "-"]
    return run(argv, check=check, input="".join(f"{' '.join(c)}\n" for c in commands))


NETNS_DIR = "/run/netns"  # where `ip netns add` names a namespace


def netns_path(netns):
    """The file that names a namespace `ip netns add` made."""
    return os.path.join(NETNS_DIR, netns)


def netns_exists(netns):
    return os.path.exists(netns_path(netns))


def pids_in(netns_names):
    """The pids of the processes in any of these named namespaces, as `ip
    netns pids` finds them: by the namespace's inode, read from /proc."""
    wanted = set()
    for name in netns_names:
        try:
            found = os.stat(netns_path(name))
        except OSError:
            continue
        wanted.add((found.st_dev, found.st_ino))
    pids = []
    if not wanted:
        return pids
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            found = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue  # ended, or a kernel thread's
        if (found.st_dev, found.st_ino) in wanted:
            pids.append(int(entry))
    return pids
