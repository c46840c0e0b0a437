"""The data plane: direct routing through IPVS against proxies on the same balancer.

Builds one balancer, up to eight workers and a client in network namespaces,
and caps the balancer's link and every worker's, both ways, with tc's token
bucket, as a Raspberry Pi's Fast Ethernet port would.  The client's link is
not capped: it stands for all the clients of the Internet.  Then real clients
(ab, at two downloads in flight per worker) fetch a 1 MiB file for a fixed
time:

  direct routing   lbctl apply on every node; requests reach the VIP on the
                   balancer and the workers answer the client themselves
  haproxy          TCP mode (`mode tcp`, round robin) on the balancer
  pen              pen's round robin (-r) on the balancer
  nginx            an HTTP reverse proxy (upstream, round robin) on the balancer

and prints, for each, the throughput the client received, that throughput as a
multiple of the balancer's own link and as a share of the workers' combined
links, and the bytes that reached the balancer for each response byte.  With
direct routing only the requests and the client's ACKs cross the balancer; a
proxy receives every response from a worker and sends it on.

The balancer's CPU per GB served: every node shares the lab's kernel, and
IPVS works in the kernel's packet path, where no process is charged for it.
So the whole machine's CPU time is read for each run and for a run in which
the client fetches from the same workers directly, past the balancer; the
difference per GB served is what the balancer's path cost.

Small pages: the same paths serving a page of a few bytes, where requests per
second, not links, are the limit.

The lab VM is emulated (qemu without KVM), so its CPU, not a 100 Mbit/s link,
would be the limit: every link is scaled down by the same factor (--rate,
10 Mbit/s by default), which keeps the ratios a Pi's links would give.  Run as
    python -m lbctl.lab.vm -- .venv/bin/python bench/dataplane.py
where the kernel has no IPVS.  It prints its section of docs/benchmarks.md
last; `./dev.sh bench` (bench/run.py) puts it in the document.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lbctl.config import load_cluster
from lbctl.lab.topology import BLOB_BYTES, Lab
from lab_apply import apply_everywhere
from plots import data_line, image_link
from report import machine, section

VIP = "192.168.100.10"
BALANCER = "192.168.100.2"
WORKERS = {f"pi{n}": f"192.168.100.{10 + n}" for n in range(1, 9)}
PROXY_PORT = 8080
PROXIES = ("haproxy", "pen", "nginx")


def cluster_spec(workers):
    return {"cluster": "dataplane",
            "balancers": {"lb1": {"address": BALANCER, "interface": "eth0"}},
            "workers": {name: {"address": address} for name, address in WORKERS.items()},
            "services": {"web": {"vip": VIP, "port": 80, "scheduler": "rr",
                                 "workers": list(workers)}}}


# -- links --------------------------------------------------------------------
def cap_links(lab, names, mbit):
    """A token bucket on both ends of each node's veth: what the node sends
    (its eth0) and what it receives (its port on the LAN's bridge)."""
    rate = mbit * 1_000_000 // 8  # bytes/s
    # A burst of 10 ms at the rate, but never less than two full frames.
    tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(max(rate // 100, 3028)),
           "latency", "50ms"]
    for name in names:
        port = f"p{list(lab.nodes).index(name)}"
        lab.sh(name, ["tc", "qdisc", "replace", "dev", "eth0", "root", *tbf])
        subprocess.run(["ip", "netns", "exec", lab.lan, "tc", "qdisc", "replace", "dev", port,
                        "root", *tbf], check=True)


# -- proxies ------------------------------------------------------------------
def proxy_argv(kind, workdir, workers):
    listen = f"{BALANCER}:{PROXY_PORT}"
    backends = [f"{WORKERS[w]}:80" for w in workers]
    if kind == "pen":
        # -f foreground, -r round robin without client tracking, -x connections.
        return ["pen", "-f", "-r", "-x", "1000", listen, *backends]
    if kind == "haproxy":
        conf = workdir / "haproxy.cfg"
        conf.write_text(
            "global\n    maxconn 1000\n"
            "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n"
            "    timeout server 60s\n"
            f"frontend web\n    bind {listen}\n    default_backend workers\n"
            "backend workers\n    balance roundrobin\n"
            + "".join(f"    server {w} {b}\n" for w, b in zip(workers, backends)))
        return ["haproxy", "-db", "-f", str(conf)]
    if kind == "nginx":
        conf = workdir / "nginx.conf"
        conf.write_text(
            f"daemon off;\nworker_processes 1;\npid {workdir}/nginx.pid;\n"
            f"error_log {workdir}/nginx.err;\nevents {{ worker_connections 1024; }}\n"
            "http {\n    access_log off;\n"
            f"    client_body_temp_path {workdir}/nginx-body;\n"
            f"    proxy_temp_path {workdir}/nginx-proxy;\n"
            "    proxy_max_temp_file_size 0;\n"
            "    upstream workers {\n"
            + "".join(f"        server {b};\n" for b in backends)
            + f"    }}\n    server {{\n        listen {listen};\n"
            "        location / { proxy_pass http://workers; }\n    }\n}\n")
        return ["nginx", "-c", str(conf), "-e", str(workdir / "nginx.err")]
    raise ValueError(kind)


def start_proxy(lab, kind, workdir, workers):
    proc = lab.spawn("lb1", proxy_argv(kind, workdir, workers))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: {kind} exited {proc.returncode} at its start")
        if lab.sh("lb1", ["ss", "-Hltn", f"sport = :{PROXY_PORT}"]).stdout.strip():
            return proc
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"bench: {kind} did not listen on port {PROXY_PORT} in 30 s")


# -- measuring ------------------------------------------------------------------
def cpu_seconds():
    """CPU time the whole machine has spent busy, every CPU and context summed."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    # user nice system idle iowait irq softirq steal; guest time is inside user.
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def fetch(lab, urls, concurrency, seconds):
    """{"bytes", "seconds", "complete", "failed"} of one ab per URL, all at once,
    each with `concurrency` requests in flight."""
    argv = ["ab", "-q", "-t", str(seconds), "-n", "1000000", "-c", str(concurrency), "-s", "30"]
    procs = [(url, subprocess.Popen(["ip", "netns", "exec", lab.nodes["client"].netns,
                                     *argv, url], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)) for url in urls]
    found = {"bytes": 0, "seconds": 0.0, "complete": 0, "failed": 0}
    for url, proc in procs:
        out, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise SystemExit(f"bench: ab {url}: {err.strip() or out[-500:]}")

        def field(name, cast=int):
            return cast(re.search(rf"^{name}:\s+([0-9.]+)", out, re.M)[1])

        found["bytes"] += field("Total transferred")
        found["seconds"] = max(found["seconds"], field("Time taken for tests", float))
        found["complete"] += field("Complete requests")
        found["failed"] += field("Failed requests")
    return found


def measure(lab, urls, workers, seconds):
    """Throughput, requests, the balancer's share of the bytes and the
    machine's CPU seconds of clients fetching `urls`, one ab each, with two
    requests in flight per worker between them.  Through the balancer one ab
    fetches the one URL: an ab per worker would cost the emulated machine
    enough CPU to hold the client back at eight workers."""
    concurrency = max(1, 2 * len(workers) // len(urls))
    before = lab.iface_bytes("lb1")[0]
    client_before = lab.iface_bytes("client")[0]
    cpu_before = cpu_seconds()
    got = fetch(lab, urls, concurrency, seconds)
    cpu = cpu_seconds() - cpu_before
    to_balancer = lab.iface_bytes("lb1")[0] - before
    to_client = lab.iface_bytes("client")[0] - client_before
    return {"rate": got["bytes"] / got["seconds"], "complete": got["complete"],
            "failed": got["failed"], "requests_per_s": got["complete"] / got["seconds"],
            "balancer_share": to_balancer / max(to_client, 1),
            "cpu_per_gb": cpu / max(got["bytes"], 1) * 1e9}


def direct_urls(workers, page):
    """The workers' own addresses: the client past the balancer."""
    return [f"http://{WORKERS[w]}/{page}" for w in workers]


def apply(lab, path, nodes):
    for node in nodes:
        done = lab.lbctl(node, "apply", str(path), "--force")
        if done.returncode != 0:
            raise SystemExit(f"bench: apply on {node}: {done.stdout}{done.stderr}")


# -- report ---------------------------------------------------------------------
def balancer_cpu(m, direct):
    """The balancer path's CPU seconds per GB: the machine's, less what the
    same workers and client spent per GB without the balancer."""
    return None if direct is None else m["cpu_per_gb"] - direct["cpu_per_gb"]


def table(rows, link_rate, direct):
    lines = ["| path | workers | MB/s at the client | x balancer link | "
             "of workers' links | balancer received per response byte | "
             "balancer CPU s per GB | requests (failed) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path, count, m in rows:
        cpu = balancer_cpu(m, direct.get(count))
        lines.append(f"| {path} | {count} | {m['rate'] / 1e6:.2f} | {m['rate'] / link_rate:.2f}x"
                     f" | {m['rate'] / (count * link_rate):.0%} | {m['balancer_share']:.2%} | "
                     f"{'' if cpu is None else f'{cpu:.1f}'} | "
                     f"{m['complete']} ({m['failed']}) |")
    return "\n".join(lines)


def direct_table(direct):
    lines = ["| workers | MB/s at the client | machine CPU s per GB | requests (failed) |",
             "| --- | --- | --- | --- |"]
    for count, m in sorted(direct.items()):
        lines.append(f"| {count} | {m['rate'] / 1e6:.2f} | {m['cpu_per_gb']:.1f} | "
                     f"{m['complete']} ({m['failed']}) |")
    return "\n".join(lines)


def small_table(small):
    lines = ["| path | workers | requests/s | x direct routing | requests (failed) |",
             "| --- | --- | --- | --- | --- |"]
    dr = next((m for path, _, m in small if path == "direct routing"), None)
    for path, count, m in small:
        ratio = "" if dr is None else f"{m['requests_per_s'] / dr['requests_per_s']:.2f}x"
        lines.append(f"| {path} | {count} | {m['requests_per_s']:.1f} | {ratio} | "
                     f"{m['complete']} ({m['failed']}) |")
    return "\n".join(lines)


def summary(rows, link_rate, direct):
    dr = {count: m for path, count, m in rows if path == "direct routing"}
    lines = []
    for count in sorted({c for p, c, _ in rows if p != "direct routing"}):
        proxies = {p: m for p, c, m in rows if c == count and p != "direct routing"}
        best = max(proxies, key=lambda p: proxies[p]["rate"])
        if count in dr:
            lines.append(f"- With {count} workers, direct routing moved "
                         f"{dr[count]['rate'] / proxies[best]['rate']:.2f}x the best proxy "
                         f"({best}); target 2.5x or more.")
        if count in dr and count in direct:
            cheapest = min(proxies, key=lambda p: balancer_cpu(proxies[p], direct[count]))
            lines.append(f"- With {count} workers, the balancer's path cost "
                         f"{balancer_cpu(dr[count], direct[count]):.1f} CPU s per GB with direct "
                         f"routing, {balancer_cpu(proxies[cheapest], direct[count]):.1f} with "
                         f"the cheapest proxy ({cheapest}).")
    top = max(dr)
    m = dr[top]
    lines.append(f"- With {top} workers, direct routing reached {m['rate'] / link_rate:.2f}x "
                 f"the balancer's own link, {m['rate'] / (top * link_rate):.0%} of the "
                 f"workers' combined links (targets: 6x and 90% with 8 workers), with the "
                 f"balancer receiving {m['balancer_share']:.2%} of the response bytes "
                 "(target 3% or less).")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10, help="each link's Mbit/s (default 10)")
    parser.add_argument("--seconds", type=int, default=15, help="each measurement's length")
    parser.add_argument("--workers", default="1,2,3,4,6,8",
                        help="worker counts for direct routing (default 1,2,3,4,6,8)")
    parser.add_argument("--proxy-workers", default="3,8",
                        help="worker counts for the proxies (default 3,8)")
    parser.add_argument("--proxies", default=",".join(PROXIES))
    parser.add_argument("--small-seconds", type=int, default=10,
                        help="each small-page measurement's length")
    args = parser.parse_args()
    dr_counts = sorted(int(n) for n in args.workers.split(","))
    proxy_counts = sorted(int(n) for n in args.proxy_workers.split(",") if n)
    proxies = [p for p in args.proxies.split(",") if p]
    unknown = set(proxies) - set(PROXIES)
    if unknown or max(dr_counts + proxy_counts) > len(WORKERS) or min(dr_counts) < 1:
        parser.error(f"proxies are {', '.join(PROXIES)}; workers 1 to {len(WORKERS)}")
    link_rate = args.rate * 1_000_000 / 8
    used = list(WORKERS)[:max(dr_counts + proxy_counts)]

    workdir = Path(tempfile.mkdtemp(prefix="lbctl-bench-", dir="/run"))
    every = workdir / "all.yaml"
    every.write_text(yaml.safe_dump(cluster_spec(used), sort_keys=False))
    rows, direct, small = [], {}, []
    lab = Lab(load_cluster(every), every, prefix="dp")
    # Workers the run does not use are left out of the lab.
    for name in set(WORKERS) - set(used):
        del lab.nodes[name]
    try:
        lab.build()
        cap_links(lab, ["lb1", *used], args.rate)
        # Every used worker holds the VIP from the start; the balancer then
        # takes each count of them in turn.
        apply_everywhere(lab, every)
        print(f"links capped at {args.rate} Mbit/s both ways; {args.seconds} s per figure; "
              f"{BLOB_BYTES >> 20} MiB downloads, two in flight per worker", flush=True)
        small_count = next((c for c in proxy_counts if c in dr_counts), dr_counts[0])
        for count in dr_counts:
            path = workdir / f"dr-{count}.yaml"
            path.write_text(yaml.safe_dump(cluster_spec(used[:count]), sort_keys=False))
            apply(lab, path, ["lb1"])
            m = measure(lab, [f"http://{VIP}/blob"], used[:count], args.seconds)
            rows.append(("direct routing", count, m))
            print(table(rows[-1:], link_rate, direct).splitlines()[-1], flush=True)
        # The small pages and the CPU column's baselines come after every
        # direct-routing download figure, so that none can weigh on one.
        apply(lab, workdir / f"dr-{small_count}.yaml", ["lb1"])
        small.append(("direct routing", small_count,
                      measure(lab, [f"http://{VIP}/index.html"], used[:small_count],
                              args.small_seconds)))
        for count in proxy_counts:
            direct[count] = measure(lab, direct_urls(used[:count], "blob"), used[:count],
                                    args.seconds)
        for kind in proxies:
            for count in proxy_counts:
                proc = start_proxy(lab, kind, workdir, used[:count])
                try:
                    url = f"http://{BALANCER}:{PROXY_PORT}"
                    m = measure(lab, [f"{url}/blob"], used[:count], args.seconds)
                    if count == small_count:
                        small.append((kind, count, measure(lab, [f"{url}/index.html"],
                                                           used[:count], args.small_seconds)))
                finally:
                    proc.terminate()
                    proc.wait(timeout=10)
                    lab.nodes["lb1"].processes.remove(proc)
                rows.append((kind, count, m))
                print(table(rows[-1:], link_rate, direct).splitlines()[-1], flush=True)
    finally:
        lab.teardown()
        shutil.rmtree(workdir, ignore_errors=True)
    text = (f"## Data plane: direct routing against proxies\n\n"
            f"`bench/dataplane.py`, {machine()}.  Every link (the balancer's and each "
            f"worker's) capped at {args.rate} Mbit/s both ways, the client's not; "
            f"{args.seconds} s of 1 MiB downloads per figure, two in flight per worker.  "
            "The balancer's CPU per GB: the whole machine's busy CPU time per GB served, "
            "less the same for the client fetching from the same workers directly (below); "
            "every node shares one emulated kernel, and IPVS works in its packet path, "
            "where no process is charged for it.  The emulated machine's CPU time "
            "varies from run to run by tens of seconds per GB, which is as much as direct "
            "routing's path costs: read its figure as near zero, against a proxy's.\n\n"
            f"{table(rows, link_rate, direct)}\n\n{summary(rows, link_rate, direct)}\n\n"
            + image_link("bench/dataplane.py", "throughput against workers") + "\n\n"
            "The client past the balancer, fetching from each worker's own address "
            "(the baseline of the CPU column):\n\n"
            f"{direct_table(direct)}\n\n"
            f"Small pages: each worker's index page, a line of text, {args.small_seconds} s "
            f"per figure, two requests in flight per worker; here the emulated CPU, not the "
            f"links, is the limit.\n\n{small_table(small)}")
    print(data_line("bench/dataplane.py", {"link_rate": link_rate, "rows": rows}), flush=True)
    print("\n" + section("bench/dataplane.py", text), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
