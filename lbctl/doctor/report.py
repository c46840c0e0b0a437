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
    tables for differently ({balancer: {service label: {"members": digest,
    "order": digest, "weights": digest}}}, as each node's JSON tells it)."""
    by_service = {}
    for node, digests in tables.items():
        for label, parts in digests.items():
            if isinstance(label, str) and isinstance(parts, dict) and \
                    all(isinstance(parts.get(p), str) for p in TABLE_PARTS):
                by_service.setdefault(label, {})[node] = parts
    found = []
    for label, by_node in sorted(by_service.items()):
        for part in TABLE_PARTS:
            digests = {node: parts[part] for node, parts in by_node.items()}
            if len(set(digests.values())) > 1:
                found.append(_table_differs(cluster_name, label, part, digests))
                break  # a rebuilt order sets the weights again too
    return found


# What differs, in the order it is mended: the same real servers first,
# then their order (a restart), then their weights.
TABLE_PARTS = ("members", "order", "weights")


def _table_differs(cluster_name, label, part, digests):
    evidence = f"{part} digests: " + ", ".join(f"{n} {d}" for n, d in sorted(digests.items()))
    if part == "members":
        return Finding(
            ", ".join(sorted(digests)), "table-differs",
            f"the balancers hold different real servers for {label}, and fill their tables "
            "differently: a flow the router moves between them may reach another worker",
            evidence,
            "`lbctl status FILE --all` shows each balancer's real servers: a balancer that "
            "missed an apply (`lbctl apply FILE --all`), or a worker the file dropped that one "
            "balancer still holds at weight 0 while it has connections (it goes at the apply "
            "after they end; no restart mends it, keepalived's config still lists it)")
    if part == "order":
        return Finding(
            ", ".join(sorted(digests)), "table-differs",
            f"the balancers list the real servers of {label} in another order in the kernel, "
            "and fill their tables differently: a flow the router moves between them may "
            "reach another worker", evidence,
            "on each balancer whose `lbctl plan FILE` warns that its kernel lists a "
            "service's real servers otherwise than a start would, one at a time: `sudo lbctl "
            "apply FILE` first (an older lbctl wrote keepalived's config in the kernel's "
            "order, and a restart reads the config on disk), then `sudo lbctl drain-balancer "
            f"NAME`, `sudo systemctl restart lbctl-{cluster_name}-keepalived` (a clean stop "
            "deletes keepalived's table, and the start lists the workers in the file's order: "
            "check with `ipvsadm -Ln --nosort`), and `sudo lbctl undrain-balancer NAME` once "
            "`lbctl status` shows its workers up.  Flows the router moves while the balancers "
            "still differ may reach another worker")
    return Finding(
        ", ".join(sorted(digests)), "table-differs",
        f"the balancers list the real servers of {label} alike but with other weights (or "
        "scheduler flags), and fill their tables differently: a flow the router moves "
        "between them may reach another worker", evidence,
        "`lbctl status FILE --all` shows each balancer's weights: a worker drained on one "
        "balancer only (`lbctl undrain WORKER FILE --all`), one failing the health check "
        "from one balancer only (its LAN, its firewall), or a balancer that missed an apply "
        "(`lbctl apply FILE --all`)")


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
