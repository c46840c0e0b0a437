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
Where the node has no server to take it, lbctl starts anew here instead.

Run by path with `python -I -S`: it imports nothing of lbctl's and no
site-packages, so it costs a bare interpreter.  Usage:

    python -I -S warm_relay.py SOCKET [LBCTL ARGUMENTS...]
"""

import json
import os
import signal
import socket
import sys

# A relay that fails says so and exits 70 (EX_SOFTWARE): not 255, which
# --all reads as ssh's own failure to reach the node.
EXIT_RELAY = 70
HANDSHAKE_SECONDS = 30  # the server answers at once unless it is stuck
# A signal sent to lbctl goes to the command as it would to a real one: TERM
# and HUP to its process alone, INT (a terminal's Ctrl-C) to its group.
FORWARDED = {signal.SIGHUP: os.kill, signal.SIGTERM: os.kill, signal.SIGINT: os.killpg}


class RelayError(Exception):
    pass


class NoServer(Exception):
    pass


def relay(path, argv):
    """The command's exit status, or minus the signal that ended it."""
    # Held back until the command runs, then passed on: a signal in between
    # would end the relay alone and leave the command running.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(HANDSHAKE_SECONDS)
        try:
            connection.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoServer() from None
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
        reply = connection.makefile("r")
        started = reply.readline().split()
        if started[:1] != ["pid"] or len(started) != 3:
            raise RelayError("the node's lbctl server refused the command")
        child, namespace = int(started[1]), int(started[2])
        if namespace != os.stat("/proc/self/ns/net").st_ino:
            # Its namespace was made anew after this sshd started.
            raise RelayError("the node's lbctl server runs in another network namespace")

        def forward(signum, _frame):
            kill = FORWARDED[signum]
            try:
                kill(child, signum)
            except ProcessLookupError:
                # The command makes its own group as it starts; before that
                # there is no such group, and the command alone gets it.
                os.kill(child, signum)
        for signum in FORWARDED:
            signal.signal(signum, forward)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        connection.settimeout(None)  # the command takes as long as it takes
        word, _, number = reply.readline().partition(" ")
    if word not in ("exit", "signal"):
        raise RelayError("the node's lbctl server ended before the command did")
    return int(number) if word == "exit" else -int(number)


def main():
    path, argv = sys.argv[1], sys.argv[2:]
    try:
        code = relay(path, argv)
    except NoServer:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        python = sys.executable
        os.execv(python, [python, "-m", "lbctl", *argv])
    except (OSError, ValueError, RelayError) as exc:
        print(f"lbctl (lab relay): {exc}", file=sys.stderr)
        return EXIT_RELAY
    if code < 0:  # end as the command did: by the same signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process: as a shell reports it
    return code


if __name__ == "__main__":
    sys.exit(main())
