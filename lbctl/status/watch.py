"""status --watch: the balancer's live view, redrawn in place like top.

Each frame is computed from the node's status (status/collect.py) and the one
before it, so the rates are what happened during the last interval rather
than the kernel's slow moving averages.  On a terminal, curses draws each
frame over the last (it sends only what changed, so nothing flickers),
follows the terminal's size, and gives the shell's screen back as it was on
Ctrl-C or `q`.  A terminal too small for the frame shows what fits and says
how much is cut.
Elsewhere (a pipe, a log) each frame is printed plainly.
"""

import os
import sys
import time


def header(now, interval, keys):
    """A frame's first line: the time, the interval asked for (the rates use
    the time that really passed), and on a terminal the keys that leave."""
    return (f"lbctl status --watch  {time.strftime('%H:%M:%S', time.localtime(now))}"
            f"  every {interval:g}s" + ("  (q or Ctrl-C to leave)" if keys else ""))


def frame(status, previous, seconds, names, now):
    """The lines of one frame, below its header.

    `status`/`previous`: the node's NodeStatus now and `seconds` ago (None
    at the first frame: rates then come from the kernel's estimators).
    """
    from lbctl.status.health import for_how_long
    from lbctl.status.render import role_line

    lines = []
    health = {}
    for cluster, info in status.keepalived.items():
        vrrp = info.held_vrrp
        role = (f"VRRP {vrrp.state}, changed "
                f"{for_how_long(now, vrrp.since).removeprefix('for ')} ago") if vrrp else \
            role_line(info, now)
        lines.append(f"cluster {cluster}: {role}")
        health.update({pair: h.state or "?" for pair, h in info.health_by_pair().items()})
    before = {} if previous is None else {
        (s.service, d.address): d for s in previous.services for d in s.real_servers}
    lines.append("")
    lines.append(f"{'service / worker':<34}{'health':<8}{'weight':<14}{'active':>8}"
                 f"{'inactive':>10}{'new/s':>9}{'in B/s':>12}")
    for svc in status.services:
        name = names.services.get(svc.service, "?")
        lines.append(f"{name} {svc.service}  {svc.scheduler}")
        for d in svc.real_servers:
            worker = names.workers.get(d.address.rpartition(":")[0], "?")
            old = before.get((svc.service, d.address))
            if old is None or seconds <= 0:
                cps, bps = d.conns_per_s, d.in_bytes_per_s
            else:
                cps = max(0, d.connections - old.connections) / seconds
                bps = max(0, d.in_bytes - old.in_bytes) / seconds
            weight = f"{d.weight} drained" if d.drained else str(d.weight)
            label = f"  {worker} {d.address}"
            lines.append(f"{label:<34}{health.get((name, worker), '-'):<8}{weight:<14}"
                         f"{d.active:>8}{d.inactive:>10}{cps:>9.1f}{_bytes(bps):>12}")
    if not status.services:
        lines.append("no IPVS services" if status.ipvs_loaded else
                     "IPVS: not loaded (the ip_vs kernel module), so no services run here")
    return lines


def _bytes(rate):
    for unit in ("", "k", "M", "G"):
        if rate < 1000 or unit == "G":
            return f"{rate:.0f}{unit}" if unit == "" else f"{rate:.1f}{unit}"
        rate /= 1000
    return f"{rate:.1f}G"


def fit(lines, height, width):
    """The lines a height x width screen can show: cut at the right edge, and
    with a last line saying how many did not fit below."""
    if height < 1 or width < 2:
        return []
    if len(lines) > height:
        hidden = len(lines) - (height - 1)
        lines = lines[:height - 1] + [f"... {hidden} more line(s): make the terminal taller"]
    # curses cannot write the bottom-right cell without scrolling: one column spare.
    return [line[:width - 1] for line in lines]


def watch(read, render, interval, out, sleep=time.sleep, clock=time.monotonic, frames=None):
    """Draw a frame every `interval` until Ctrl-C (or `frames` frames, for tests).

    `read()` returns a snapshot; `render(snapshot, previous, seconds)` its
    lines, which follow a header().  Into a pipe or a log no key is read, so
    its frames name none.
    """
    if out.isatty() and sys.stdin.isatty():  # curses reads its keys there
        return _on_terminal(read, render, interval, clock)
    previous, taken, drawn = None, None, 0
    try:
        while frames is None or drawn < frames:
            snapshot, now = read(), clock()
            lines = render(snapshot, previous, interval if taken is None else now - taken)
            out.write("\n".join([header(time.time(), interval, keys=False), *lines]) + "\n\n")
            out.flush()
            previous, taken, drawn = snapshot, now, drawn + 1
            if frames is None or drawn < frames:
                sleep(max(0.0, interval - (clock() - now)))
    except KeyboardInterrupt:
        pass
    return 0


def _on_terminal(read, render, interval, clock):
    # curses only here: a pipe or the exporter never pays for it.
    import curses

    def loop(screen):
        try:
            curses.curs_set(0)
        except curses.error:
            pass  # a terminal that cannot hide its cursor
        previous, taken, lines = None, None, []
        while True:
            snapshot, now = read(), clock()
            lines = [header(time.time(), interval, keys=True),
                     *render(snapshot, previous, interval if taken is None else now - taken)]
            previous, taken = snapshot, now
            while True:
                _paint(screen, lines)
                # Wait out the interval on the keyboard: a resize redraws at
                # once, q leaves, anything else is ignored.
                screen.timeout(max(0, int((interval - (clock() - now)) * 1000)))
                key = screen.getch()
                if key in (ord("q"), ord("Q")):
                    return
                if key == -1:
                    break  # the interval is over: a new frame

    try:
        curses.wrapper(loop)
    except KeyboardInterrupt:
        pass
    return 0


def _paint(screen, lines):
    import curses

    _follow_the_terminal(screen)
    height, width = screen.getmaxyx()
    screen.erase()
    for y, line in enumerate(fit(lines, height, width)):
        try:
            screen.addstr(y, 0, line)
        except curses.error:
            break  # the terminal shrank under us: the next frame fits again
    screen.refresh()


def _follow_the_terminal(screen):
    """ncurses learns of a resize from SIGWINCH, and misses one that comes as
    lbctl starts (a new tmux pane takes its size then): each frame asks the
    terminal for its size instead."""
    import curses

    try:
        columns, lines = os.get_terminal_size(sys.__stdout__.fileno())
    except OSError:
        return
    if lines > 0 and columns > 0 and (lines, columns) != screen.getmaxyx():
        curses.resizeterm(lines, columns)
