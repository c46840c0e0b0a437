"""Mode ecmp: aggregate throughput through 1, 2 and 3 active balancers.

Builds the routed lab (lbctl.lab.routed): a router running BIRD with
multipath and an L4 hash, the client behind it, three balancers and three
workers on the LAN.  Every balancer's link is capped alike, both ways, with
tc's token bucket, as a Pi's Fast Ethernet port would be; the router's, the
workers' and the client's are not.

With direct routing a balancer carries only what the clients send: the
workers answer them straight through the router.  So the figure that grows
with the balancers is the clients' upload: many connections at once, each
sending as fast as it is taken (bench/tcp_peers.py upload), to a sink on
every worker, through the VIP.  Each figure takes the balancers not in use
out with `lbctl drain-balancer`, so the router spreads the flows over the
rest, and counts what the workers received.

The lab VM is emulated (qemu without KVM), so the links are scaled down
(--rate, 10 Mbit/s by default), which keeps the ratios a Pi's links give.
Run as
    python -m lbctl.lab.vm -- .venv/bin/python bench/ecmp.py
where the kernel has no IPVS.  It prints its section of docs/benchmarks.md
last; `./dev.sh bench ecmp.py` puts it in the document.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from dataplane import cap_links
from lab_apply import apply_everywhere
from lbctl.config import load_cluster
from lbctl.lab.routed import RoutedLab
from report import machine, section

VIP = "10.200.0.10"
PORT = 9000
BALANCERS = {"lb1": "192.168.100.2", "lb2": "192.168.100.5", "lb3": "192.168.100.8"}
WORKERS = {"pi1": "192.168.100.3", "pi2": "192.168.100.4", "pi3": "192.168.100.6"}
HERE = Path(__file__).resolve().parent


def cluster_spec():
    # No BFD and a 9 s hold: this measures throughput, not failure detection,
    # and every figure saturates a balancer's link, where the token bucket's
    # tail drop takes BFD's packets and BGP's keepalives with the rest, and
    # the emulated lab's CPUs are busy.  With BFD at 100 ms a session went
    # down between two figures in a suite run, and the router answered the
    # next uploads "network unreachable".
    # The balancers leave and join through drain-balancer, not through timers.
    return {"cluster": "ecmpbench", "mode": "ecmp",
            "bgp": {"as": 65001, "router": {"address": "192.168.100.1", "as": 65000},
                    "hold": "9s", "keepalive": "3s"},
            "balancers": {name: {"address": address, "interface": "eth0"}
                          for name, address in BALANCERS.items()},
            "workers": {name: {"address": address} for name, address in WORKERS.items()},
            "services": {"upload": {"vip": VIP, "port": PORT, "scheduler": "mh",
                                    "scheduler_flags": ["mh-port"],
                                    "health": {"tcp": {}, "interval": "1s",
                                               "timeout": "500ms", "retries": 1, "rise": 1}}}}


def start_sinks(lab):
    for name in WORKERS:
        proc = subprocess.Popen(["ip", "netns", "exec", lab.nodes[name].netns, sys.executable,
                                 str(HERE / "tcp_peers.py"), "sink", str(PORT)],
                                stdout=subprocess.PIPE, text=True)
        lab.nodes[name].processes.append(proc)
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"bench: the sink on {name} did not start")


def use_balancers(lab, path, count):
    """Only the first `count` balancers offer the VIP, the others drained."""
    for index, name in enumerate(BALANCERS):
        verb = "undrain-balancer" if index < count else "drain-balancer"
        done = lab.lbctl(name, verb, name, str(path), *(["--timeout", "30"]
                                                        if verb == "drain-balancer" else []))
        if done.returncode != 0:
            raise SystemExit(f"bench: {verb} {name}: {done.stdout}{done.stderr}")
    lab.wait_for_next_hops(VIP, list(BALANCERS)[:count], timeout=60)


def received(lab):
    return sum(lab.iface_bytes(name)[0] for name in WORKERS)


def measure(lab, connections, seconds, balancers):
    """(Mbit/s the workers received while the uploads ran, {balancer: its
    share of what the `balancers` in use received from the router})."""
    links = {name: lab.iface_bytes(name)[0] for name in balancers}
    before, start = received(lab), time.monotonic()
    sent = lab.sh("client", [sys.executable, str(HERE / "tcp_peers.py"), "upload", VIP,
                             str(PORT), str(connections), str(seconds)])
    elapsed = time.monotonic() - start
    if int(sent.stdout.split()[-1]) <= 0:
        raise SystemExit("bench: the uploads sent nothing")
    links = {name: lab.iface_bytes(name)[0] - count for name, count in links.items()}
    total = sum(links.values()) or 1
    return ((received(lab) - before) * 8 / elapsed / 1e6,
            {name: count / total for name, count in links.items()})


def table(rows, rate):
    one = rows[0][1] if rows else 0
    lines = ["| balancers | aggregate upload | per balancer's link | vs one balancer | ideal "
             "| carried by each |",
             "|---|---|---|---|---|---|"]
    for count, mbit, shares in rows:
        split = ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
        lines.append(f"| {count} | {mbit:.1f} Mbit/s | {mbit / count / rate:.0%} | "
                     f"{mbit / one:.2f}x | {count}.00x | {split} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10, help="each balancer link's Mbit/s")
    parser.add_argument("--seconds", type=float, default=15, help="each figure's length")
    parser.add_argument("--balancers", default="1,2,3", help="balancer counts (default 1,2,3)")
    parser.add_argument("--connections", type=int, default=24,
                        help="uploads at once (default 24)")
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.balancers.split(","))
    if not counts or min(counts) < 1 or max(counts) > len(BALANCERS):
        parser.error(f"balancer counts run from 1 to {len(BALANCERS)}")
    workdir = Path(tempfile.mkdtemp(prefix="lbctl-bench-", dir="/run"))
    path = workdir / "ecmp.yaml"
    path.write_text(yaml.safe_dump(cluster_spec(), sort_keys=False))
    lab = RoutedLab(load_cluster(path), path, prefix="eb")
    rows = []
    try:
        lab.build(servers=False)
        cap_links(lab, list(BALANCERS), args.rate)
        start_sinks(lab)
        apply_everywhere(lab, path)
        print(f"balancer links capped at {args.rate} Mbit/s both ways; {args.seconds:g} s "
              f"per figure; {args.connections} uploads at once", flush=True)
        for count in counts:
            use_balancers(lab, path, count)
            rows.append((count, *measure(lab, args.connections, args.seconds,
                                         list(BALANCERS)[:count])))
            print(table(rows, args.rate).splitlines()[-1], flush=True)
    finally:
        lab.teardown()
        shutil.rmtree(workdir, ignore_errors=True)
    text = (f"## Mode ecmp: throughput through 1, 2 and 3 balancers\n\n"
            f"`bench/ecmp.py`, {machine()}.  A router running BIRD (multipath, L4 hash) in "
            "front of three balancers, each announcing the VIP over BGP (9 s hold, no BFD: "
            "every figure fills a link), and three workers; "
            f"each balancer's link capped at {args.rate} Mbit/s both ways, no other link "
            f"capped.  {args.connections} uploads at once from the client through the VIP "
            f"for {args.seconds:g} s per figure, counted as the workers received them; the "
            "balancers not in use drained with `lbctl drain-balancer`.  With direct "
            "routing a balancer carries only what the clients send, so uploads are what "
            "its link limits.  A failover pair, one balancer active at a time, carries "
            "what the first row does.\n\n"
            f"{table(rows, args.rate)}")
    print("\n" + section("bench/ecmp.py", text), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
