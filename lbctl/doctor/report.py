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


def format_text(cluster, where, findings, not_run):
    lines = [f"doctor: cluster {cluster}, run on {where}"]
    for f in findings:
        lines += [f"{f.node}: {f.check}: {f.problem}",
                  f"  evidence: {f.evidence}",
                  f"  fix: {f.fix}"]
    for n in not_run:
        lines.append(f"not run: {n.check}: {n.why}")
    count = len(findings)
    lines.append("no problems found" if not count else
                 f"{count} problem{'s' if count != 1 else ''} found")
    return "\n".join(lines) + "\n"


def format_json(cluster, where, findings, not_run):
    return json.dumps({"cluster": cluster, "run_on": where,
                       "findings": [asdict(f) for f in findings],
                       "not_run": [asdict(n) for n in not_run]}, indent=2) + "\n"
