"""status --watch: what a frame shows, and a terminal left clean."""

import io
from ipaddress import IPv4Address

from helpers import cluster_from
from lbctl.adapters.protocols import IpvsDest, IpvsService, IpvsStats
from lbctl.config.model import DestKey, ServiceKey
from lbctl.status.collect import service_status
from lbctl.status.model import HealthStatus, KeepalivedStatus, NodeStatus, VrrpStatus
from lbctl.status.render import Names
from lbctl.status.watch import fit, frame, watch

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
PI1, PI2 = IPv4Address("192.168.100.3"), IPv4Address("192.168.100.4")
KEEPALIVED = {"pi-web": KeepalivedStatus(
    pair=True, mode="failover", vrrp=VrrpStatus("MASTER", 1000.0), transitions=1,
    health=(HealthStatus("web", "pi1", "up", 900.0), HealthStatus("web", "pi2", "down", 990.0)))}


def status(conns, inbytes, pi2_weight=1, keepalived=None, drained=frozenset()):
    """The NodeStatus collect gives for this kernel table (pi1 busy, pi2 idle)."""
    svc = IpvsService(WEB, str(WEB), "wrr", 0, (
        IpvsDest(PI1, 80, 1, 3, 5, 2, IpvsStats(conns=conns, inbytes=inbytes, cps=99)),
        IpvsDest(PI2, 80, pi2_weight, 3, 0, 0, IpvsStats())))
    return NodeStatus(clusters=(), services=(service_status(svc, drained),), vips_on_lo=(),
                      arp={}, ipvs_loaded=True, keepalived=keepalived or {})


def row(lines, worker):
    return next(line for line in lines if line.startswith(f"  {worker} ")).split()


def test_a_frame_names_workers_with_health_weight_drain_and_rates_over_the_interval():
    names = Names.of([cluster_from()])
    now = status(150, 40000, pi2_weight=0, keepalived=KEEPALIVED,
                 drained={DestKey(WEB, PI2, 80)})
    lines = frame(now, status(100, 20000), 2.0, names, now=1090.0)
    assert "cluster pi-web: VRRP MASTER, changed 90s ago" in lines
    assert f"web {WEB}  wrr" in lines
    # 50 new connections and 20,000 bytes in 2 s.
    assert row(lines, "pi1") == ["pi1", "192.168.100.3:80", "up", "1", "5", "2", "25.0", "10.0k"]
    assert row(lines, "pi2")[2:5] == ["down", "0", "drained"]


def test_the_first_frame_takes_the_kernels_rates():
    lines = frame(status(150, 40000), None, 2.0, Names.of([cluster_from()]), now=0.0)
    assert row(lines, "pi1")[6] == "99.0"


def test_a_frame_without_ip_vs_says_it_is_not_loaded():
    bare = NodeStatus(clusters=(), services=(), vips_on_lo=(), arp={}, ipvs_loaded=False)
    assert frame(bare, None, 2.0, Names.of([]), now=0.0)[-1].startswith("IPVS: not loaded")


# A real terminal: watch() under a pseudo-terminal of a given size, as curses meets it.
WATCHING = """
import signal
import sys
from lbctl.status.watch import watch
# Ctrl-C as a person's terminal delivers it to lbctl: a test runner started
# in the background can hand its children SIGINT ignored or blocked.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
if len(sys.argv) > 2:  # a resize curses is not told of, as one while lbctl starts
    signal.signal(signal.SIGWINCH, signal.SIG_IGN)
lines = [f"row {i}" for i in range(int(sys.argv[1]))]  # below watch()'s header
watch(lambda: None, lambda s, p, t: lines, 0.2, sys.stdout)
print("left", flush=True)
"""


def run_in_a_terminal(rows, height, width, then, resize=None):
    """Run watch() in a pty of height x width, send `then` (bytes, or a signal)
    once a frame is drawn; (exit status, everything the terminal received).
    `resize` (height, width): first the terminal takes that size, unknown to curses."""
    import fcntl
    import os
    import pty
    import select
    import signal
    import struct
    import sys
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the size is the terminal's before curses asks for it
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        os.environ["TERM"] = "xterm"
        # curses takes these over the terminal's own size, and a test runner may set them.
        os.environ.update(LINES=str(height), COLUMNS=str(width))
        os.execv(sys.executable, [sys.executable, "-c", WATCHING, str(rows)]
                 + (["unsignalled"] if resize else []))
    received, sent, deadline = b"", False, time.monotonic() + 20
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 1)[0]:
            continue  # nothing yet: the deadline still holds
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break  # the child closed the terminal
        received += chunk
        if not sent and b"row 0" in received:
            time.sleep(0.5)  # a frame or two more
            if resize:
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", *resize, 0, 0))
                time.sleep(1.0)
            if isinstance(then, bytes):
                os.write(fd, then)
            else:
                os.kill(pid, then)
            sent = True
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), received


def test_on_a_terminal_curses_draws_on_the_alternate_screen_and_ctrl_c_gives_it_back():
    import signal

    code, seen = run_in_a_terminal(3, 24, 80, signal.SIGINT)
    assert code == 0, seen[-800:]
    assert b"\x1b[?1049h" in seen and b"lbctl status --watch" in seen
    assert b"every 0.2s  (q or Ctrl-C to leave)" in seen  # the keys it reads
    after = seen[seen.rindex(b"\x1b[?1049l"):]  # the shell's screen is back...
    assert b"left" in after  # ...and lbctl went on and ended normally


def test_q_leaves_the_live_view_like_top():
    code, seen = run_in_a_terminal(3, 24, 80, b"q")
    assert code == 0 and b"left" in seen[seen.rindex(b"\x1b[?1049l"):]


def test_a_terminal_too_small_shows_what_fits_and_says_what_is_cut():
    import signal

    code, seen = run_in_a_terminal(40, 10, 30, signal.SIGINT)
    assert code == 0, seen[-800:]
    # 41 lines on 10 rows: 9 of them, then what is cut, itself cut at 29 columns.
    assert b"... 32 more line(s): make the" in seen and b"make the " not in seen
    assert b"row 7" in seen and b"row 8" not in seen
    assert b"\x1b[1;10r" in seen  # curses drew on the 10 rows there are


def test_a_resize_curses_missed_is_followed_at_the_next_frame():
    import signal

    # 20 rows on 10 lines of 30 columns, then the terminal grows to 30 x 100.
    code, seen = run_in_a_terminal(20, 10, 30, signal.SIGINT, resize=(30, 100))
    assert code == 0, seen[-800:]
    assert b"more line(s)" in seen  # first cut to 10 lines...
    assert b"row 19" in seen  # ...then every row fits


def test_fit_keeps_a_frame_inside_the_screen():
    lines = ["a" * 50] + [f"r{i}" for i in range(9)]
    assert fit(lines, 4, 20) == ["a" * 19, "r0", "r1", "... 7 more line(s):"]
    assert fit(lines[:3], 4, 20) == ["a" * 19, "r0", "r1"]
    assert fit(lines, 0, 20) == [] and fit(lines, 4, 1) == []


def test_into_a_pipe_frames_are_printed_plainly_with_the_interval_asked_for():
    import re

    out, took = io.StringIO(), []
    # Each frame read, then the wait worked out: the second frame 1.7 s after the first.
    clock = iter([0.0, 0.1, 1.7, 1.8]).__next__

    def render(snapshot, previous, seconds):
        took.append(seconds)
        return ["frame"]

    watch(lambda: [], render, 1.0, out, sleep=lambda _: None, clock=clock, frames=2)
    # The rates take the time that passed; the header names the interval
    # asked for, and no key, since none is read from a pipe.
    assert took == [1.0, 1.7]
    assert re.fullmatch(r"(lbctl status --watch  \d\d:\d\d:\d\d  every 1s\nframe\n\n){2}",
                        out.getvalue()), out.getvalue()
