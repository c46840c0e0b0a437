"""One SSH connection per node for the whole of an lbctl command.

A fleet command reaches each node several times: apply --all checks the
version, may plan, then applies; rollout and drain --all ask the balancers
every second or two until a worker is idle or healthy.  Each ssh would
otherwise log in again, a key exchange that costs a Raspberry Pi most of a
second of CPU.  OpenSSH's connection sharing keeps the first login open as a
master that later ssh processes run through.  status, plan and doctor --all
reach each node once, and share nothing (ssh.ssh_argv's `share`).

The masters' sockets live in a folder made for this lbctl process alone
(mode 0700, a random name), and the masters are told to exit when lbctl
does; one left by an lbctl that was killed exits after CONTROL_PERSIST
seconds idle, and leaves its empty folder behind.
"""

import atexit
import os
import shutil
import subprocess
import tempfile
import threading

CONTROL_PERSIST = 60  # seconds a master outlives its last session
# sun_path holds 107 bytes and a NUL.  %C expands to 40 hex digits, and ssh
# binds the master's socket first as PATH.XXXXXXXXXXXXXXXX (a dot and 16
# random characters), then renames it: that longer name must fit too.
_SUN_PATH = 107
_LONGEST_NAME = len("/") + 40 + len(".") + 16

_folder = None
_tried = False
# --all's first ssh calls come from a pool of threads at once: one folder.
_making = threading.Lock()


def _fits(folder):
    return len(folder) + _LONGEST_NAME <= _SUN_PATH


def sharing_options():
    """ssh -o options that share one connection per node, or none where no
    folder short enough for the sockets' paths can be made."""
    folder = _shared_folder()
    if folder is None:
        return []
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={folder}/%C",
            "-o", f"ControlPersist={CONTROL_PERSIST}"]


def _shared_folder():
    """This process's folder of masters, made on first use: under $TMPDIR,
    or under /tmp where $TMPDIR is too deep for a socket's path."""
    global _folder, _tried
    with _making:
        if not _tried:
            _tried = True
            for parent in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
                # mkdtemp adds "/lbctl-ssh-" and 8 random characters.
                if _fits(os.path.join(parent, "lbctl-ssh-XXXXXXXX")):
                    _folder = tempfile.mkdtemp(prefix="lbctl-ssh-", dir=parent)
                    atexit.register(close_all)
                    break
        return _folder


def close_all():
    """Every master this process started exits, and its folder goes."""
    global _folder, _tried
    with _making:
        folder, _folder, _tried = _folder, None, False
    if folder is None:
        return
    try:
        sockets = [os.path.join(folder, name) for name in os.listdir(folder)]
    except OSError:
        sockets = []
    for socket in sockets:
        # The socket names the master: no host and no ssh_config is needed
        # (-F /dev/null: not even one that would not parse).
        try:
            subprocess.run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket}",
                            "-O", "exit", "lbctl-master"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass  # it exits by itself, CONTROL_PERSIST seconds after its last session
    shutil.rmtree(folder, ignore_errors=True)
