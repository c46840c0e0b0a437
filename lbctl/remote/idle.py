"""A worker's connections across the balancers of mode ecmp, until it is idle.

The router can move a flow from one balancer to another: a VIP withdrawn
on a failed check, a balancer drained or added.  The balancer the flow
left keeps its entry in the state it last saw, ESTABLISHED for IPVS's tcp
timeout (15 minutes by default), while the connection goes on, and ends,
through the balancer that picked it up (sloppy_tcp).  Counted balancer by
balancer, such an entry held `drain --wait` and rollout for those 15
minutes.  Here an entry that is still open is set aside when another
balancer saw the same connection close after it last saw a packet of it.

That covers a connection whose end another balancer still holds: for
tcp_fin (2 minutes by default) after the client's FIN, 10 s (CLOSE) after
a reset.  Past that, or where the reset was the first packet of it the
other balancer saw (IPVS makes no entry for one), the entry left behind
cannot be told from a quiet connection, and it counts.  Only the cluster's
own services count (a wait without --service gets every service that
holds the worker's address); the others' connections are named apart.
"""

import json
import time
from collections import Counter

from lbctl.config.model import IPVS_TIMEOUTS
from lbctl.remote.blocks import progress
from lbctl.remote.ssh import run_on_each

POLL = 2.0  # seconds between asking the balancers
POLL_LIMIT = 60.0  # the longest one answer may take: past it, that balancer is silent

# Seconds an entry outlives its last packet, by state: the kernel's own
# (net/netfilter/ipvs/ip_vs_proto_tcp.c), but for the three `ipvsadm --set`
# changes, which each balancer reports.
STATE_SECONDS = {"SYN_SENT": 120, "SYN_RECV": 60, "TIME_WAIT": 120, "CLOSE": 10,
                 "CLOSE_WAIT": 60, "LAST_ACK": 30, "LISTEN": 120, "SYNACK": 120}
SET_BY_TIMEOUTS = {"ESTABLISHED": "tcp", "FIN_WAIT": "tcp_fin", "UDP": "udp"}
# TCP entries that keep a worker busy (IPVS counts them as ActiveConn), and
# those that show the connection closing.
OPEN = {"ESTABLISHED", "SYN_SENT", "SYN_RECV", "SYNACK"}
CLOSING = {"FIN_WAIT", "TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK"}


def since_last_packet(entry, timeouts):
    """Seconds since the entry's balancer saw a packet of it (each packet
    sets its timer to the state's whole timeout); None for a state not known
    here.  More time left than the state allows is an entry due but not yet
    reaped, whose count an older kernel printed wrapped: as old as can be."""
    state = entry["state"]
    name = SET_BY_TIMEOUTS.get(state)
    life = timeouts.get(name, IPVS_TIMEOUTS[name]) if name else STATE_SECONDS.get(state)
    if life is None:
        return None
    return life if entry["expires"] > life else life - entry["expires"]


def live_connections(tables):
    """([(balancer, entry)] of the connections that keep a worker busy, each
    once; {balancer: ESTABLISHED entries set aside}).

    `tables`: {balancer: its `status --connections --json`}.  A TCP entry
    that is open is set aside when a closing entry of the same connection,
    on any balancer, saw a packet after it did.  UDP flows count for their
    whole life, as in a drain on one balancer; entries of other protocols
    count as ESTABLISHED ones do there; persistence templates (no client
    port) and the kernel's entries for ICMP errors (state NONE) not at all."""
    entries = {}  # connection: [(balancer, entry, seconds since its last packet)]
    for node, table in tables.items():
        timeouts = table.get("timeouts") or {}
        for entry in table["connections"]:
            if entry["client_port"] == 0 or entry["state"] == "NONE":
                continue
            key = (entry["protocol"], entry["client"], entry["client_port"], entry["vip"],
                   entry["port"])
            known = entry["protocol"] in ("tcp", "udp")  # SCTP's states are its own
            age = since_last_packet(entry, timeouts) if known else None
            entries.setdefault(key, []).append((node, entry, age))
    live, set_aside = [], Counter()
    for found in entries.values():
        closed = min((age for _, entry, age in found
                      if entry["protocol"] == "tcp" and entry["state"] in CLOSING), default=None)
        busy = []
        for node, entry, age in filter(lambda f: _keeps_busy(f[1]), found):
            if entry["protocol"] == "tcp" and closed is not None and closed < age:
                set_aside[node] += entry["state"] == "ESTABLISHED"
            else:
                busy.append((node, entry, age))
        if busy:  # reported where it was seen last
            live.append(min(busy, key=lambda b: -1 if b[2] is None else b[2])[:2])
    return live, +set_aside


def _keeps_busy(entry):
    protocol, state = entry["protocol"], entry["state"]
    return protocol == "udp" or state == "ESTABLISHED" or (protocol == "tcp" and state in OPEN)


def of_cluster(tables, name):
    """(`tables` with only the entries and real servers of cluster `name`'s
    services, {balancer: how many of the others' entries keep the worker
    busy}).  The others (another cluster's services on the same balancers,
    a hand-made one that holds the worker's address) were not drained: their
    weights say nothing of the drain, and their connections go on."""
    ours, others = {}, Counter()
    for node, table in tables.items():
        ours[node] = {**table, "real_servers": [s for s in table["real_servers"]
                                                if s["cluster"] == name]}
        ours[node]["connections"] = []
        for entry in table["connections"]:
            if entry["cluster"] == name:
                ours[node]["connections"].append(entry)
            elif entry["client_port"] != 0 and _keeps_busy(entry):
                others[node] += 1
    return ours, +others


def undone_drains(tables):
    """["WEIGHT on BALANCER"] where the worker has a weight above 0 again."""
    return [f"{server['weight']} on {node}" for node, table in tables.items()
            for server in table["real_servers"] if server["weight"] > 0]


def wait_idle_across(cluster, balancers, worker, service, timeout, ssh_config, out,
                     ask=None, clock=time.monotonic, sleep=time.sleep):
    """Until `worker` has no live connection on any balancer; True if that
    came within `timeout` seconds."""
    started, shown = clock(), None
    # A balancer that hangs (ssh, a stalled node) must not hold a poll past
    # the wait's own end; one answer may take a few seconds, though.
    ask = ask or (lambda: _tables(balancers, worker, service, ssh_config,
                                  min(POLL_LIMIT, max(10.0, timeout - (clock() - started)))))
    names = ", ".join(t.node for t in balancers)
    back = f"`lbctl undrain {worker} FILE --all` puts it back"
    while True:
        tables, silent = ask()
        tables, others = of_cluster(tables, cluster.name)
        waited = clock() - started
        undone = undone_drains(tables)
        if undone:
            out.write(f"{worker} has weight {', '.join(undone)} again: something undid the "
                      "drain (an apply of another file?); not waiting\n")
            out.flush()
            return False
        live, set_aside = live_connections(tables)
        if not live and not silent:
            out.write(f"{worker} is idle on {names} after {waited:.0f}s\n")
            for node, count in sorted(set_aside.items()):
                out.write(f"  {node} still lists {count} ESTABLISHED entr"
                          f"{'y' if count == 1 else 'ies'} of connections that closed through "
                          "another balancer: ipvsadm and status count them as active until "
                          "IPVS's tcp timeout\n")
            _say_others(out, worker, cluster.name, others)
            out.flush()
            return True
        where = Counter(node for node, _ in live)
        now = ", ".join(f"{n} on {node}" for node, n in sorted(where.items()))
        if waited >= timeout:
            if silent:
                out.write(f"{worker}: idle not confirmed after {timeout:g}s: no answer from "
                          f"{', '.join(silent)}; it stays drained ({back})\n")
            else:
                out.write(f"{worker} still has {len(live)} connection(s) after {timeout:g}s "
                          f"({now}); it stays drained ({back})\n")
            _say_others(out, worker, cluster.name, others)
            out.flush()
            return False
        said = f"{len(live)} connection(s)" + (f" ({now})" if now else "") + (
            f"; no answer from {', '.join(silent)}" if silent else "")
        if said != shown:
            progress(f"draining {worker}: {said}")
            shown = said
        sleep(POLL)


def _say_others(out, worker, name, others):
    if others:
        where = ", ".join(f"{n} on {node}" for node, n in sorted(others.items()))
        out.write(f"  {worker} also has connections to services outside cluster {name} "
                  f"({where}), which this drain does not stop\n")


def _tables(balancers, worker, service, ssh_config, timeout):
    """({balancer: its status --connections --json}, ["BALANCER (why)" of
    those that gave no table to use within `timeout` seconds]).  Named from
    the copies the balancers applied, as the drain there was made: a file
    edited since names another service."""
    flags = ["--worker", worker] + (["--service", service] if service else [])
    outcomes = run_on_each(balancers, lambda t: ["status", "--connections", "--json", *flags],
                           "", ssh_config, timeout=timeout)
    tables, silent = {}, []
    for node, outcome in outcomes.items():
        table, why = None, None
        if outcome.returncode != 0:
            said = [line.strip() for line in (outcome.stderr or "").splitlines() if line.strip()]
            why = f"exit {outcome.returncode}" + (f": {said[-1][:120]}" if said else "")
        else:
            try:
                table = json.loads(outcome.stdout)
            except ValueError:
                why = "its answer is not JSON"
        if why is None and not (isinstance(table, dict) and
                                isinstance(table.get("connections"), list)):
            why = "its answer has no connections"
        elif why is None and not isinstance(table.get("real_servers"), list):
            why = "lbctl ran there without root, and read no weights"
        if why is None:
            tables[node] = table
        else:
            silent.append(f"{node} ({why})")
    return tables, silent
