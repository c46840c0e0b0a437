"""One SSH connection per node for the whole of an lbctl command.

A fleet command reaches each node several times: apply --all checks the
version, may plan, then applies; rollout and drain --all ask the balancers
every second or two until a worker is idle or healthy.  Each ssh would
otherwise log in again, a key exchange that costs a Raspberry Pi most of a
second of CPU.  OpenSSH's connection sharing keeps the first login open as a
master that later ssh processes run through.

The masters' sockets live in a folder made for this lbctl process alone
(mode 0700, a random name), and the masters are told to exit when lbctl
does; one left by an lbctl that was killed exits after CONTROL_PERSIST
seconds idle.
"""

import atexit
import os
import shutil
import subprocess
import tempfile

CONTROL_PERSIST = 60  # seconds a master outlives its last session
# sun_path holds 108 bytes; %C expands to 40 hex digits.
_MAX_SOCKET_PATH = 100

_folder = None


def sharing_options():
    """ssh -o options that share one connection per node, or none where the
    socket's path would be too long (a deep $TMPDIR)."""
    global _folder
    if _folder is None:
        _folder = tempfile.mkdtemp(prefix="lbctl-ssh-")
        atexit.register(close_all)
    if len(_folder) + len("/") + 40 > _MAX_SOCKET_PATH:
        return []
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={_folder}/%C",
            "-o", f"ControlPersist={CONTROL_PERSIST}"]


def close_all():
    """Every master this process started exits, and its folder goes."""
    global _folder
    folder, _folder = _folder, None
    if folder is None:
        return
    try:
        sockets = [os.path.join(folder, name) for name in os.listdir(folder)]
    except OSError:
        sockets = []
    for socket in sockets:
        # The host is not used with -O exit: the socket names the master.
        try:
            subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "lbctl-master"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass  # it exits by itself, CONTROL_PERSIST seconds after its last session
    shutil.rmtree(folder, ignore_errors=True)
