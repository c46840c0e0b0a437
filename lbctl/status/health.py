"""Health as keepalived reports it, and whether the kernel's IPVS table agrees.

keepalived's notify hooks (keepalived/lbctl-notify) leave one small file per
event in the cluster's state folder: "health.SERVICE@WORKER" and "vrrp", each
holding "STATE EPOCH-SECONDS" and the hook's own start ("TICKS PID").  Reading them is all `status` and `apply` need.
"""

import math
import os
import re
import stat
import time
from dataclasses import dataclass

from lbctl.config.model import NAME_PATTERN, DestKey

# The folder belongs to keepalived's script user, and root reads it: a file
# there may be a FIFO, a link to /dev/zero, or text meant for the terminal.
# So a hook file is read only when it is a small regular file of the folder's
# owner (or root), opened without following links or blocking, and only the
# states the hooks write are believed.
_MAX_HOOK_FILE = 128
_STATES = {"vrrp": {"MASTER", "BACKUP", "FAULT", "STOP"}, "health": {"up", "down"}}
_HEALTH_FILE = re.compile(rf"health\.{NAME_PATTERN}@{NAME_PATTERN}")


@dataclass(frozen=True)
class Reported:
    state: str  # "up"/"down" for health; "MASTER"/"BACKUP"/"FAULT"/"STOP" for vrrp
    since: float  # epoch seconds


def read_state_dir(path):
    """{file name: Reported} for every hook file in a state folder."""
    found = {}
    try:
        names = os.listdir(path)
        owners = {0, os.stat(path).st_uid}
    except OSError:
        return found
    for name in names:
        kind = "vrrp" if name == "vrrp" else "health" if _HEALTH_FILE.fullmatch(name) else None
        if kind is None:
            continue
        text = read_hook_file(os.path.join(path, name), owners)
        try:
            # "STATE EPOCH", then (from lbctl 0.2's hooks on) the hook's start
            # "TICKS PID", which orders the hooks and is not read here.
            state, since, *_order = text.split()
            since = float(since)
        except (AttributeError, ValueError):
            continue  # absent, not a hook's file, or a hook is writing it right now
        if state in _STATES[kind] and math.isfinite(since):
            found[name] = Reported(state, since)
    return found


def read_hook_file(path, owners):
    """The ASCII text of a small regular file owned by one of `owners`, else None.

    Never follows a link, never blocks on a FIFO, never reads more than a hook writes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in owners:
            return None
        data = os.read(fd, _MAX_HOOK_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > _MAX_HOOK_FILE or not data.isascii():
        return None
    return data.decode("ascii")


def read_transitions(state_dir):
    """VRRP role changes the notify hook counted since the state folder was made."""
    try:
        owners = {0, os.stat(state_dir).st_uid}
    except OSError:
        return 0
    text = (read_hook_file(os.path.join(state_dir, "vrrp.transitions"), owners) or "").strip()
    return int(text) if text.isdigit() and len(text) < 10 else 0


def health_of(reported, service, worker):
    return reported.get(f"health.{service}@{worker}")


def workers_health(reported):
    """[(service, worker, Reported)] for every health file, sorted.

    '@' separates the names because no service or worker name may contain it.
    """
    found = []
    for name, r in sorted(reported.items()):
        if name.startswith("health."):
            service, _, worker = name[len("health."):].partition("@")
            found.append((service, worker, r))
    return found


MAX_SETTLE_WAIT = 120  # seconds; a worker not checked by then is named as such


def settle_seconds(cluster):
    """How long apply waits for a fresh keepalived's checks: until every check
    had its chance, but never longer than MAX_SETTLE_WAIT (ten rises of an
    hourly check would hold apply, a boot unit or an ssh session for hours).
    keepalived's first probe of a check may come as late as one interval
    after it starts, and on a busy Pi a hook reports a pass a moment after
    keepalived has set the weight: both are waited for."""
    first_probe = max((s.health.interval for s in cluster.services.values()
                       if s.health is not None), default=0)
    return min(cluster.health_settle_seconds + first_probe + 3, MAX_SETTLE_WAIT)


def ipvs_drift(cluster, reported, services, draining=frozenset(), drained=frozenset()):
    """(problems, unchecked): how IPVS differs from the file and current health.

    `services` is the IPVS dump.  A real server belongs in the table when its
    service has no checks or its checks report it up; one that is down, or
    that no check has passed yet (keepalived's alpha mode, listed as
    unchecked), is absent or at weight 0 (inhibit_on_failure).
    `draining` (DestKeys) are real servers the file dropped that stay at
    weight 0 until their connections end; `drained` (DestKeys) are those
    `lbctl drain` took out, at weight 0 whatever their health.
    """
    table = {s.key: s for s in services if s.key is not None}
    problems, unchecked = [], []
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        found = table.get(svc.key)
        if found is None:
            problems.append(f"service {svc.name} ({svc.key}) is not in IPVS")
            continue
        if found.scheduler != svc.scheduler:
            problems.append(f"service {svc.name}: scheduler is {found.scheduler}, "
                            f"the file says {svc.scheduler}")
        elif found.flags != svc.flags:
            problems.append(f"service {svc.name}: flags are {_flags(found.flags)}, "
                            f"the file says {_flags(svc.flags)}")
        dests = {(d.address, d.port): d for d in found.dests}
        for rs in svc.real_servers:
            dest = dests.pop((rs.address, svc.port), None)
            health = health_of(reported, svc.name, rs.worker) if svc.health else Reported("up", 0)
            if health is None:
                unchecked.append(f"{svc.name}/{rs.worker}")
            wanted = health is not None and health.state == "up"
            where = f"service {svc.name}: worker {rs.worker} ({rs.address}:{svc.port})"
            weight = 0 if DestKey(svc.key, rs.address, svc.port) in drained else rs.weight
            if wanted and dest is None:
                problems.append(f"{where} is healthy but not in IPVS")
            elif not wanted and health is not None and dest is not None and dest.weight != 0:
                # keepalived's inhibit_on_failure keeps a failed server at
                # weight 0 so its connections finish; only traffic is wrong.
                problems.append(f"{where} is {health.state} but still takes traffic in IPVS "
                                f"(weight {dest.weight})")
            elif wanted and dest.weight != weight:
                said = "it is drained" if weight != rs.weight else f"the file says {rs.weight}"
                problems.append(f"{where} has weight {dest.weight}, {said}")
        for address, port in sorted(dests):
            if DestKey(svc.key, address, port) in draining:
                if dests[(address, port)].weight != 0:
                    problems.append(f"service {svc.name}: {address}:{port} is leaving but "
                                    f"still has weight {dests[(address, port)].weight}")
                continue
            problems.append(f"service {svc.name}: {address}:{port} is in IPVS but not in the file")
    return problems, unchecked


def _flags(names):
    return ",".join(names) or "none"


def timeout_drift(cluster, timeouts):
    """The file's IPVS timeouts that the kernel (`timeouts`, from Ipvs.timeouts()) lacks."""
    return [f"IPVS timeout {name} is {timeouts.get(name)}s, the file says {seconds}s"
            for name, seconds in sorted(cluster.ipvs_timeouts.items())
            if timeouts.get(name) != seconds]


def wait_for_ipvs(cluster, state_dir, dump, timeout, poll=0.2, draining=frozenset(),
                  drained=frozenset(), confirm_after=1.0, clock=time.monotonic,
                  sleep=time.sleep):
    """Poll until IPVS matches (no problems, every server checked) or time runs out.

    keepalived changes IPVS first and runs the notify hook after, so a check
    that changed state a moment ago shows as a mismatch until the hook has
    written.  A problem is reported only when it is still there
    `confirm_after` seconds later: drift persists, a hook in flight does not.
    """
    deadline = clock() + timeout
    while True:
        reported = read_state_dir(state_dir)
        problems, unchecked = ipvs_drift(cluster, reported, dump(), draining, drained)
        if not problems and not unchecked:
            return problems, unchecked, reported
        if clock() >= deadline:
            break
        sleep(poll)
    if problems:
        sleep(confirm_after)
        reported = read_state_dir(state_dir)
        again, unchecked = ipvs_drift(cluster, reported, dump(), draining, drained)
        problems = [p for p in again if p in problems]
    return problems, unchecked, reported


def describe_health(cluster, reported, now=None):
    """One line per checked service: each worker's state and since when."""
    now = time.time() if now is None else now
    lines = []
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        if svc.health is None:
            continue
        parts = []
        for rs in svc.real_servers:
            health = health_of(reported, svc.name, rs.worker)
            parts.append(f"{rs.worker} " + ("unchecked" if health is None else
                                            f"{health.state} {for_how_long(now, health.since)}"))
        lines.append(f"{svc.name} ({svc.health.kind} check): " + ", ".join(parts))
    return lines


def for_how_long(now, since):
    seconds = max(0, now - since)
    if seconds < 120:
        return f"for {seconds:.0f}s"
    if seconds < 7200:
        return f"for {seconds / 60:.0f}m"
    return f"for {seconds / 3600:.0f}h"
