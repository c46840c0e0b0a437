"""status --watch: what a frame shows, and a terminal left clean."""

import io
from ipaddress import IPv4Address

from helpers import cluster_from
from lbctl.adapters.protocols import IpvsDest, IpvsService, IpvsStats
from lbctl.config.model import DestKey, ServiceKey
from lbctl.watch import ENTER, HOME, LEAVE, Names, frame, watch

WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
PI1, PI2 = IPv4Address("192.168.100.3"), IPv4Address("192.168.100.4")
KEEPALIVED = {"pi-web": {"vrrp": {"state": "MASTER", "since": 1000.0},
                         "health": [{"service": "web", "worker": "pi1", "state": "up",
                                     "since": 900.0},
                                    {"service": "web", "worker": "pi2", "state": "down",
                                     "since": 990.0}]}}


def table(conns, inbytes, pi2_weight=1):
    return [IpvsService(WEB, str(WEB), "wrr", 0, (
        IpvsDest(PI1, 80, 1, 3, 5, 2, IpvsStats(conns=conns, inbytes=inbytes, cps=99)),
        IpvsDest(PI2, 80, pi2_weight, 3, 0, 0, IpvsStats())))]


def row(lines, worker):
    return next(line for line in lines if line.startswith(f"  {worker} ")).split()


def test_a_frame_names_workers_with_health_weight_drain_and_rates_over_the_interval():
    names = Names.of([cluster_from()], {DestKey(WEB, PI2, 80)})
    lines = frame(table(150, 40000, pi2_weight=0), table(100, 20000), 2.0, names, KEEPALIVED,
                  now=1090.0)
    assert "cluster pi-web: VRRP MASTER, changed 90s ago" in lines
    assert f"web {WEB}  wrr" in lines
    # 50 new connections and 20,000 bytes in 2 s.
    assert row(lines, "pi1") == ["pi1", "192.168.100.3:80", "up", "1", "5", "2", "25.0", "10.0k"]
    assert row(lines, "pi2")[2:5] == ["down", "0", "drained"]


def test_the_first_frame_takes_the_kernels_rates():
    lines = frame(table(150, 40000), None, 2.0, Names.of([cluster_from()]), {}, now=0.0)
    assert row(lines, "pi1")[6] == "99.0"


def test_on_a_terminal_frames_overwrite_in_place_and_ctrl_c_restores_the_screen():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    calls = []

    def sleep(_):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    assert watch(lambda: table(1, 1), lambda s, p, t: ["frame"], 1.0, out, sleep=sleep) == 0
    text = out.getvalue()
    assert text.startswith(ENTER) and text.endswith(LEAVE)
    assert text.count(HOME) == 2 and "\x1b[2J" not in text  # never a full clear: no flicker


def test_into_a_pipe_frames_are_printed_plainly():
    out = io.StringIO()
    watch(lambda: [], lambda s, p, t: ["frame"], 1.0, out, sleep=lambda _: None, frames=2)
    assert out.getvalue() == "frame\n\nframe\n\n"
