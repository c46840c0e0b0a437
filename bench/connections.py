"""Listing the connection table: lbctl status --connections against ipvsadm -Lnc.

Fills a private network namespace's IPVS table with 10,000 and then 100,000
connection entries (UDP flows from distinct client ports to a direct-routing
service), and lists each table both ways into a pipe, in the same run.  Prints
time and peak memory side by side, with lbctl's ratio to ipvsadm.  The target:
at most 1.5x ipvsadm's time, and memory that does not grow with the table.

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/connections.py
Machines are noisy (and the lab VM is emulated): compare the ratios.
"""

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lbctl.lab.shell import run
from private_netns import run_benchmark

BALANCER = "10.1.0.1"
VIP = "10.2.0.1"
PORT = 53
WORKERS = ["10.1.1.1", "10.1.1.2", "10.1.1.3"]
CLIENT_PORTS = range(1024, 61024)  # 60,000 per client address


def sh(*argv, **kw):
    return run(list(argv), **kw)


def cluster_file(directory):
    """Names for the table: the service and its workers."""
    spec = {"cluster": "bench", "network": "10.1.0.0/16",
            "balancers": {"lb": {"address": BALANCER, "interface": "bench0"}},
            "workers": {f"w{i}": {"address": a} for i, a in enumerate(WORKERS)},
            "services": {"dns": {"vip": VIP, "routed": True, "port": PORT, "protocol": "udp",
                                 "scheduler": "rr"}}}
    path = Path(directory) / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def fill(start, stop):
    """One UDP datagram from each (client address, port) pair number start..stop-1:
    IPVS keeps an entry for each flow (its UDP timeout, 300 s, outlasts the run)."""
    ports = len(CLIENT_PORTS)
    for n in range(start, stop):
        client, port = f"10.3.0.{n // ports + 1}", CLIENT_PORTS[n % ports]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((client, port))
            sock.sendto(b"q", (VIP, PORT))


def entries():
    with open("/proc/net/ip_vs_conn") as fh:
        return sum(1 for _ in fh) - 1


def listed(argv):
    """(seconds, peak RSS in KiB, bytes written) of a listing into a pipe we drain.
    GNU time measures the memory: a child forked from this Python would count
    the Python's pages as its own high-water mark, even after its exec."""
    with tempfile.NamedTemporaryFile("r") as report:
        start = time.perf_counter()
        proc = subprocess.Popen(["/usr/bin/time", "-o", report.name, "-f", "%M", *argv],
                                stdout=subprocess.PIPE)
        size = 0
        while chunk := proc.stdout.read(1 << 16):
            size += len(chunk)
        proc.wait()
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"bench: {' '.join(argv)} exited {proc.returncode}")
        return seconds, int(report.read().split()[-1]), size


def prepare(largest, balancer_link=True):
    """The UDP service and its workers in this namespace's IPVS, and client
    addresses on lo for `largest` flows.  `balancer_link`: add the
    balancer's link too (a caller that has one of its own passes False)."""
    sh("ip", "link", "set", "lo", "up")
    if balancer_link:
        sh("ip", "link", "add", "bench0", "type", "dummy")
        sh("ip", "address", "add", f"{BALANCER}/16", "dev", "bench0")
        sh("ip", "link", "set", "bench0", "up")
    sh("ip", "address", "replace", f"{VIP}/32", "dev", "lo")
    for i in range(largest // len(CLIENT_PORTS) + 1):
        sh("ip", "address", "replace", f"10.3.0.{i + 1}/32", "dev", "lo")
    sh("ipvsadm", "-A", "-u", f"{VIP}:{PORT}", "-s", "rr")
    for worker in WORKERS:
        sh("ipvsadm", "-a", "-u", f"{VIP}:{PORT}", "-r", f"{worker}:{PORT}", "-g", "-w", "1")


def measure(sizes, repeat):
    """[(entries, command, seconds, peak RSS KiB, bytes)] for each size, the
    table filled up to it and listed each way, the least time of `repeat`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = cluster_file(tmp)
        ways = {
            "ipvsadm -Lnc": ["ipvsadm", "-Lnc"],
            "lbctl status --connections": [sys.executable, "-m", "lbctl", "status",
                                           "--connections", str(path)],
            "lbctl ... --json": [sys.executable, "-m", "lbctl", "status", "--connections",
                                 "--json", str(path)],
        }
        rows = []
        made = 0
        for size in sorted(sizes):
            fill_start = time.perf_counter()
            fill(made, size)
            made = size
            found = entries()
            print(f"table: {found} entries (filled in {time.perf_counter() - fill_start:.1f}s)",
                  file=sys.stderr)
            if found < size:
                sys.exit(f"bench: the table holds {found} entries, not {size}")
            for name, argv in ways.items():
                best = min((listed(argv) for _ in range(repeat)), key=lambda r: r[0])
                rows.append((found, name, *best))
    return rows


def ratios(rows):
    """Each row with its time and memory over ipvsadm's at the same size."""
    peers = {found: (s, rss) for found, name, s, rss, _ in rows if name == "ipvsadm -Lnc"}
    return [(found, name, seconds, rss, seconds / peers[found][0], rss / peers[found][1])
            for found, name, seconds, rss, _size in rows]


def inside(args):
    prepare(max(args.sizes))
    rows = measure(args.sizes, args.repeat)
    print(f"Listing the IPVS connection table into a pipe, best of {args.repeat}, one run")
    print(f"{'entries':>8}  {'command':<28}{'seconds':>9}{'vs peer':>9}{'peak RSS':>11}"
          f"{'vs peer':>9}")
    for found, name, seconds, rss, time_ratio, rss_ratio in ratios(rows):
        print(f"{found:>8}  {name:<28}{seconds:>9.3f}{time_ratio:>8.2f}x"
              f"{rss / 1024:>9.1f}MB{rss_ratio:>8.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    run_benchmark(parser, inside)


if __name__ == "__main__":
    main()
