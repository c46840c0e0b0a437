"""What doctor found, and the checks it could not run, as text or JSON."""

import json
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Finding:
    node: str  # the node at fault, by its name in the file
    check: str  # a short stable name: "arp-flux", "vip-not-on-lo", ...
    problem: str  # what is wrong, in a sentence
    evidence: str  # what was read or heard that shows it
    fix: str  # the exact command or file key that mends it


@dataclass(frozen=True)
class NotRun:
    check: str
    why: str


def merge(findings):
    """One finding per node, check and fix: the same fault seen twice (from the
    wire and on the node, or for two VIPs) is shown once, with all the
    evidence.  Findings whose fixes differ (two VIPs to add) stay apart."""
    merged = {}
    for f in findings:
        key = (f.node, f.check, f.fix)
        if key not in merged:
            merged[key] = f
        elif f.evidence not in merged[key].evidence.split("; "):
            merged[key] = replace(merged[key], evidence=f"{merged[key].evidence}; {f.evidence}")
    return list(merged.values())


def table_findings(cluster_name, tables):
    """Findings for the services the ECMP balancers fill their mh or sh
    tables for differently ({balancer: {service label: table digest}})."""
    by_service = {}
    for node, digests in tables.items():
        for label, digest in digests.items():
            if isinstance(label, str) and isinstance(digest, str):  # a node's JSON
                by_service.setdefault(label, {})[node] = digest
    found = []
    for label, by_node in sorted(by_service.items()):
        if len(set(by_node.values())) < 2:
            continue
        found.append(Finding(
            ", ".join(sorted(by_node)), "table-differs",
            f"the balancers fill the table of {label} differently (its real servers' order "
            "in the kernel's list, their weights or the scheduler's flags): a flow the "
            "router moves between them may reach another worker",
            "table digests: " + ", ".join(f"{n} {d}" for n, d in sorted(by_node.items())),
            "on each balancer whose `lbctl plan` warns that its kernel lists a service's "
            "real servers otherwise than a start would, one at a time: `sudo lbctl "
            f"drain-balancer NAME`, `sudo systemctl restart lbctl-{cluster_name}-keepalived`, "
            "and `sudo lbctl undrain-balancer NAME` once `lbctl status` shows its workers up "
            "(a start lists them in the file's order; undrain drained workers first, as a "
            "worker at weight 0 when keepalived starts gets no slots).  Flows the router "
            "moves while the balancers still differ may reach another worker"))
    return found


def format_text(cluster, where, findings, not_run, unchecked=(), asked=None):
    """`asked`: how many nodes doctor --all asked, and `unchecked` those it
    could not check; None for one node's own doctor."""
    lines = [f"doctor: cluster {cluster}, run on {where}"]
    for f in findings:
        lines += [f"{f.node}: {f.check}: {f.problem}",
                  f"  evidence: {f.evidence}",
                  f"  fix: {f.fix}"]
    for n in not_run:
        lines.append(f"not run: {n.check}: {n.why}")
    count = len(findings)
    found = "no problems found" if not count else \
        f"{count} problem{'s' if count != 1 else ''} found"
    if asked is not None:
        lines.append(f"checked {asked - len(unchecked)} of {asked} node(s)"
                     + (f"; could not check {', '.join(unchecked)}" if unchecked else ""))
        if unchecked:
            # Not an all-clear: the nodes that were not checked may have any problem.
            found += f" on the {asked - len(unchecked)} node(s) checked"
    lines.append(found)
    return "\n".join(lines) + "\n"


def format_json(cluster, where, findings, not_run, tables=None):
    """`tables`: an ECMP balancer's {service label: table digest} of its
    mh and sh services, which doctor --all compares between balancers."""
    report = {"cluster": cluster, "run_on": where, "findings": [asdict(f) for f in findings],
              "not_run": [asdict(n) for n in not_run]}
    if tables is not None:
        report["tables"] = tables
    return json.dumps(report, indent=2) + "\n"
