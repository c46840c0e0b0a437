"""status --watch: the balancer's live view, redrawn in place like top.

Each frame is computed from one IPVS snapshot and the one before it, so the
rates are what happened during the last interval rather than the kernel's
slow moving averages.  On a terminal the frame is drawn over the last one
(cursor home, each line cleared to its end, then the rest of the screen), on
the alternate screen, so nothing flickers and the shell's screen comes back
as it was on Ctrl-C.  Elsewhere (a pipe, a log) each frame is printed plainly.
"""

import time
from dataclasses import dataclass

ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
LEAVE = "\x1b[?25h\x1b[?1049l"
HOME, CLEAR_LINE, CLEAR_REST = "\x1b[H", "\x1b[K", "\x1b[J"


@dataclass(frozen=True)
class Names:
    """What the file calls things, and what lbctl knows beside the kernel."""

    services: dict  # {ServiceKey: name}
    workers: dict  # {IPv4Address: name}
    drained: frozenset  # {DestKey}

    @classmethod
    def of(cls, clusters, drained=frozenset()):
        services, workers = {}, {}
        for cluster in clusters:
            services.update({svc.key: name for name, svc in cluster.services.items()})
            workers.update({w.address: name for name, w in cluster.workers.items()})
        return cls(services, workers, frozenset(drained))


def frame(snapshot, previous, seconds, names, keepalived, now):
    """The lines of one frame.

    `snapshot`/`previous`: IpvsService lists now and one interval ago (None at
    the first frame: rates then come from the kernel's estimators).
    `keepalived`: status.keepalived_states(), for VRRP and health.
    """
    from lbctl.config.model import DestKey
    from lbctl.health import for_how_long

    lines = [f"lbctl status --watch  {time.strftime('%H:%M:%S', time.localtime(now))}"
             f"  every {seconds:g}s  (Ctrl-C to leave)"]
    health = {}
    for cluster, info in keepalived.items():
        vrrp = info["vrrp"]
        role = "no VRRP state reported" if vrrp is None else (
            f"VRRP {vrrp['state']}, changed "
            f"{for_how_long(now, vrrp['since']).removeprefix('for ')} ago")
        lines.append(f"cluster {cluster}: {role}")
        health.update({(h["service"], h["worker"]): h["state"] for h in info["health"]})
    before = {} if previous is None else {
        (s.key, d.address, d.port): d.stats for s in previous if s.key for d in s.dests}
    lines.append("")
    lines.append(f"{'service / worker':<34}{'health':<8}{'weight':<14}{'active':>8}"
                 f"{'inactive':>10}{'new/s':>9}{'in B/s':>12}")
    for svc in snapshot:
        if svc.key is None:
            continue
        name = names.services.get(svc.key, "?")
        lines.append(f"{name} {svc.key}  {svc.scheduler}")
        for d in svc.dests:
            worker = names.workers.get(d.address, "?")
            old = before.get((svc.key, d.address, d.port))
            if old is None or seconds <= 0:
                cps, bps = d.stats.cps, d.stats.inbps
            else:
                cps = max(0, d.stats.conns - old.conns) / seconds
                bps = max(0, d.stats.inbytes - old.inbytes) / seconds
            drained = DestKey(svc.key, d.address, d.port) in names.drained
            weight = f"{d.weight} drained" if drained else str(d.weight)
            label = f"  {worker} {d.address}:{d.port}"
            lines.append(f"{label:<34}{health.get((name, worker), '-'):<8}{weight:<14}"
                         f"{d.active:>8}{d.inactive:>10}{cps:>9.1f}{_bytes(bps):>12}")
    if not any(s.key for s in snapshot):
        lines.append("no IPVS services")
    return lines


def _bytes(rate):
    for unit in ("", "k", "M", "G"):
        if rate < 1000 or unit == "G":
            return f"{rate:.0f}{unit}" if unit == "" else f"{rate:.1f}{unit}"
        rate /= 1000
    return f"{rate:.1f}G"


def draw(lines, out, tty):
    if tty:
        out.write(HOME + "".join(f"{line}{CLEAR_LINE}\n" for line in lines) + CLEAR_REST)
    else:
        out.write("\n".join(lines) + "\n\n")
    out.flush()


def watch(read, render, interval, out, sleep=time.sleep, clock=time.monotonic, frames=None):
    """Draw a frame every `interval` until Ctrl-C (or `frames` frames, for tests).

    `read()` returns a snapshot; `render(snapshot, previous, seconds)` its lines.
    """
    tty = out.isatty()
    if tty:
        out.write(ENTER)
    try:
        previous, taken, drawn = None, None, 0
        while frames is None or drawn < frames:
            snapshot, now = read(), clock()
            draw(render(snapshot, previous, interval if taken is None else now - taken), out, tty)
            previous, taken, drawn = snapshot, now, drawn + 1
            if frames is None or drawn < frames:
                sleep(max(0.0, interval - (clock() - now)))
    except KeyboardInterrupt:
        pass
    finally:
        if tty:
            out.write(LEAVE)
            out.flush()
    return 0
