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
    """{"reachable", "error", "status", "drift"} for one node's status outcome.
    An answer that is not a node's status (`null`, a list, a missing table)
    is an error for that node alone."""
    problem = outcome.problem()
    if problem is None and outcome.returncode != 0:
        problem = outcome.stderr.strip() or f"lbctl exited {outcome.returncode}"
    if problem is not None:
        return {"reachable": not outcome.unreachable, "error": shown(problem[:ERROR_CHARS])}
    try:
        status = json.loads(outcome.stdout)
    except ValueError:
        return {"reachable": True, "error": "lbctl status printed something other than JSON"}
    wrong = _not_a_status(status, role)
    if wrong:
        return {"reachable": True, "error": f"lbctl status answered JSON that is not a node's "
                                            f"status ({wrong})"}
    drift, drift_error = status.pop("drift", None), status.pop("drift_error", None)
    if not (drift is None or isinstance(drift, list)) or not (
            drift_error is None or isinstance(drift_error, str)):
        return {"reachable": True, "error": "lbctl status answered a drift that is not a list "
                                            "of changes"}
    return {"reachable": True, "error": None, "status": status, "drift": drift,
            "drift_error": drift_error}


def _not_a_status(status, role):
    """What is wrong with the shape of a node's `status --json`, or None."""
    if not isinstance(status, dict):
        return f"a JSON {type(status).__name__}, not an object"
    if role == "balancer" and status.get("ipvs_loaded", True) and not isinstance(
            status.get("services"), list):
        return "no list of services"
    if role == "worker" and not (isinstance(status.get("vips_on_lo"), list)
                                 and isinstance(status.get("arp"), dict)):
        return "no VIPs on lo or ARP settings"
    return None


def cluster_report(cluster, selected, outcomes):
    nodes = {}
    for target in selected:
        entry = {"role": target.role, "host": target.host} | node_report(outcomes[target.node],
                                                                         target.role)
        nodes[target.node] = entry
    return {"cluster": cluster.name, "nodes": nodes}


def _names(cluster):
    services = {str(s.key): name for name, s in cluster.services.items()}
    workers = {str(w.address): name for name, w in cluster.workers.items()}
    return services, workers


def format_cluster(cluster, report, now=None):
    from lbctl.health import for_how_long

    now = time.time() if now is None else now
    services, workers = _names(cluster)
    nodes = report["nodes"]
    body, down = [], [n for n, e in nodes.items() if e["error"]]
    for name, entry in nodes.items():
        head = f"{entry['role']} {name} ({entry['host']})"
        if entry["error"]:
            body.append(f"{head}: {entry['error']}")
            continue
        try:
            body += _node_lines(cluster, entry, head, services, workers, now, for_how_long)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            # One node's odd answer costs that node's lines, not the others'.
            body.append(f"{head}: lbctl status answered what this lbctl cannot show "
                        f"({type(exc).__name__}: {shown(str(exc)[:80])})")
            entry["error"] = body[-1].partition(": ")[2]  # and the exit code says so
            down.append(name)
    lines = [f"cluster {cluster.name}: {len(nodes)} node(s)"
             + (f", {len(down)} not reporting ({', '.join(down)})" if down else "")] + body
    return "\n".join(shown(_cut(line)) for line in lines)


def _cut(line):
    return line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]} ... ({len(line)} characters)"


def _node_lines(cluster, entry, head, services, workers, now, for_how_long):
    status = entry["status"]
    if entry["role"] == "balancer":
        lines = [head + ": " + _vrrp_line(status, cluster.name, now, for_how_long)]
        lines += _table_lines(status, services, workers, cluster.name, now, for_how_long)
    else:
        lines = [head + ": " + _worker_line(status, cluster)]
    return lines + _drift_lines(entry)


def _vrrp_line(status, cluster_name, now, for_how_long):
    info = status.get("keepalived", {}).get(cluster_name)
    vrrp = info and info.get("vrrp")
    if vrrp:
        return f"VRRP {vrrp['state']} {for_how_long(now, vrrp['since'])}"
    if not info:
        return "no VRRP (a single balancer run by lbctl)"
    from lbctl.health import without_vrrp

    return without_vrrp(info)


def _table_lines(status, services, workers, cluster_name, now, for_how_long):
    if not status.get("ipvs_loaded", True):
        return ["  IPVS not loaded"]
    health = {(h["service"], h["worker"]): h for h in
              status.get("keepalived", {}).get(cluster_name, {}).get("health", [])}
    lines = []
    for svc in status["services"]:
        name = services.get(svc["service"], "not in the file")
        lines.append(f"  service {name} ({svc['service']}) {svc['scheduler']}: "
                     f"{svc['connections']} connections, {svc['conns_per_s']}/s")
        for rs in svc["real_servers"]:
            worker = workers.get(rs["address"].rpartition(":")[0], "not in the file")
            h = health.get((name, worker))
            seen = "" if not h else "  no health report yet" if h["state"] is None else \
                f"  {h['state']} {for_how_long(now, h['since'])}"
            drained = " drained" if rs.get("drained") else ""
            lines.append(f"    worker {worker} ({rs['address']}) weight {rs['weight']}{drained}"
                         f"  active {rs['active']} inactive {rs['inactive']}{seen}")
    return lines or ["  no IPVS services"]


def _worker_line(status, cluster):
    vips = status.get("vips_on_lo", [])
    arp = status.get("arp", {}).get("all", {})
    ok = arp.get("arp_ignore") == "1" and arp.get("arp_announce") == "2"
    arp_text = " ".join(f"{k}={v}" for k, v in arp.items())
    return (f"VIPs on lo {', '.join(vips) or 'none'}; ARP {arp_text}"
            + ("" if ok else " (direct routing needs arp_ignore=1 arp_announce=2)"))


def _drift_lines(entry):
    if entry.get("drift_error"):
        return [f"  drift: not known: {entry['drift_error']}"]
    drift = entry.get("drift")
    if drift is None:
        return []
    if not drift:
        return ["  drift: none, the node matches the file"]
    return ["  drift from the file (`lbctl apply --all` would make these changes):"] + [
        f"    {line}" for line in drift]
