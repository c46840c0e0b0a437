"""One cluster view from every node's `status --json`: names, not only addresses."""

import json
import time

# What a node prints is shown on this terminal: only printable characters
# from it (escape sequences could move the cursor or retitle the window, a
# newline could start a line that seems to be another node's, and bidi
# controls could reorder what is shown).
ERROR_CHARS = 300  # of a node's own error text shown in its line
LINE_CHARS = 2000  # of any line of the view: a node's endless answer is cut


def shown(text):
    """`text` from a node, safe to print: anything not printable as '?'."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def node_report(outcome, role=None):
    """{"reachable", "error", "status"} for one node's status outcome, its
    status a NodeStatus.  An answer that is not a node's status (`null`, a
    list, a missing table, a wrong type anywhere) is an error for that node
    alone."""
    from lbctl.status.model import NodeStatus, StatusShapeError

    problem = outcome.problem()
    if problem is None and outcome.returncode != 0:
        problem = outcome.stderr.strip() or f"lbctl exited {outcome.returncode}"
    if problem is not None:
        return {"reachable": not outcome.unreachable, "error": shown(problem[:ERROR_CHARS])}
    try:
        status = NodeStatus.from_json(json.loads(outcome.stdout))
    except StatusShapeError as exc:
        return {"reachable": True, "error": "lbctl status answered JSON that is not a node's "
                                            f"status ({shown(str(exc)[:ERROR_CHARS])})"}
    except (ValueError, RecursionError):
        return {"reachable": True, "error": "lbctl status printed something other than JSON"}
    return {"reachable": True, "error": None, "status": status}


def cluster_report(cluster, selected, outcomes):
    nodes = {}
    for target in selected:
        entry = {"role": target.role, "host": target.host} | node_report(outcomes[target.node],
                                                                         target.role)
        nodes[target.node] = entry
    return {"cluster": cluster.name, "nodes": nodes}


def report_json(report):
    """cluster_report() as `status --all --json` prints it: each node's status
    as its `status --json`, its drift beside it."""
    nodes = {}
    for name, entry in report["nodes"].items():
        entry = dict(entry)
        if "status" in entry:
            entry["status"] = entry["status"].to_json()
            entry["drift"] = entry["status"].pop("drift", None)
            entry["drift_error"] = entry["status"].pop("drift_error", None)
        nodes[name] = entry
    return {**report, "nodes": nodes}


def format_cluster(cluster, report, now=None):
    now = time.time() if now is None else now
    from lbctl.status.render import Names

    names = Names.of([cluster])
    services, workers = names.services, names.workers
    nodes = report["nodes"]
    body, down = [], [n for n, e in nodes.items() if e["error"]]
    for name, entry in nodes.items():
        head = f"{entry['role']} {name} ({entry['host']})"
        if entry["error"]:
            body.append(f"{head}: {entry['error']}")
            continue
        body += _node_lines(cluster, entry, head, services, workers, now)
    lines = [f"cluster {cluster.name}: {len(nodes)} node(s)"
             + (f", {len(down)} not reporting ({', '.join(down)})" if down else "")] + body
    lines += _differing_table_lines(cluster, nodes, services)
    return "\n".join(shown(_cut(line)) for line in lines)


def _differing_table_lines(cluster, nodes, services):
    """In mode ecmp the router may move a flow to another balancer mid-stream
    (one joins or leaves), and mh there must send it to the same worker: so
    every balancer must fill its table from the same real servers, in the
    same order, with the same weights."""
    from lbctl.config.model import Mode

    if cluster.mode != Mode.ECMP:
        return []
    digests = {}  # {service label: {balancer: digest}}
    for name, entry in nodes.items():
        if entry["role"] != "balancer" or entry["error"]:
            continue
        for svc in entry["status"].services:
            if svc.fills_a_table:
                digests.setdefault(svc.service, {})[name] = svc.table_digest
    return [f"! service {services.get(label, label)} ({label}): the balancers fill its table "
            "differently (their real servers' order, weights or flags: "
            + ", ".join(f"{node} {digest}" for node, digest in sorted(by_node.items()))
            + "), so a flow moved between them may change worker"
            for label, by_node in sorted(digests.items()) if len(set(by_node.values())) > 1]


def _cut(line):
    return line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]} ... ({len(line)} characters)"


def _node_lines(cluster, entry, head, services, workers, now):
    status = entry["status"]
    if entry["role"] == "balancer":
        lines = [head + ": " + _vrrp_line(status, cluster.name, now)]
        lines += _table_lines(status, services, workers, cluster.name, now)
    else:
        lines = [head + ": " + _worker_line(status)]
    return lines + _drift_lines(status)


def _vrrp_line(status, cluster_name, now):
    from lbctl.status.render import role_line

    info = status.keepalived.get(cluster_name)
    return "no VRRP (a single balancer run by lbctl)" if info is None else role_line(info, now)


def _table_lines(status, services, workers, cluster_name, now):
    from lbctl.status.health import for_how_long

    if not status.ipvs_loaded:
        return ["  IPVS not loaded"]
    info = status.keepalived.get(cluster_name)
    health = {} if info is None else info.health_by_pair()
    lines = []
    for svc in status.services:
        name = services.get(svc.service, "not in the file")
        table = f" table {svc.table_digest}" if svc.fills_a_table else ""
        lines.append(f"  service {name} ({svc.service}) {svc.scheduler}{table}: "
                     f"{svc.connections} connections, {svc.conns_per_s}/s")
        for rs in svc.real_servers:
            worker = workers.get(rs.address.rpartition(":")[0], "not in the file")
            h = health.get((name, worker))
            seen = "" if not h else "  no health report yet" if h.state is None else \
                f"  {h.state} {for_how_long(now, h.since)}"
            drained = " drained" if rs.drained else ""
            lines.append(f"    worker {worker} ({rs.address}) weight {rs.weight}{drained}"
                         f"  active {rs.active} inactive {rs.inactive}{seen}")
    return lines or ["  no IPVS services"]


def _worker_line(status):
    vips = status.vips_on_lo
    arp = status.arp.get("all", {})
    ok = arp.get("arp_ignore") == "1" and arp.get("arp_announce") == "2"
    arp_text = " ".join(f"{k}={v}" for k, v in arp.items())
    return (f"VIPs on lo {', '.join(vips) or 'none'}; ARP {arp_text}"
            + ("" if ok else " (direct routing needs arp_ignore=1 arp_announce=2)"))


def _drift_lines(status):
    if status.drift_error:
        return [f"  drift: not known: {status.drift_error}"]
    if status.drift is None:
        return []
    if not status.drift:
        return ["  drift: none, the node matches the file"]
    return ["  drift from the file (`lbctl apply --all` would make these changes):"] + [
        f"    {line}" for line in status.drift]
