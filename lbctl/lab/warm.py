"""A warm lbctl in each lab node: lbctl's modules imported once, a fresh
process for every command.

In the emulated lab a Python start costs about 1.4 s of CPU, and 0.85 s of it
is importing lbctl; the lab runs lbctl on its nodes hundreds of times (every
reset applies on every node).  So each node gets one server, started inside
the node's namespace, that imports lbctl and then forks once per command.
The child is a new process, as `lbctl ...` would be: it takes the stdin,
stdout and stderr the caller passes over the socket (/dev/null and two
pipes), the caller's environment and working directory, runs lbctl's own
main(), and exits with its status.  Nothing but
the imports is shared between commands (and the hash seed: a set of names
iterates in the same order in every command of one server).

Lab.lbctl and Lab.apply_all use it, and so does the `lbctl` a node's sshd
runs for --all (warm_relay.py).  The boot units, strace and a node made to
claim another version still start lbctl as a user's shell would.

Protocol, on a Unix socket only root can reach (the lab's folder is root's):
the caller sends one request (warm_relay.encode_request: its argv,
environment and working directory) with its three file descriptors
attached; the server answers "pid N NETNS\\n" once the child runs (NETNS:
the inode of its network namespace), and "exit N\\n" (or "signal N\\n")
once it has ended.  A caller that closes its end first has the command
killed.
"""

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

from lbctl.errors import LabError
from lbctl.lab.shell import netns_path
from lbctl.lab.warm_relay import decode_request, encode_request

# Every command module and what they import on the way: a command then
# imports nothing of lbctl's own, and neither YAML nor Jinja2.
PRELOAD = ("lbctl.cli", "lbctl.commands.apply", "lbctl.commands.plan",
           "lbctl.commands.status", "lbctl.commands.drain", "lbctl.commands.drain_balancer",
           "lbctl.commands.doctor", "lbctl.commands.validate", "lbctl.engine.execute",
           "lbctl.engine.node", "lbctl.config.load", "yaml", "jinja2")
# What doctor's wire check imports: scapy, 6-8 s of emulated CPU a start.
# Imported once, by the first doctor a server runs, not at the server's
# start: most nodes of most labs never run doctor.
DOCTOR_PRELOAD = ("lbctl.doctor.wire", "scapy.layers.inet", "scapy.layers.l2",
                  "scapy.sendrecv")
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
    # The lab holds the other end of stdin: when the lab is gone, however it
    # went, so is the server, and the namespace it kept alive.
    selector.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is sys.stdin:
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
                elif key.fileobj is listener:
                    _accept(listener, selector)
                elif key.data[0] == ENDED:
                    _report_end(selector, key)
                else:
                    _caller_spoke(selector, key)
    finally:
        # Nothing outlives the lab: commands still running go with it.
        for key in list(selector.get_map().values()):
            if key.data and key.data[0] == ENDED:
                _stop(key.data[1])
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# What the selector holds for a running command: its pidfd (ENDED, pid,
# connection), readable once it has ended, and its caller's connection
# (CALLER, pid), readable only if the caller goes away first.
ENDED, CALLER = "ended", "caller"


def _accept(listener, selector):
    connection, _ = listener.accept()
    try:
        child = _start(connection, selector)
    except OSError:  # the caller went away, or no fork was to be had
        child = None
    if child is None:
        connection.close()
        return
    # A pidfd turns readable when the child ends: one loop waits on new
    # callers and on every running command alike.
    selector.register(os.pidfd_open(child), selectors.EVENT_READ, (ENDED, child, connection))
    selector.register(connection, selectors.EVENT_READ, (CALLER, child))


def _caller_spoke(selector, key):
    """A caller sends nothing once its command runs: the connection turning
    readable means it went away (killed, or its timeout), and so does the
    command, as a real one whose session closed would end."""
    _, child = key.data
    if key.fileobj.fileno() == -1:
        return  # its command's end, in the same round, was reported and closed it
    try:
        gone = not key.fileobj.recv(1, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return
    except OSError:
        gone = True
    if gone:
        selector.unregister(key.fileobj)
        _stop(child)


def _report_end(selector, key):
    _, child, connection = key.data
    selector.unregister(key.fileobj)
    os.close(key.fd)
    try:
        selector.unregister(connection)
    except KeyError:
        pass  # the caller had gone already
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    word = f"signal {-code}" if code < 0 else f"exit {code}"
    try:
        connection.sendall(f"{word}\n".encode())
    except OSError:
        pass  # the caller gave up (its timeout): nothing to tell
    connection.close()


def _start(connection, selector):
    """Fork the command a caller sent; its pid, or None for a bad request."""
    connection.settimeout(10)  # a caller that sends nothing does not hold the server
    try:
        message, fds, _, _ = socket.recv_fds(connection, HEADER_LIMIT, 3)
        request = decode_request(message)
    except (OSError, ValueError):
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    if _probes_the_wire(request[0]):
        _preload_doctor()
    child = os.fork()
    if child == 0:
        _run_child(request, fds, connection, selector)  # never returns
    for fd in fds:
        os.close(fd)
    try:
        # The namespace too: a relay checks it runs the command in its own.
        namespace = os.stat("/proc/self/ns/net").st_ino
        connection.sendall(f"pid {child} {namespace}\n".encode())
    except OSError:
        pass  # the caller is gone; the command runs on as it would have
    return child


def _probes_the_wire(argv):
    """Whether the command is a doctor that sends probes from this node
    (with --all it asks the nodes, over SSH, and imports no scapy here)."""
    return argv[:1] == ["doctor"] and "--all" not in argv and "--no-wire" not in argv


# Whether the server imported DOCTOR_PRELOAD: None until the first doctor.
_doctor_preloaded = None


def _preload_doctor():
    """Once: an import that fails is left to each command, which imports it
    itself and says what failed."""
    global _doctor_preloaded
    import importlib
    import logging

    if _doctor_preloaded is not None:
        return
    # As doctor's own import of it: no warnings about the host's interfaces.
    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    try:
        for name in DOCTOR_PRELOAD:
            importlib.import_module(name)
        _doctor_preloaded = True
    except Exception:
        _doctor_preloaded = False


def _fresh_scapy_view():
    """scapy read the node's interfaces and routes when the server imported
    it; a command sees them as they are now, as a fresh import would."""
    from scapy.config import conf

    for table in (conf.route, conf.route6):  # route6: None until scapy.route6 is imported
        if table is not None:
            table.resync()
    conf.ifaces.reload()


def _run_child(request, fds, connection, selector):
    code = 1
    try:
        # Nothing of the server's stays open in the command: its socket, its
        # other callers' connections and the pidfds of their commands.
        for key in list(selector.get_map().values()):
            if key.fileobj is sys.stdin:
                continue
            if key.data and key.data[0] == ENDED:
                os.close(key.fd)
                key.data[2].close()
            else:
                key.fileobj.close()
        selector.close()
        connection.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.setpgid(0, 0)  # the caller's timeout stops the command and all below it
        argv, env, cwd = request
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["lbctl", *argv]
        if _doctor_preloaded and _probes_the_wire(argv):
            _fresh_scapy_view()
        # Text streams on the new descriptors, as a new interpreter opens them:
        # stderr line-buffered whatever it is.
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False,
                                           errors="backslashreplace")
        from lbctl.cli import main

        try:
            code = main(argv)
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
            # What the interpreter does on its way out: wait for threads, run
            # the atexit functions, flush.
            import atexit
            import threading

            threading._shutdown()
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

    def run(self, argv, timeout, merged=False):
        """lbctl `argv` in the node, with /dev/null for its stdin, as
        subprocess.run(capture_output=True, text=True) would give it back.
        `merged`: its stderr goes into its stdout's pipe, the two in the
        order written, as a terminal shows them (stderr comes back empty)."""
        self.ensure()
        shown = f"lbctl {' '.join(map(str, argv))} in {self.netns}"
        deadline = time.monotonic() + timeout
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            try:
                connection.connect(self.path)
                request = encode_request(list(map(str, argv)), os.environ, os.getcwd())
                socket.send_fds(connection, [request],
                                [devnull, stdout_w, stdout_w if merged else stderr_w])
                reply = connection.makefile("r")
                started = reply.readline().split()
            except OSError as exc:
                os.close(stdout_r), os.close(stderr_r)
                raise LabError(f"{shown}: the lab's lbctl server did not take it: {exc}") \
                    from None
            finally:
                for fd in (devnull, stdout_w, stderr_w):
                    os.close(fd)
            if started[:1] != ["pid"]:
                os.close(stdout_r), os.close(stderr_r)
                raise LabError(f"{shown}: the lab's lbctl server refused it")
            child = int(started[1])
            try:
                out, err = _read_both(stdout_r, stderr_r, deadline)
                connection.settimeout(max(1.0, deadline - time.monotonic()))
                word, number = reply.readline().split()
            except TimeoutError as exc:
                _stop(child)
                raise LabError(f"{shown}: no answer after {timeout:g} s{_so_far(exc)}") \
                    from None
            except (OSError, ValueError):
                _stop(child)
                raise LabError(f"{shown}: closed its output but did not end within "
                               f"{timeout:g} s") from None
            except BaseException:  # Ctrl-C: the command goes too, as a child process would
                _stop(child)
                raise
        code = int(number)
        return subprocess.CompletedProcess(["lbctl", *argv], -code if word == "signal" else code,
                                           out, err)

    def ensure(self):
        with self.starting:
            self._start_if_needed()

    def _start_if_needed(self):
        # A namespace deleted and added again under the same name is another
        # node: a server left in the old one would run lbctl there.
        try:
            current = os.stat(netns_path(self.netns)).st_ino
        except FileNotFoundError:
            raise LabError(f"no network namespace {self.netns}") from None
        if self.process is not None and self.process.poll() is None and \
                self.namespace == current:
            return
        self.stop()
        # Its own session: a Ctrl-C at the lab's terminal reaches the lab,
        # which stops the command it waits for; the server ends with the lab.
        # -P: the lab's working directory stays off sys.path, as it is for an
        # installed lbctl; a file there named like a module is not imported.
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, sys.executable, "-P", "-m", "lbctl.lab.warm",
             self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        if self.process.stdout.readline().strip() != "ready":
            self.stop()
            raise LabError(f"{self.netns}: the lab's lbctl server did not start "
                           "(its error is above)")
        self.namespace = current

    def stop(self):
        if self.process is not None:
            self.process.stdin.close()  # the server's cue to end
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()
            self.process = None
        if os.path.exists(self.path):
            os.unlink(self.path)


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
                    raise Unfinished(*map(_text, (b"".join(chunks[stdout_r]),
                                                   b"".join(chunks[stderr_r]))))
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        finally:
            for fd in chunks:
                os.close(fd)
    return tuple(_text(b"".join(chunks[fd])) for fd in (stdout_r, stderr_r))


def _text(data):
    """As subprocess's text mode reads it: universal newlines."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


class Unfinished(TimeoutError):
    """A command still running at its deadline, with what it had written."""

    def __init__(self, out, err):
        super().__init__("still running")
        self.out, self.err = out, err


def _so_far(exc, lines=40):
    """The end of what a timed-out command had written: where it waited."""
    if not isinstance(exc, Unfinished) or not (exc.out or exc.err):
        return ""
    return "".join(f"\n--- its {name} so far (the end):\n" + "\n".join(text.splitlines()[-lines:])
                   for name, text in (("stdout", exc.out), ("stderr", exc.err)) if text)


def _stop(child):
    """The command and everything in its process group (it makes its own
    group first thing; before that, the command alone: no such group yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(child, signal.SIGKILL)
        except ProcessLookupError:
            continue


if __name__ == "__main__":
    serve(sys.argv[1])
