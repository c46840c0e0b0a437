"""`lbctl` on a lab node's PATH for what its sshd runs: the command goes to
the node's warm lbctl (warm.py) with this process's stdin, stdout and
stderr, environment and working directory, and this process exits as the
command did.

`--all` logs in to each node over real SSH and runs `lbctl ...` there, and
the emulated lab does that hundreds of times; a Python start that imports
lbctl costs about 1.4 s of CPU in it, this relay about 0.2 s.  The command
itself runs as lbctl's own main() in a fresh process of the node, reading
the cluster file from the SSH session's stdin and writing to its stdout and
stderr directly, so what `--all` sees is what a fresh lbctl would give it.

Run by path with `python -I -S`: it imports nothing of lbctl's and no
site-packages, so it costs a bare interpreter.  Usage:

    python -I -S warm_relay.py SOCKET [LBCTL ARGUMENTS...]
"""

import json
import os
import signal
import socket
import sys

# What ends an SSH command early: the session closing (HUP), a timeout's
# TERM, a Ctrl-C.  Each goes on to the command, as it would reach a real one.
FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def relay(path, argv):
    """The command's exit status, or minus the signal that ended it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(path)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
        reply = connection.makefile("r")
        started = reply.readline().split()
        if started[:1] != ["pid"]:
            raise OSError("the node's lbctl server refused the command")
        child = int(started[1])

        def forward(signum, _frame):
            # The command leads its own group, once it has made it.
            for kill in (os.killpg, os.kill):
                try:
                    return kill(child, signum)
                except ProcessLookupError:
                    continue
        for signum in FORWARDED:
            signal.signal(signum, forward)
        word, _, number = reply.readline().partition(" ")
    if word not in ("exit", "signal"):
        raise OSError("the node's lbctl server ended before the command did")
    return int(number) if word == "exit" else -int(number)


def main():
    try:
        code = relay(sys.argv[1], sys.argv[2:])
    except OSError as exc:
        print(f"lbctl (lab relay): {exc}", file=sys.stderr)
        return 255
    if code < 0:  # end as the command did: by the same signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
