import sys
import time

from lbctl.config import load_cluster
from lbctl.status.render import describe_drains
from lbctl.errors import EXIT_CHANGES
from lbctl.engine.node import load_node
from lbctl.engine.plan import FINGERPRINT_MARK, fingerprint, format_plan


def run(args, out):
    ctx = load_node(args.file, args.node, args.root, force=args.force, remove=args.remove,
                    cluster=load_cluster(args.file), read_only=True)
    out.write(format_plan(ctx.plan) + "\n")
    if getattr(args, "fingerprint", False):
        sys.stderr.write(f"{FINGERPRINT_MARK}: {fingerprint(ctx.plan)}\n")
    for line in describe_drains(ctx, time.time()):
        out.write(line + "\n")
    if args.detailed_exitcode and not ctx.plan.empty:
        return EXIT_CHANGES
    return 0
