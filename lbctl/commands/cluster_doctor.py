"""doctor --all: every node's own checks, the LAN asked from one balancer, one report."""

import json

from lbctl.config import load_cluster
from lbctl.errors import EXIT_UNCHECKED
from lbctl.remote.blocks import progress
from lbctl.remote.fleet import select
from lbctl.remote.ssh import run_on_each

DOCTOR_TIMEOUT = 300  # seconds: a node that takes longer is reported as not checked


def run(args, out):
    from lbctl.doctor.report import (
        Finding, NotRun, format_json, format_text, merge, table_findings,
    )

    cluster = load_cluster(args.file)
    selected = select(cluster, args.node)
    # The wire checks from one balancer only: what the LAN answers is the same
    # from every node, and probes from each would only repeat it.
    asker = next((t.node for t in selected if t.node in cluster.balancers), None)
    progress(f"checking {len(selected)} node(s), the LAN from {asker or 'no balancer'} ...")
    outcomes = run_on_each(
        selected, lambda t: ["doctor", "-", "--node", t.node, "--json",
                             *([] if t.node == asker else ["--no-wire"])],
        cluster.text, args.ssh_config, timeout=DOCTOR_TIMEOUT, share=False)
    findings, not_run, unchecked = [], [], []
    tables = {}  # {balancer: {service label: {"order": digest, "weights": digest}}}
    for node, outcome in outcomes.items():
        report, problem = _report(outcome)
        if problem is not None:
            unchecked.append(node)
            not_run.append(NotRun(node, problem))
            continue
        findings += [Finding(**f) for f in report["findings"]]
        if isinstance(report.get("tables"), dict):
            tables[node] = report["tables"]
        not_run += [NotRun(f"{node}: {n['check']}", n["why"]) for n in report["not_run"]
                    if not (n["check"] == "wire" and node != asker)]
    if asker is None:
        not_run.append(NotRun("wire", "no balancer among the nodes asked: the LAN was not probed"))
    elif asker in unchecked:
        others = [t.node for t in selected if t.node != asker]
        not_run.append(NotRun("wire", f"the LAN is probed from {asker}, which could not be "
                              f"checked; to probe it from another balancer: `lbctl doctor "
                              f"{args.file} --all --node {','.join(others)}`"))
    findings = merge(findings + table_findings(cluster.name, tables))
    where = f"every node of the file over SSH, the LAN from {asker}" if asker else \
        "the nodes named, over SSH"
    if args.json:
        out.write(format_json(cluster.name, where, findings, not_run))
    else:
        out.write(format_text(cluster.name, where, findings, not_run, unchecked, len(selected)))
    # Problems found come first; a node that could not be checked is no all-clear either.
    return 1 if findings else EXIT_UNCHECKED if unchecked else 0


def _report(outcome):
    """(doctor's JSON report, None), or (None, why the node was not checked)."""
    problem = outcome.problem()
    if problem is None and outcome.returncode not in (0, 1):
        problem = outcome.stderr.strip() or f"lbctl exited {outcome.returncode}"
    if problem is not None:
        return None, problem
    try:
        return json.loads(outcome.stdout), None
    except ValueError:
        # lbctl's own error (exit 1, like a report with findings) is on stderr.
        return None, outcome.stderr.strip() or "lbctl doctor printed something other than JSON"
