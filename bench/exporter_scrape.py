"""One Prometheus scrape: lbctl exporter against node_exporter's ipvs collector.

Programs S services x R real servers (default 1000 x 10) into IPVS in a
private network namespace with ipvsadm-restore, applies the matching cluster
file with lbctl (so the balancer has its saved copy, as a real one does), then
runs both exporters on loopback and scrapes each in turn:

  lbctl exporter            names, health, drains, weights, drift (a whole plan)
  node_exporter --collector.ipvs only   the kernel's per-real-server counters

For each scrape it prints the wall time, the CPU time the exporter process
spent on it, and the exporter's resident memory after it, with lbctl's ratio
to node_exporter.  The first lbctl scrape works drift out; the later ones
reuse it (--drift-every), as scrapes every 15 s would.

Needs a kernel with IPVS and `apt install prometheus-node-exporter`; elsewhere
run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/exporter_scrape.py
Machines are noisy (and the lab VM is emulated): compare the ratios.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ipvs_apply import BALANCER, cluster_file, restore_rules
from lbctl.lab.shell import run
from private_netns import run_benchmark

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
LBCTL_PORT, PEER_PORT = 9588, 9100
TICKS = os.sysconf("SC_CLK_TCK")


def sh(*argv, **kw):
    return run(list(argv), **kw)


def cpu_seconds(pid):
    """User plus system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wait_listening(port, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench: an exporter exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"bench: nothing listens on port {port}")


def scrape(port, proc):
    """(wall seconds, CPU seconds of the exporter, its RSS in MB after, bytes)."""
    before = cpu_seconds(proc.pid)
    start = time.perf_counter()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=300).read()
    wall = time.perf_counter() - start
    return wall, cpu_seconds(proc.pid) - before, rss_mb(proc.pid), len(body)


def start(argv):
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def inside(args):
    if not os.access(NODE_EXPORTER, os.X_OK):
        sys.exit(f"bench: {NODE_EXPORTER} is missing: apt install prometheus-node-exporter")
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "bench0", "type", "dummy")
    sh("ip", "address", "add", f"{BALANCER}/16", "dev", "bench0")
    sh("ip", "link", "set", "bench0", "up")
    tmp = tempfile.mkdtemp(prefix="lbctl-bench-")
    procs = []
    try:
        sh("ipvsadm-restore", input=restore_rules(args.services, args.reals))
        path = cluster_file(args.services, args.reals, tmp)
        root = Path(tmp) / "root"
        root.mkdir()  # apply writes only below an existing root
        sh(sys.executable, "-m", "lbctl", "apply", str(path), "--node", "lb", "--root", str(root))
        lbctl = start([sys.executable, "-m", "lbctl", "exporter", "--root", str(root),
                       "--listen", f"127.0.0.1:{LBCTL_PORT}", "--drift-every", "3600"])
        peer = start([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{PEER_PORT}",
                      "--collector.disable-defaults", "--collector.ipvs"])
        procs += [lbctl, peer]
        rows = []
        for name, port, proc in (("lbctl exporter", LBCTL_PORT, lbctl),
                                 ("node_exporter ipvs", PEER_PORT, peer)):
            started = time.perf_counter()
            wait_listening(port, proc)  # the first scrape: lbctl works its drift out here
            first = time.perf_counter() - started
            rows.append((name, "first (with drift)" if proc is lbctl else "first", first,
                         None, rss_mb(proc.pid), None))
            for i in range(args.repeat):
                rows.append((name, f"scrape {i + 2}", *scrape(port, proc)))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    peer_rows = {r[1]: r for r in rows if r[0] == "node_exporter ipvs"}
    print(f"One scrape, {args.services} services x {args.reals} real servers, one run")
    print(f"{'exporter':<20}{'scrape':<20}{'wall s':>8}{'CPU s':>8}{'vs peer':>9}"
          f"{'RSS MB':>8}{'vs peer':>9}{'bytes':>10}")
    for name, label, wall, cpu, rss, size in rows:
        peer = peer_rows.get(label) if name != "node_exporter ipvs" else None
        cpu_ratio = f"{cpu / peer[3]:>8.2f}x" if peer and cpu and peer[3] else f"{'':>9}"
        rss_ratio = f"{rss / peer[4]:>8.2f}x" if peer and peer[4] else f"{'':>9}"
        print(f"{name:<20}{label:<20}{wall:>8.3f}{(cpu or 0):>8.3f}{cpu_ratio}{rss:>8.1f}"
              f"{rss_ratio}{(size or 0):>10}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--reals", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    run_benchmark(parser, inside)


if __name__ == "__main__":
    main()
