"""status --all: one view of the cluster, from every node that answers."""

import json

from lbctl.config import load_cluster
from lbctl.errors import EXIT_UNCHECKED
from lbctl.remote.blocks import progress
from lbctl.remote.fleet import select
from lbctl.remote.ssh import run_on_each
from lbctl.remote.view import cluster_report, format_cluster, report_json

STATUS_TIMEOUT = 300  # seconds: a node that takes longer is shown as not answering


def run(args, out):
    cluster = load_cluster(args.file)
    selected = select(cluster, args.node)
    progress(f"asking {len(selected)} node(s) ...")
    flags = ["--no-drift"] if args.no_drift else []
    outcomes = run_on_each(selected, lambda t: ["status", "-", "--node", t.node, "--json", *flags],
                           cluster.text, args.ssh_config, timeout=STATUS_TIMEOUT)
    report = cluster_report(cluster, selected, outcomes)
    out.write((json.dumps(report_json(report), indent=2) if args.json else format_cluster(cluster, report))
              + "\n")
    # Every node is shown; the exit status says whether every node answered.
    return EXIT_UNCHECKED if any(entry["error"] for entry in report["nodes"].values()) else 0
