"""One cluster view from every node's `status --json`: names, not only addresses."""

import json
import time


def node_report(outcome):
    """{"reachable", "error", "status", "drift"} for one node's status outcome."""
    problem = outcome.problem()
    if problem is None and outcome.returncode != 0:
        problem = outcome.stderr.strip() or f"lbctl exited {outcome.returncode}"
    if problem is not None:
        return {"reachable": not outcome.unreachable, "error": problem}
    try:
        status = json.loads(outcome.stdout)
    except ValueError:
        return {"reachable": True, "error": "lbctl status printed something other than JSON"}
    return {"reachable": True, "error": None, "status": status,
            "drift": status.pop("drift", None), "drift_error": status.pop("drift_error", None)}


def cluster_report(cluster, selected, outcomes):
    nodes = {}
    for target in selected:
        entry = {"role": target.role, "host": target.host} | node_report(outcomes[target.node])
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
    down = [n for n, e in nodes.items() if e["error"]]
    lines = [f"cluster {cluster.name}: {len(nodes)} node(s)"
             + (f", {len(down)} not reporting ({', '.join(down)})" if down else "")]
    for name, entry in nodes.items():
        head = f"{entry['role']} {name} ({entry['host']})"
        if entry["error"]:
            lines.append(f"{head}: {entry['error']}")
            continue
        status = entry["status"]
        if entry["role"] == "balancer":
            lines += [head + ": " + _vrrp_line(status, cluster.name, now, for_how_long)]
            lines += _table_lines(status, services, workers, cluster.name, now, for_how_long)
        else:
            lines += [head + ": " + _worker_line(status, cluster)]
        lines += _drift_lines(entry)
    return "\n".join(lines)


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
