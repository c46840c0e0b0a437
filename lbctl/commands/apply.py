from lbctl.execute import execute
from lbctl.node import load_node
from lbctl.plan import format_plan


def run(args, out):
    ctx = load_node(args.file, args.node, args.root, force=args.force)
    report = None
    if not ctx.plan.empty:
        report = execute(ctx.plan, ctx.adapters)
        if report.replan:
            # keepalived stopped and took its VIPs and services: lbctl takes over.
            _print_report(ctx, report, out)
            ctx = load_node(args.file, args.node, args.root, force=args.force)
            report = execute(ctx.plan, ctx.adapters) if not ctx.plan.empty else None
    if report is None:
        out.write(format_plan(ctx.plan) + "\n")
    else:
        _print_report(ctx, report, out)
    if ctx.desired.daemon is not None:
        return _check_keepalived_table(ctx, out, waited=report is not None)
    return 0


def _print_report(ctx, report, out):
    out.write(f"{ctx.plan.role} {ctx.node} of cluster {ctx.cluster.name}: applied\n")
    for line in report.done:
        out.write(f"  {line}\n")
    for change in report.pending:
        out.write(f"  ~ real server {change.key} draining: weight 0, connections "
                  "remain; a later apply deletes it once idle (or --force)\n")
    out.write(f"{report.writes} write(s).\n")


def _timeout_drift(ctx, waited, patience=5.0):
    """keepalived sets the file's timeouts as its checker process (re)starts,
    which after a reload signal takes a moment; give it that before naming drift."""
    import time

    from lbctl.health import timeout_drift

    deadline = time.monotonic() + (patience if waited else 0)
    while True:
        drift = timeout_drift(ctx.cluster, ctx.adapters.ipvs.timeouts())
        if not drift or time.monotonic() >= deadline:
            return drift
        time.sleep(0.2)


def _check_keepalived_table(ctx, out, waited):
    """After keepalived (re)starts, wait for its IPVS table; then name any drift."""
    from lbctl.errors import ApplyError
    from lbctl.health import describe_health, settle_seconds, wait_for_ipvs

    layout = ctx.adapters.keepalived.layout
    timeout = settle_seconds(ctx.cluster) if waited else 0
    problems, unchecked, reported = wait_for_ipvs(
        ctx.cluster, layout.real(layout.state_dir), ctx.adapters.ipvs.dump, timeout,
        draining=ctx.desired.draining)
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
