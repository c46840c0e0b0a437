"""What one run of keepalived/lbctl-check costs: CPU time and wall time per probe.

Runs the script N times (default 200) for tcp, udp and exec against local
services on 127.0.0.1 that are live (answer), dead (nothing listening) and
silent (UDP: reads and never replies; TCP: a listener whose accept queue is
full, so SYNs are dropped), and prints per-probe CPU (user + system of the
script and everything it forks) and wall time, and the verdict.

    .venv/bin/python bench/check_probe.py [-n 200] [--timeout 1]

In the lab VM: python -m lbctl.lab.vm -- .venv/bin/python bench/check_probe.py
"""

import argparse
import contextlib
import resource
import select
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from lbctl.render.keepalived import script_text


@contextlib.contextmanager
def udp_services():
    """{"live": port, "silent": port, "dead": port}."""
    live, silent = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
    for s in (live, silent):
        s.bind(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            for s in select.select([live, silent], [], [], 0.1)[0]:
                _, peer = s.recvfrom(512)
                if s is live:
                    s.sendto(b"ok\n", peer)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield {"live": live.getsockname()[1], "silent": silent.getsockname()[1],
               "dead": free_port(socket.SOCK_DGRAM)}
    finally:
        stop.set()
        thread.join()
        live.close()
        silent.close()


@contextlib.contextmanager
def tcp_services():
    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen(4096)
    stop = threading.Event()

    def serve():
        live.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = live.accept()
                conn.close()
            except OSError:
                continue
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    fillers = fill_accept_queue(silent.getsockname()[1])
    try:
        yield {"live": live.getsockname()[1], "silent": silent.getsockname()[1],
               "dead": free_port(socket.SOCK_STREAM)}
    finally:
        stop.set()
        thread.join()
        for s in fillers + [live, silent]:
            s.close()


def fill_accept_queue(port):
    """Connect until the listener's queue is full and further SYNs go unanswered."""
    fillers = []
    while True:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
        time.sleep(0.05)
        try:
            s.getpeername()
        except OSError:
            return fillers
        if len(fillers) > 64:
            raise RuntimeError("the accept queue never filled")


def free_port(kind):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(script, state, argv, n):
    """(cpu seconds per probe, wall seconds per probe, exit status of the last run)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    for _ in range(n):
        state.unlink(missing_ok=True)
        status = subprocess.run([str(script), str(state), *argv], check=False).returncode
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / n, wall / n, status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--timeout", default="1")
    parser.add_argument("--script", type=Path, help="another lbctl-check to compare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "lbctl-check"
        script.write_text(args.script.read_text() if args.script else script_text("lbctl-check"))
        script.chmod(0o755)
        state = Path(tmp) / "state"
        print(f"{'check':<6} {'service':<7} {'verdict':<7} {'cpu ms/probe':>13} "
              f"{'wall ms/probe':>14}")
        with tcp_services() as tcp, udp_services() as udp:
            runs = [("tcp", name, port) for name, port in tcp.items()]
            runs += [("udp", name, port) for name, port in udp.items()]
            runs += [("exec", "live", 0, "/bin/true"), ("exec", "dead", 0, "/bin/false")]
            for kind, name, port, *command in runs:
                # silent services cost the whole timeout; fewer runs say the same
                n = max(1, args.n // 10) if name == "silent" else args.n
                argv = ["1", "1", args.timeout, kind, "127.0.0.1", str(port)]
                if command:
                    argv += ["--", *command]
                cpu, wall, status = measure(script, state, argv, n)
                print(f"{kind:<6} {name:<7} {'up' if status == 0 else 'down':<7} "
                      f"{cpu * 1000:>13.2f} {wall * 1000:>14.1f}")


if __name__ == "__main__":
    main()
