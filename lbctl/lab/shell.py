"""Running the lab's helper programs, with failures as LabError."""

import os
import re
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


def mounts_below(path):
    """The mount points at or below `path`, deepest first."""
    top = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo", "rb") as fh:  # any mount's name, in any encoding
        for line in fh:
            # The fifth field; space, tab, newline and backslash are octal-escaped.
            point = os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]),
                                       line.split()[4]))
            if point == top or point.startswith(top.rstrip("/") + "/"):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def remove_tree(path):
    """Remove the folder `path`, never what is mounted inside it.

    A booted lab node's root is an overlay whose lower layer is this
    machine's whole root, mounted below the lab's folder.  shutil.rmtree
    descends into mounts: left mounted, the overlay would have it white out
    every file of the machine, hours of work for the emulated lab with no
    output.  So everything below is unmounted first (lazily: a process
    still inside does not keep it in the tree)."""
    import shutil

    if os.path.realpath(path) == "/":
        raise LabError("refusing to remove /")
    said = [run(["umount", "-l", point], check=False).stderr.strip()
            for point in mounts_below(path)]
    if mounts_below(path):
        raise LabError(f"{path}: still has mounts below it after umount, so it is not "
                       f"removed: {'; '.join(filter(None, said))}")
    shutil.rmtree(path, ignore_errors=True)
