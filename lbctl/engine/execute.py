"""The one place that changes a node: it carries out a Plan through the adapters.

Order: record ownership, then everything that adds or changes, then (only if
all of that worked) everything that removes, then narrow the ownership
record.  Stopping anywhere leaves a state the next apply converges from.
"""

import errno
import os
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

from lbctl.adapters.garp import PROBE_LISTEN
from lbctl.adapters.protocols import IpvsOp
from lbctl.errors import ApplyError
from lbctl.records.ownership import write_ownership
from lbctl.layout import Layout
from lbctl.engine.plan import (
    ADD, CHANGE, DAEMON_KINDS, DRAIN, DRAINING, IPVS_KINDS, KEEPALIVED, REMOVE, Kind,
)
from lbctl.state import DestSpec


@dataclass
class ApplyReport:
    done: list = field(default_factory=list)  # Changes made
    pending: list = field(default_factory=list)  # real servers left draining
    warnings: list = field(default_factory=list)  # done, but not all of it worked
    writes: int = 0
    replan: bool = False  # a daemon stopped: observe again and apply the rest
    held: dict = field(default_factory=dict)  # {Address: MAC}: VIPs another host answers for


def execute(plan, adapters, listen=PROBE_LISTEN):
    """`listen`: how long the ARP Probes for VIPs to add wait for answers
    after the last one (longer right after keepalived let a pair's VIPs go:
    the peer may be taking them over)."""
    report = ApplyReport()
    # Every daemon the plan starts or reloads is prepared and its config
    # tested first, also when a stop comes before them: a config refused after
    # BIRD stopped would leave the balancer withdrawn and nothing else done.
    _test_daemon_config(plan, adapters)
    stop = [c for c in plan.changes if c.kind in DAEMON_KINDS and c.action == REMOVE]
    if stop:
        _run_daemon(adapters, stop, report, plan.cluster)
        report.replan = True
        return report
    report.held = _held_elsewhere(plan, adapters, report, listen)
    if report.held:
        # Left out, and not claimed in the ownership record: lbctl did not add them.
        held = set(report.held)
        plan = replace(
            plan, changes=[c for c in plan.changes if not (
                c.kind == Kind.ADDRESS and c.action == ADD and c.key in held)],
            owned_before=replace(plan.owned_before,
                                 addresses=plan.owned_before.addresses - held),
            owned_after=replace(plan.owned_after, addresses=plan.owned_after.addresses - held))
        report.warnings.append(held_elsewhere_error(report.held).reason)
    try:
        _make_changes(plan, adapters, report)
    finally:
        # Even when a later change failed: the next apply finds these VIPs
        # held and adds (so announces) nothing.
        _announce(adapters, plan, report)
    return report


def _make_changes(plan, adapters, report):
    files = adapters.files
    if write_ownership(files, adapters.ownership_dir, plan.cluster, plan.owned_before,
                       plan.node):
        report.writes += 1
    adds = [c for c in plan.changes if c.action in (ADD, CHANGE)]
    removes = [c for c in plan.changes if c.action in (DRAIN, REMOVE)]
    report.pending += [c for c in plan.changes if c.action == DRAINING]

    daemon = [c for c in adds if c.kind in DAEMON_KINDS]
    _apply_local(adapters, [c for c in adds if c.kind not in IPVS_KINDS + DAEMON_KINDS], report)
    handover = [c for c in adds if c.handover]
    _apply_ipvs(adapters, [_ipvs_op(c) for c in handover], handover, report)
    reloaded = 0  # how many of report.done systemd has seen
    if daemon:
        # systemd must know a new or changed unit before it can start it.
        reloaded = _reload_units(report, adapters.systemd, since=0)
        _run_daemon(adapters, daemon, report, plan.cluster)
    # keepalived has just set these real servers to weight 0 or deleted them,
    # as its new config says; the busy ones drain until a later apply.
    by_keepalived = [c for c in removes if c.kind in IPVS_KINDS and c.through == KEEPALIVED]
    report.done += [c for c in by_keepalived if c.action == REMOVE]
    report.pending += [c for c in by_keepalived if c.action == DRAIN]
    removes = [c for c in removes if c not in by_keepalived]
    ipvs_adds = [c for c in adds if c.kind in IPVS_KINDS and not c.handover]
    _apply_ipvs(adapters, [_ipvs_op(c) for c in ipvs_adds], ipvs_adds, report)

    drains = [c for c in removes if c.action == DRAIN]
    if drains:
        _drain(adapters, drains, report)
    ipvs_removes = [c for c in removes if c.action == REMOVE and c.kind in IPVS_KINDS]
    _apply_ipvs(adapters, [_ipvs_op(c) for c in ipvs_removes], ipvs_removes, report)
    local_removes = [c for c in removes if c.kind not in IPVS_KINDS]
    _apply_local(adapters, local_removes, report)

    if write_ownership(files, adapters.ownership_dir, plan.cluster, plan.owned_after,
                       plan.node):
        report.writes += 1
    _reload_units(report, adapters.systemd, since=reloaded)


def _reload_units(report, systemd, since):
    """Tell systemd about units changed in report.done[since:]; returns the new mark."""
    changed = any(c.kind in (Kind.FILE, Kind.LINK) and c.key.endswith(".service")
                  for c in report.done[since:])
    if systemd is not None and changed:
        systemd.daemon_reload()
    return len(report.done)


def _test_daemon_config(plan, adapters):
    """Each daemon to start or reload checks its changed config before
    anything on the node changes."""
    written = {c.key: c.new.content for c in plan.changes if c.kind == Kind.FILE and c.new}
    for change in plan.changes:
        if change.kind not in DAEMON_KINDS or change.action not in (ADD, CHANGE):
            continue
        daemon = adapters.daemons[change.new.name]
        # Also when only a start is due: a missing daemon stops apply here.
        daemon.prepare(change.new.programs)
        config = written.get(change.new.config)
        problems = daemon.test(config) if config is not None else []
        if problems:
            raise ApplyError("test", f"{daemon.name} config {change.new.config}",
                             f"{daemon.name} rejects it; nothing on this node was changed:\n  "
                             + "\n  ".join(problems))


def _held_elsewhere(plan, adapters, report, listen):
    """{Address: MAC} of the VIPs this run would add to a LAN interface that
    another host answers ARP for (a departing balancer still running, a host
    given the address by mistake): two MACs would split their clients, so
    they are left out and the rest is applied.  (On lo, where workers and
    ECMP balancers hold VIPs, nothing is asked: those answer no ARP.)"""
    on_lan = [c.key for c in plan.changes
              if c.kind == Kind.ADDRESS and c.action == ADD and c.key.ifname != "lo"]
    if not on_lan:
        return {}
    probed = adapters.addresses.probe(on_lan, listen)
    for ifname, why in sorted(probed.unasked.items()):
        vips = ", ".join(str(a.ip) for a in on_lan if a.ifname == ifname)
        report.warnings.append(f"added {vips} without asking whether another host on the LAN "
                               f"holds them: no ARP Probe went out on {ifname} ({why})")
    return probed.held


def held_elsewhere_error(held):
    """The ApplyError for VIPs apply left out because another host holds them."""
    ordered = sorted(held, key=lambda a: a.ip)
    named = ", ".join(f"{a.ip} (by {held[a]})" for a in ordered)
    return ApplyError(
        "add", ", ".join(str(a) for a in ordered),
        f"another host on the LAN answers ARP for {named}; two holders would split its "
        "clients, so this balancer left it out (the rest is applied).  A balancer leaving "
        "the cluster: `lbctl apply --remove` there, then apply here again (to shrink a pair "
        "without a gap, remove the departing balancer first); a worker: its ARP settings, "
        "which `lbctl doctor` checks.")


def _run_daemon(adapters, changes, report, cluster_name):
    layout = Layout(cluster_name)
    for change in changes:
        spec = change.new or change.old
        daemon = adapters.daemons[spec.name]
        action = {ADD: daemon.start, CHANGE: daemon.reload, REMOVE: daemon.stop}[change.action]
        try:
            action()
        except OSError as exc:
            raise ApplyError(change.key, change.kind, exc.strerror or str(exc)) from exc
        # Noted only once the daemon has taken the files: a run cut short
        # before this leaves the old note, and the next apply reloads.
        if change.action == REMOVE:
            adapters.files.remove(layout.loaded(spec.name))
        else:
            note_loaded(adapters.files, cluster_name, spec)
        report.done.append(change)
        report.writes += 1


def note_loaded(files, cluster_name, daemon):
    """The daemon runs the files `daemon` (the wanted DaemonSpec) describes."""
    files.write(Layout(cluster_name).loaded(daemon.name), f"{daemon.digest}\n", 0o644)


def _ipvs_op(change):
    verb = {ADD: "add", CHANGE: "set", REMOVE: "del"}[change.action]
    if change.kind == Kind.SERVICE:
        return IpvsOp(verb, "service", change.key, change.new)
    return IpvsOp(verb, "dest", change.key.service, change.new, change.key)


def _apply_ipvs(adapters, ops, changes, report):
    if not ops:
        return
    results = adapters.ipvs.run(ops)
    failed = [(c, r) for c, r in zip(changes, results) if r.error is not None]
    report.done += [c for c, r in zip(changes, results) if r.error is None]
    report.writes += len(ops) - len(failed)
    if failed:
        change, result = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise ApplyError(_verb(change), f"{change.kind} {change.key}",
                         _ipvs_reason(change, result.errno) + more)


def _drain(adapters, drains, report):
    """Weight 0 first; real servers that are then idle are deleted in the same apply."""
    zero = [IpvsOp("set", "dest", c.key.service, DestSpec(0, c.old.forward), c.key) for c in drains]
    _apply_ipvs(adapters, zero, drains, report)
    in_use = {}
    # Only the drained real servers' services: one real server leaving a
    # table of thousands reads one service back, not the table again.
    for key, dests in adapters.ipvs.real_servers({c.key.service for c in drains}).items():
        for d in dests:
            spec = DestSpec(d.weight, d.forward, d.active, d.inactive)
            in_use[(key, d.address, d.port)] = spec.in_use(key.protocol)
    idle, busy = [], []
    for c in drains:
        (busy if in_use.get((c.key.service, c.key.address, c.key.port), 0) else idle).append(c)
    report.pending += busy
    _apply_ipvs(adapters, [IpvsOp("del", "dest", c.key.service, None, c.key) for c in idle],
                idle, report)


def _address(adapters, change):
    (adapters.addresses.add if change.action == ADD else adapters.addresses.remove)(change.key)


def _file(adapters, change):
    if change.action == REMOVE:
        adapters.files.remove(change.key)
    else:
        lock = change.new.lock
        with adapters.files.locked(lock) if lock is not None else nullcontext():
            adapters.files.write(change.key, change.new.content, change.new.mode)


def _link(adapters, change):
    if change.action == REMOVE:
        adapters.files.remove(change.key)
    else:
        adapters.files.symlink(change.key, change.new)


# How each kind of change made one at a time is carried out.  IPVS changes go
# in batches (_apply_ipvs) and the daemon's through _run_daemon.
LOCAL_HANDLERS = {
    Kind.ADDRESS: _address,
    Kind.SYSCTL: lambda adapters, c: adapters.sysctls.write(c.key, c.new),
    Kind.IPVS_TIMEOUT: lambda adapters, c: adapters.ipvs.set_timeouts({c.key: c.new}),
    Kind.SYNC_DAEMON: lambda adapters, c: adapters.ipvs.stop_sync_daemon(c.key),
    Kind.FILE: _file,
    Kind.LINK: _link,
    Kind.SYSTEMD: lambda adapters, c: adapters.systemd and adapters.systemd.daemon_reload(),
}


def _apply_local(adapters, changes, report):
    for change in changes:
        try:
            LOCAL_HANDLERS[change.kind](adapters, change)
        except Exception as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ApplyError(_verb(change), f"{change.kind} {change.key}", reason) from exc
        report.done.append(change)
        report.writes += 1


def _announce(adapters, plan, report):
    """The VIPs this run added to a balancer's LAN interface are announced:
    clients and the router may hold another balancer's MAC for them.  Only
    now, with the services that serve them in place, so the traffic the
    announcement pulls in is served.  (A worker's VIPs, on lo, never are.)
    The addresses work unannounced, so a failure is a warning, not a failed apply."""
    added = [c.key for c in report.done if c.kind == Kind.ADDRESS and c.action == ADD
             and c.key.ifname != "lo"]  # an ECMP balancer's, which the router routes to it
    if plan.role != "balancer" or not added:
        return
    try:
        adapters.addresses.announce(added)
    except OSError as exc:
        report.warnings.append(
            f"could not announce {', '.join(str(a.ip) for a in added)} with gratuitous ARP "
            f"({exc.strerror or exc}): hosts that cached another MAC reach them only once "
            "that entry expires")


def _verb(change):
    return {ADD: "add", CHANGE: "change", DRAIN: "drain", REMOVE: "remove"}.get(change.action, change.action)


def _ipvs_reason(change, code):
    if change.kind == Kind.REAL_SERVER and code == errno.EINVAL:
        return (f"the kernel refused it (EINVAL): {change.key.address} has no route from this "
                "balancer or is not a unicast address; direct routing needs the real server "
                "on a directly connected network")
    if change.kind == Kind.SERVICE and code == errno.ENOENT and change.new is not None:
        return (f"scheduler {change.new.scheduler} is not available in this kernel "
                f"(module ip_vs_{change.new.scheduler} missing)")
    if code == errno.EEXIST:
        return "it already exists (was it changed by something else during apply?)"
    if code == errno.ESRCH:
        return "the service is gone (was it changed by something else during apply?)"
    if code in (errno.EPERM, errno.EACCES):
        return "permission denied: run as root"
    return os.strerror(code) if code else "failed"
