"""plan --all: every node's plan in one report."""

from lbctl.config import load_cluster
from lbctl.errors import EXIT_CHANGES, EXIT_UNCHECKED
from lbctl.engine.plan import FINGERPRINT_MARK
from lbctl.remote.blocks import node_block, progress
from lbctl.remote.fleet import select
from lbctl.remote.ssh import run_on_each


def run(args, out):
    cluster = load_cluster(args.file)
    selected = select(cluster, args.node)
    # Each node is asked once: no shared connection to set up and stop.
    pending, failed, _, _ = plan_each(cluster, selected, args, out, share=False)
    out.write(f"changes pending on {', '.join(pending) or 'no node'}"
              + (f"; could not plan on {', '.join(failed)}" if failed else "") + "\n")
    if failed:
        return EXIT_UNCHECKED
    return EXIT_CHANGES if pending and args.detailed_exitcode else 0


def plan_each(cluster, selected, args, out, fingerprints=False, share=True):
    """Print each selected node's plan; ([names with changes pending],
    [names that could not plan], {name: its plan's fingerprint}, [names of
    those that run another lbctl or none]).  apply
    --all shows the same before it asks (`fingerprints=True`), and has each
    node apply only the plan it showed."""
    flags = (["--remove"] if args.remove else []) + (["--force"] if args.force else [])
    progress(f"planning on {len(selected)} node(s) ...")
    outcomes = run_on_each(selected, lambda t: ["plan", "-", "--node", t.node,
                                                "--detailed-exitcode", *flags,
                                                *(["--fingerprint"] if fingerprints else [])],
                           cluster.text, args.ssh_config, share=share)
    pending, failed, found = [], [], {}
    for target in selected:
        outcome = outcomes[target.node]
        # A problem first: an lbctl too old for --expect-version exits 2 as well.
        if outcome.problem() is not None or outcome.returncode not in (0, EXIT_CHANGES):
            failed.append(target.node)
        elif outcome.returncode == EXIT_CHANGES:
            pending.append(target.node)
        out.write(node_block(outcome, "FAILED" if target.node in failed else None,
                             cluster.source) + "\n")
        for line in outcome.stderr.splitlines():
            if line.startswith(FINGERPRINT_MARK + ": "):
                found[target.node] = line.partition(": ")[2].strip()
    wrong = [t.node for t in selected if outcomes[t.node].runs_other_lbctl]
    return pending, failed, found, wrong
