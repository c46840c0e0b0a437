import time

from lbctl.config import load_cluster
from lbctl.status.render import describe_drains
from lbctl.errors import ApplyError, PlanChanged, UsageError
from lbctl.engine.execute import execute, held_elsewhere_error, note_loaded
from lbctl.records.last_apply import record_last_apply
from lbctl.records.lock import node_locked
from lbctl.adapters.files import remove_runtime_dirs
from lbctl.engine.node import load_node
from lbctl.engine.plan import (CHANGE, DEFERRED_MARK, DRAINING_MARK, Change, Kind, fingerprint,
                               format_plan)
from lbctl.state import KEEPALIVED


def run(args, out):
    cluster = load_cluster(args.file)  # once: standard input can be read only once
    reached = {}  # the node's role, once known: the exporter reports a balancer's applies
    try:
        with node_locked(args.root, cluster.name) as lock:
            code = _apply(args, out, cluster, reached)
            if args.remove:
                lock.remove_on_release()
    except PlanChanged:
        raise  # refused before any change: the last apply stands as it was
    except Exception as exc:  # any failure: an OSError is as much a failed apply
        _record(args, cluster, reached, False, str(exc) or type(exc).__name__)
        raise
    _record(args, cluster, reached, code == 0)
    return code


def _record(args, cluster, reached, ok, error=None):
    if reached.get("role") == "balancer" and not args.remove:
        record_last_apply(args.root, cluster.name, ok, error)


def _apply(args, out, cluster, reached):
    def load():
        return load_node(args.file, args.node, args.root, force=args.force,
                         remove=args.remove, cluster=cluster, keep_leaving=args.keep_leaving)

    ctx = load()
    reached["role"] = ctx.plan.role
    if args.keep_leaving and ctx.plan.role != "worker":
        raise UsageError("--keep-leaving is for workers: a balancer's removals are "
                         "keepalived's or drain by themselves")
    agreed = getattr(args, "expect_plan", None)
    if agreed is not None and fingerprint(ctx.plan) != agreed:
        out.write(format_plan(ctx.plan) + "\n")
        raise PlanChanged("this node's plan is no longer the one planned before any node "
                          "changed (another apply, a drain or a failover since?): nothing was "
                          "changed here; its plan now is above")
    report = None
    released = vips_the_reload_drops(ctx)
    changed = not ctx.plan.empty
    if changed:
        takeover = _peer_takeover_seconds(ctx.plan)
        report = execute(_bridged(ctx, released), ctx.adapters)
        if report.replan or released:
            # keepalived stopped and took its VIPs and services, or reloaded
            # without the pair's VRRP instance and took that instance's VIPs:
            # observe again, and lbctl takes over what keepalived let go of.
            _print_report(ctx, report, out, args.remove)
            _wait_until_released(released, ctx.adapters.addresses)
            ctx = load()
            if released and not ctx.plan.empty:
                out.write("  keepalived let go of the pair's VIPs as it reloaded; this "
                          "balancer holds them itself now:\n")
            report = execute(ctx.plan, ctx.adapters, listen=takeover) \
                if not ctx.plan.empty else None
    if args.remove:
        remove_runtime_dirs(args.root, cluster.name)
    if report is None:
        out.write(format_plan(ctx.plan) + "\n")
    else:
        _print_report(ctx, report, out, args.remove)
    for line in describe_drains(ctx, time.time()):
        out.write(f"  {line}\n")
    if ctx.plan.deferred:
        out.write(f"{DEFERRED_MARK}: " + "; ".join(str(c).strip() for c in ctx.plan.deferred)
                  + "\n")
    held = report.held if report is not None else {}
    code = 0
    if ctx.desired.keepalived is not None:
        try:
            code = check_keepalived_table(ctx, out, waited=changed)
        except ApplyError as exc:
            if held:  # both failures are said
                raise ApplyError(exc.operation, exc.obj,
                                 f"{exc.reason}\n  and {held_elsewhere_error(held)}") from None
            raise
    if held:
        raise held_elsewhere_error(held)
    if ctx.drains and not args.remove:
        forget_weights_of_the_gone(ctx)
    return code


def forget_weights_of_the_gone(ctx):
    """The drain record kept the mh weight of each drained real server; one
    that has left the file, and that keepalived's config no longer keeps
    for its connections either, is deleted from the table, and has none any
    more.  Decided from the config applied, not the kernel's table: a
    keepalived reload deletes it only moments after apply is done."""
    from lbctl.records.drains import without_weights_of_the_gone, write_drains

    record = without_weights_of_the_gone(ctx.drains, ctx.cluster, ctx.desired.draining)
    if record != ctx.drains:
        write_drains(ctx.adapters.files, ctx.cluster.name, record)


def _peer_takeover_seconds(plan):
    """How long the ARP Probes for VIPs keepalived has just let go of wait
    for an answer: a pair's peer that still runs takes them over at once on
    keepalived's priority-0 advert, or, should that be lost, once it has
    missed three adverts and its skew (under one more).  The advert interval
    is the old pair's, from the keepalived config this apply replaces."""
    import re

    from lbctl.config.model import Vrrp

    found = re.search(r"^\s*advert_int\s+([0-9.]+)\s*$", plan.pair_config_left or "",
                      re.MULTILINE)
    advert = float(found[1]) if found else Vrrp.advert_interval
    return 4 * advert + 1


def vips_the_reload_drops(ctx):
    """The VIPs keepalived deletes as it reloads this plan's config: those of
    a VRRP instance the new config no longer has (a pair become one
    balancer), which this balancer holds itself from now on.  The plan was
    made while keepalived still held them, so it adds none.  keepalived
    runs such an instance if its config on disk has one, or, where an
    earlier apply wrote the new config and stopped before the reload, if it
    holds the pair's anchor as master."""
    daemon = ctx.desired.keepalived
    reloads = any(c.kind == Kind.KEEPALIVED and c.action == CHANGE for c in ctx.plan.changes)
    if daemon is None or not ctx.desired.addresses or not reloads:
        return set()
    conf = next((c for c in ctx.plan.changes if c.kind == Kind.FILE and c.key == daemon.config),
                None)
    if not (conf is not None and conf.old is not None and "vrrp_instance" in conf.old.content
            or _holds_the_anchor(ctx)):
        return set()
    return set(ctx.desired.addresses) & ctx.observed.addresses


def _holds_the_anchor(ctx):
    """Whether keepalived holds, as a pair's master, the anchor of this
    cluster's VRRP instance (a file of mode ecmp has none)."""
    from ipaddress import IPv4Address

    from lbctl.render.keepalived import vrrp_anchor

    if ctx.cluster.vrrp is None:
        return False
    anchor = IPv4Address(vrrp_anchor(ctx.cluster))
    return (anchor, 32, "lo") in ctx.adapters.addresses.list()


def _bridged(ctx, released):
    """The plan, with the VIPs keepalived is about to let go of held on lo
    meanwhile: from keepalived's reload until this balancer has asked the
    LAN (ARP Probes, for as long as a peer would take to take them over)
    and added them to its interface, they stay local here, so IPVS goes on
    taking their packets, and the balancer answers ARP for them where
    arp_ignore is 0 (the kernel's default); a client that has its MAC
    cached sends to it either way.  They are added with the plan's other
    changes, after keepalived has tested its config and just before it
    reloads, and are in the ownership record first: the plan after the
    reload removes them, and so does the next apply should this one stop
    before.  (A copy left on lo by such a stop stays until then: this
    plan does not remove it.)"""
    if not released:
        return ctx.plan
    from dataclasses import replace

    from lbctl.engine.plan import ADD, REMOVE
    from lbctl.state import Address

    bridge = {Address(vip.ip, "lo") for vip in released}
    kept = [c for c in ctx.plan.changes
            if not (c.kind == Kind.ADDRESS and c.action == REMOVE and c.key in bridge)]
    adds = [Change(ADD, Kind.ADDRESS, address, note=" (until this balancer holds it on its "
                   "interface)")
            for address in sorted(bridge - ctx.observed.addresses, key=lambda a: a.ip)]
    return replace(ctx.plan, changes=adds + kept, owned_before=replace(
        ctx.plan.owned_before, addresses=ctx.plan.owned_before.addresses | bridge),
        owned_after=replace(ctx.plan.owned_after,
                            addresses=ctx.plan.owned_after.addresses | bridge))


def _wait_until_released(vips, addresses, patience=15.0, clock=time.monotonic,
                         sleep=time.sleep):
    """Until keepalived has deleted `vips` (Addresses).  Should it still hold
    them after `patience`, taking them now would plan nothing (they are
    there) and keepalived would delete them later, leaving the balancer
    without VIPs: that is an error, which the next apply converges from."""
    from lbctl.state import Address

    deadline = clock() + patience
    while held := vips & {Address(ip, ifname, prefix)
                          for ip, prefix, ifname in addresses.list()}:
        if clock() >= deadline:
            raise ApplyError("take over", ", ".join(sorted(str(a) for a in held)),
                             f"keepalived still held them {patience:g}s after its reload "
                             "without the pair's VRRP instance; run apply again once it has "
                             "let go of them")
        sleep(0.2)


def _print_report(ctx, report, out, removed=False):
    done = "removed from this node" if removed else "applied"
    out.write(f"{ctx.plan.role} {ctx.node} of cluster {ctx.cluster.name}: {done}\n")
    for line in report.done:
        out.write(f"  {line}\n")
    for warning in report.warnings:
        out.write(f"  ! {warning}\n")
    for change in report.pending:
        out.write(f"  ~ real server {change.key} draining: weight 0, connections "
                  "remain; a later apply deletes it once idle (or --force)\n")
    if report.pending:
        # For apply --all: these workers keep their VIPs until the drain ends.
        out.write(f"{DRAINING_MARK}: "
                  + " ".join(sorted({str(c.key.address) for c in report.pending})) + "\n")
    out.write(f"{report.writes} write(s).\n")


def _timeout_drift(ctx, waited, patience=5.0):
    """keepalived sets the file's timeouts as its checker process (re)starts,
    which after a reload signal takes a moment; give it that before naming drift."""
    from lbctl.status.health import timeout_drift

    deadline = time.monotonic() + (patience if waited else 0)
    while True:
        drift = timeout_drift(ctx.cluster, ctx.adapters.ipvs.timeouts())
        if not drift or time.monotonic() >= deadline:
            return drift
        time.sleep(0.2)


def check_keepalived_table(ctx, out, waited):
    """After keepalived (re)starts, wait for its IPVS table; then name any drift."""
    from lbctl.status.health import describe_health, settle_seconds, wait_for_ipvs

    keepalived = ctx.adapters.daemons[KEEPALIVED]
    layout = keepalived.layout

    def table(timeout):
        return wait_for_ipvs(ctx.cluster, layout.real(layout.state_dir), ctx.adapters.ipvs.dump,
                             timeout, draining=ctx.desired.draining, drained=ctx.desired.drained)

    problems, unchecked, reported = table(settle_seconds(ctx.cluster) if waited else 0)
    if problems and not waited:
        # The config on disk is as it should be, yet the table is not: a reload
        # that never ran (an apply or drain cut short after writing the config)
        # left keepalived on its old config.  A reload compares the two and
        # applies the difference; what still differs after it is reported.
        out.write("  keepalived's table differs from its config: reloading keepalived\n")
        keepalived.reload()
        note_loaded(ctx.adapters.files, ctx.cluster.name, ctx.desired.keepalived)
        waited = True
        problems, unchecked, reported = table(settle_seconds(ctx.cluster))
    if ctx.cluster.ipvs_timeouts:
        problems += _timeout_drift(ctx, waited)
    for line in describe_health(ctx.cluster, reported):
        out.write(f"  health: {line}\n")
    if unchecked:
        out.write(f"  no check has passed yet for {', '.join(unchecked)}: they get no "
                  "traffic until one does\n")
    if problems:
        raise ApplyError("check", "the IPVS table keepalived keeps",
                         "it differs from the file and the current health:\n  "
                         + "\n  ".join(problems))
    out.write("  IPVS matches the file and the current health.\n")
    return 0
