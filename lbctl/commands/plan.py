from lbctl.node import load_node
from lbctl.plan import format_plan


def run(args, out):
    ctx = load_node(args.file, args.node, args.root, force=args.force)
    out.write(format_plan(ctx.plan) + "\n")
    if args.detailed_exitcode and not ctx.plan.empty:
        return 2
    return 0
