"""What a balancer's BIRD says (mode ecmp): the BGP session to the router, and
the VIPs this balancer offers it, each since when.  Read over BIRD's control
socket with birdc, as root."""

import os
import re
from datetime import datetime

SESSION = "lbctl_router"  # the protocol names bird/bird.conf.j2 gives
OFFERED = "lbctl_vips"
# bird.conf sets `timeformat ... iso long`: local time, to the second.
BIRD_TIME = "%Y-%m-%d %H:%M:%S"


def bgp_report(socket):
    """{"error", "state", "since", "last_error", "offered": [{"vip", "since"}]}
    from the BIRD at control socket `socket`: the state is BIRD's BGP state
    (Established, Active, Connect...)."""
    report = {"error": None, "state": None, "since": None, "last_error": None, "offered": []}
    if not os.path.exists(socket):
        report["error"] = "BIRD is not running (no control socket)"
        return report
    from lbctl.errors import LbctlError

    try:
        session = _birdc(socket, "show", "protocols", "all", SESSION)
        routes = _birdc(socket, "show", "route", "protocol", OFFERED)
    except OSError as exc:
        report["error"] = f"could not ask BIRD: {exc.strerror or exc}"
        return report
    except LbctlError as exc:  # birdc did not answer in time: a BIRD that hangs
        report["error"] = f"could not ask BIRD: {exc}"
        return report
    if "Permission denied" in session:
        report["error"] = "could not ask BIRD (permission denied on its socket): run as root"
        return report
    if "Unable to connect" in session:
        report["error"] = "BIRD is not running (its socket is there, but nothing answers)"
        return report
    report.update(parse_session(session))
    report["offered"] = parse_offered(routes)
    return report


def _birdc(socket, *command):
    from lbctl.adapters.programs import BIRDC, run

    done = run([BIRDC, "-s", socket, *command])
    return done.stdout + done.stderr


def parse_session(text):
    """The state, since when (epoch seconds) and last error of `show protocols all`."""
    found = {"state": None, "since": None, "last_error": None}
    line = re.search(rf"^{SESSION}\s+BGP\s+\S+\s+\S+\s+(\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d)",
                     text, re.M)
    if line:
        found["since"] = _epoch(line[1])
    state = re.search(r"^\s+BGP state:\s+(\S+)", text, re.M)
    if state:
        found["state"] = state[1]
    error = re.search(r"^\s+Last error:\s+(.+)$", text, re.M)
    if error:
        found["last_error"] = error[1].strip()
    return found


def parse_offered(text):
    """[{"vip", "since"}] of the static routes `show route protocol lbctl_vips` lists."""
    offered = []
    for match in re.finditer(rf"^([0-9.]+)/32\s+blackhole\s+\[{OFFERED} "
                             r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", text, re.M):
        offered.append({"vip": match[1], "since": _epoch(match[2])})
    return sorted(offered, key=lambda o: tuple(int(p) for p in o["vip"].split(".")))


def _epoch(text):
    return datetime.strptime(text, BIRD_TIME).timestamp()


def format_bgp(bgp, now):
    """status's lines for one cluster's BGP side (`bgp`: a status.model.BgpStatus)."""
    from lbctl.status.health import for_how_long

    if bgp.error:
        return [f"  BGP to the router {bgp.router}: unknown, {bgp.error}"]
    since = f" {for_how_long(now, bgp.since)}" if bgp.since is not None else ""
    lines = [f"  BGP to the router {bgp.router}: {bgp.state or 'unknown'}{since}"]
    if bgp.state != "Established" and bgp.last_error:
        lines.append(f"    last error: {bgp.last_error}")
    heard = bgp.state == "Established"
    if not bgp.offered:
        lines.append("  offering no VIP: no service here has a healthy worker, or keepalived "
                     "has just started")
    for offer in bgp.offered:
        lines.append(f"  offering {offer.vip} {for_how_long(now, offer.since)}"
                     + ("" if heard else " (but the session is down: the router has none)"))
    return lines
