"""A warm lbctl in each lab node: lbctl's modules imported once, a fresh
process for every command.

In the emulated lab a Python start costs about 1.4 s of CPU, and 0.85 s of it
is importing lbctl; the lab runs lbctl on its nodes hundreds of times (every
reset applies on every node).  So each node gets one server, started inside
the node's namespace, that imports lbctl and then forks once per command.
The child is a new process, as `lbctl ...` would be: it takes the caller's
stdin, stdout and stderr (passed over the socket), environment and working
directory, runs lbctl's own main(), and exits with its status.  Nothing but
the imports is shared between commands.

What goes over SSH (--all), through the boot units or under strace still
starts lbctl as a user's shell would; this only serves Lab.lbctl and
Lab.apply_all.

Protocol, on a Unix socket only root can reach (the lab's folder is root's):
the caller sends one JSON line {"argv", "env", "cwd"} with its three file
descriptors attached; the server answers "pid N\\n" once the child runs, and
"exit N\\n" (or "signal N\\n") once it has ended.
"""

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

from lbctl.errors import LabError

# Every command module and what they import on the way: a command then
# imports nothing of lbctl's own, and neither YAML nor Jinja2.
PRELOAD = ("lbctl.cli", "lbctl.commands.apply", "lbctl.commands.plan",
           "lbctl.commands.status", "lbctl.commands.drain", "lbctl.commands.drain_balancer",
           "lbctl.commands.doctor", "lbctl.commands.validate", "lbctl.engine.execute",
           "lbctl.engine.node", "lbctl.config.load", "yaml", "jinja2")
HEADER_LIMIT = 1 << 20


# -- the server, inside a node ------------------------------------------------
def serve(path):
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection, _ = listener.accept()
                child = _start(connection, listener)
                if child is None:
                    connection.close()
                    continue
                # A pidfd turns readable when the child ends: one loop waits
                # on new callers and on every running command alike.
                selector.register(os.pidfd_open(child), selectors.EVENT_READ,
                                  (child, connection))
            else:
                child, connection = key.data
                selector.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(child, 0)
                code = os.waitstatus_to_exitcode(status)
                word = f"signal {-code}" if code < 0 else f"exit {code}"
                try:
                    connection.sendall(f"{word}\n".encode())
                except OSError:
                    pass  # the caller gave up (its timeout): nothing to tell
                connection.close()


def _start(connection, listener):
    """Fork the command a caller sent; its pid, or None for a bad request."""
    try:
        message, fds, _, _ = socket.recv_fds(connection, HEADER_LIMIT, 3)
        request = json.loads(message)
    except (OSError, ValueError):
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    child = os.fork()
    if child == 0:
        _run_child(request, fds, connection, listener)  # never returns
    for fd in fds:
        os.close(fd)
    connection.sendall(f"pid {child}\n".encode())
    return child


def _run_child(request, fds, connection, listener):
    code = 1
    try:
        listener.close()
        connection.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.setpgid(0, 0)  # the caller's timeout stops the command and all below it
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = ["lbctl", *request["argv"]]
        # Text streams on the new descriptors, as a new interpreter opens them.
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, errors="backslashreplace")
        from lbctl.cli import main

        try:
            code = main(request["argv"])
        except SystemExit as exc:
            code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):  # sys.exit("message"), as the interpreter shows it
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


# -- the caller, in the lab ---------------------------------------------------
class WarmLbctl:
    """One node's server: started on first use, restarted when the node's
    namespace is made anew."""

    def __init__(self, netns, path):
        self.netns, self.path = netns, path
        self.process, self.namespace = None, None
        self.starting = threading.Lock()

    def run(self, argv, timeout):
        """lbctl `argv` in the node, as subprocess.run(capture_output=True,
        text=True) would give it back."""
        self._ensure()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            try:
                connection.connect(self.path)
                request = {"argv": list(map(str, argv)), "env": dict(os.environ),
                           "cwd": os.getcwd()}
                socket.send_fds(connection, [json.dumps(request).encode()],
                                [devnull, stdout_w, stderr_w])
            finally:
                for fd in (devnull, stdout_w, stderr_w):
                    os.close(fd)
            reply = connection.makefile("r")
            started = reply.readline().split()
            if started[:1] != ["pid"]:
                os.close(stdout_r), os.close(stderr_r)
                raise LabError(f"{self.netns}: the warm lbctl refused {argv}")
            child = int(started[1])
            try:
                out, err = _read_both(stdout_r, stderr_r, deadline)
            except TimeoutError:
                _stop(child)
                raise LabError(f"lbctl {' '.join(map(str, argv))} in {self.netns}: "
                               f"no answer after {timeout:g} s") from None
            connection.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                word, number = reply.readline().split()
            except (OSError, ValueError):
                _stop(child)
                raise LabError(f"lbctl {' '.join(map(str, argv))} in {self.netns}: closed its "
                               f"output but did not end within {timeout:g} s") from None
        code = int(number)
        return subprocess.CompletedProcess(["lbctl", *argv], -code if word == "signal" else code,
                                           out, err)

    def _ensure(self):
        with self.starting:
            self._start_if_needed()

    def _start_if_needed(self):
        # A namespace deleted and added again under the same name is another
        # node: a server left in the old one would run lbctl there.
        current = os.stat(f"/run/netns/{self.netns}").st_ino
        if self.process is not None and self.process.poll() is None and \
                self.namespace == current:
            return
        self.stop()
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, sys.executable, "-m", "lbctl.lab.warm",
             self.path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            self.stop()
            raise LabError(f"{self.netns}: the warm lbctl did not start")
        self.namespace = current

    def stop(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()
            self.process = None


def _read_both(stdout_r, stderr_r, deadline):
    """Everything the child (and what it left running with them) wrote to
    its stdout and stderr, until both are closed."""
    chunks = {stdout_r: [], stderr_r: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        finally:
            for fd in chunks:
                os.close(fd)
    # As subprocess's text mode reads them: universal newlines.
    return tuple(b"".join(chunks[fd]).decode("utf-8", "replace")
                 .replace("\r\n", "\n").replace("\r", "\n") for fd in (stdout_r, stderr_r))


def _stop(child):
    """The command and everything in its process group (it makes its own
    group first thing; before that, the command alone)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(child, signal.SIGKILL)
        except ProcessLookupError:
            continue


if __name__ == "__main__":
    serve(sys.argv[1])
