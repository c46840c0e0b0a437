"""status --all: one view of the cluster, from every node that answers."""

import json

from lbctl.config import load_cluster
from lbctl.errors import EXIT_CHANGES, EXIT_UNCHECKED
from lbctl.remote.blocks import progress
from lbctl.remote.fleet import select
from lbctl.remote.ssh import run_on_each
from lbctl.remote.view import cluster_report, format_cluster, report_json

STATUS_TIMEOUT = 300  # seconds: a node that takes longer is shown as not answering


def run(args, out):
    cluster = load_cluster(args.file)
    selected = select(cluster, args.node)
    progress(f"asking {len(selected)} node(s) ...")
    # Each node's drift is in its JSON: a node asked for its exit code
    # would answer 2, which reads as a failure.
    flags = ["--no-drift"] if args.no_drift else []
    outcomes = run_on_each(selected, lambda t: ["status", "-", "--node", t.node, "--json", *flags],
                           cluster.text, args.ssh_config, timeout=STATUS_TIMEOUT, share=False)
    report = cluster_report(cluster, selected, outcomes)
    out.write((json.dumps(report_json(report), indent=2) if args.json else format_cluster(cluster, report))
              + "\n")
    # Every node is shown; the exit status says whether every node answered.
    # With --detailed-exitcode, drift found comes first, as doctor's findings
    # do: a node powered off must not hide a balancer that drifted.
    answered = [entry["status"] for entry in report["nodes"].values() if not entry["error"]]
    unheard = len(answered) < len(report["nodes"])
    if args.detailed_exitcode:
        if any(status.drift for status in answered):
            return EXIT_CHANGES
        unheard = unheard or any(status.drift is None for status in answered)
    return EXIT_UNCHECKED if unheard else 0
