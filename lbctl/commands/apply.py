from lbctl.execute import execute
from lbctl.node import load_node
from lbctl.plan import format_plan


def run(args, out):
    ctx = load_node(args.file, args.node, args.root, force=args.force)
    if ctx.plan.empty:
        out.write(format_plan(ctx.plan) + "\n")
        return 0
    report = execute(ctx.plan, ctx.adapters)
    out.write(f"{ctx.plan.role} {ctx.node} of cluster {ctx.cluster.name}: applied\n")
    for line in report.done:
        out.write(f"  {line}\n")
    for change in report.pending:
        out.write(f"  ~ real server {change.key} draining: weight 0, active connections "
                  "remain; a later apply deletes it once idle (or --force)\n")
    out.write(f"{report.writes} write(s).\n")
    return 0
