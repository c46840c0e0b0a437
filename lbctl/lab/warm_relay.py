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

Run with `python -I -S`: it imports nothing of lbctl's, no site-packages
and only modules built into the interpreter (_socket, _signal and _struct;
socket, signal, array and json import enum, re and collections, which cost
more than the interpreter's own start in the emulated lab).  A node's
`lbctl` is the script script_text() makes; by path it is

    python -I -S warm_relay.py SOCKET [LBCTL ARGUMENTS...]

A request is one message with the caller's stdin, stdout and stderr
attached: NUL-separated fields, as the kernel gives them to a process (none
can hold a NUL), made by encode_request() and read by decode_request().
"""

import os
import sys

import _signal
import _socket
import _struct

# A relay that fails says so and exits 70 (EX_SOFTWARE): not 255, which
# --all reads as ssh's own failure to reach the node.
EXIT_RELAY = 70
HANDSHAKE_SECONDS = 30  # the server takes a connection at once unless it is stuck
# Before it starts a doctor that probes the wire, the server may first
# import scapy, seconds of emulated CPU and more while other labs run, and
# other callers of the same server wait behind it.
START_SECONDS = 300
REQUEST_TAG = b"lbctl-warm-1"
# A signal sent to lbctl goes to the command as it would to a real one: TERM
# and HUP to its process alone, INT (a terminal's Ctrl-C) to its group.
FORWARDED = {_signal.SIGHUP: os.kill, _signal.SIGTERM: os.kill, _signal.SIGINT: os.killpg}


class RelayError(Exception):
    pass


class NoServer(Exception):
    pass


def encode_request(argv, env, cwd):
    """The bytes of a request to run lbctl `argv` with `env` in `cwd`."""
    fields = [REQUEST_TAG, os.fsencode(cwd), str(len(argv)).encode(),
              *map(os.fsencode, argv),
              *(os.fsencode(key) + b"=" + os.fsencode(value) for key, value in env.items())]
    return b"\0".join(fields)


def decode_request(message):
    """(argv, env, cwd) of a request; ValueError for anything else."""
    tag, cwd, count, *rest = message.split(b"\0")
    if tag != REQUEST_TAG or not count.isdigit() or int(count) > len(rest):
        raise ValueError("not a request")
    count = int(count)
    env = dict(os.fsdecode(item).partition("=")[::2] for item in rest[count:])
    return [os.fsdecode(arg) for arg in rest[:count]], env, os.fsdecode(cwd)


def _lines(connection):
    """The lines the server sends, as lists of words."""
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = connection.recv(4096)
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        yield line.decode().split()


def relay(path, argv):
    """The command's exit status, or minus the signal that ended it."""
    # Held back until the command runs, then passed on: a signal in between
    # would end the relay alone and leave the command running.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, FORWARDED)
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connection.settimeout(HANDSHAKE_SECONDS)
        try:
            connection.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoServer() from None
        connection.sendmsg([encode_request(argv, os.environ, os.getcwd())],
                           [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _struct.pack("3i", 0, 1, 2))])
        connection.settimeout(START_SECONDS)
        replies = _lines(connection)
        started = next(replies, [])
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
            _signal.signal(signum, forward)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)
        connection.settimeout(None)  # the command takes as long as it takes
        ended = next(replies, [])
    finally:
        connection.close()
    if len(ended) != 2 or ended[0] not in ("exit", "signal"):
        raise RelayError("the node's lbctl server ended before the command did")
    return int(ended[1]) if ended[0] == "exit" else -int(ended[1])


def script_text(python, socket_path):
    """The node's `lbctl`: the relay for the server at socket_path, run by
    the #! line with no shell before it, and imported from its compiled copy
    rather than compiled anew at each login.  The relay's folder goes last
    on sys.path, so it shadows no module of the interpreter's."""
    here = os.path.dirname(os.path.abspath(__file__))
    if len(python) > 200 or any(c.isspace() for c in python):
        # A #! line is split at blanks and cut at 255 bytes: sh starts such a one.
        # (Imported here: the relay itself runs on built-in modules only.)
        from shlex import quote

        return "".join(["#!/bin/sh\nexec ", quote(python), " -I -S ",
                        quote(os.path.join(here, "warm_relay.py")), " ",
                        quote(socket_path), ' "$@"\n'])
    return "\n".join([
        f"#!{python} -IS",
        "import sys",
        f"sys.path.append({here!r})",
        f"sys.argv.insert(1, {socket_path!r})",
        "import warm_relay",
        "sys.exit(warm_relay.main())", ""])


def main():
    path, argv = sys.argv[1], sys.argv[2:]
    try:
        code = relay(path, argv)
    except NoServer:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)
        # As the installed entry point runs: the working folder stays off
        # sys.path (-P), so a module-named file there is not what lbctl imports.
        python = sys.executable
        os.execv(python, [python, "-P", "-m", "lbctl", *argv])
    except (OSError, ValueError, RelayError) as exc:
        print(f"lbctl (lab relay): {exc}", file=sys.stderr)
        return EXIT_RELAY
    if code < 0:  # end as the command did: by the same signal
        _signal.signal(-code, _signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process: as a shell reports it
    return code


if __name__ == "__main__":
    sys.exit(main())
