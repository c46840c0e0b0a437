"""Schedulers: which IPVS scheduler to choose when one worker is slower.

Builds one balancer, four workers and eight clients in network namespaces.
The last worker answers late: tc's netem delays everything it sends (its
replies go straight to the clients, so every request it serves waits that
long).  For each scheduler (rr, wrr, lc, wlc, sh and mh by default) lbctl
applies the service with it, then every client runs ab at once against a
small page through the VIP, for a fixed time, and ab's own record of every
request gives the tail latency:

  requests/s     completed requests per second, all clients together
  p50, p99, max  each request's total time, as ab timed it
  slow worker    the share of connections IPVS sent to the slow worker
                 (its counter in `ipvsadm -Ln --stats`)

Eight clients, each from its own address, because sh and mh hash the
client's address: with one client they would send everything to one worker.

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/schedulers.py
The lab VM may be emulated: compare the schedulers, not the absolute figures.
It prints its section of docs/benchmarks.md last.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from lbctl.config import load_cluster
from lbctl.lab.topology import Lab
from lab_apply import apply_everywhere
from plots import data_line, image_link
from report import machine, percentile, section

VIP = "192.168.100.10"
BALANCER = "192.168.100.2"
WORKERS = {f"pi{n}": f"192.168.100.{10 + n}" for n in range(1, 5)}
SLOW = "pi4"
CLIENTS = {f"c{n}": f"192.168.100.{100 + n}" for n in range(1, 9)}
SCHEDULERS = ("rr", "wrr", "lc", "wlc", "sh", "mh")


def cluster_spec(scheduler):
    return {"cluster": "schedulers",
            "balancers": {"lb1": {"address": BALANCER, "interface": "eth0"}},
            "workers": {name: {"address": address} for name, address in WORKERS.items()},
            "services": {"web": {"vip": VIP, "port": 80, "scheduler": scheduler}}}


def connections_per_worker(lab):
    """{worker address: connections scheduled so far} of the VIP's service."""
    out = lab.sh("lb1", ["ipvsadm", "-Ln", "--stats", "--exact", "-t", f"{VIP}:80"]).stdout
    counts = {}
    for line in out.splitlines():
        fields = line.split()
        # "-> ADDRESS:PORT CONNS ...", below the column names' own "->" line.
        if fields[:1] == ["->"] and len(fields) > 2 and fields[2].isdigit():
            counts[fields[1].rsplit(":", 1)[0]] = int(fields[2])
    return counts


def run_clients(lab, workdir, label, concurrency, seconds):
    """Every client's ab at once; (requests, failed, [each request's ms])."""
    procs = {}
    for name in CLIENTS:
        times = workdir / f"{label}-{name}.tsv"
        procs[name] = (times, subprocess.Popen(
            ["ip", "netns", "exec", lab.nodes[name].netns, "ab", "-q", "-t", str(seconds),
             "-n", "1000000", "-c", str(concurrency), "-s", "30", "-g", str(times),
             f"http://{VIP}/index.html"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    complete = failed = 0
    samples = []
    for name, (times, proc) in procs.items():
        out, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise SystemExit(f"bench: ab on {name}: {err.strip() or out[-500:]}")
        complete += int(field(out, "Complete requests"))
        failed += int(field(out, "Failed requests"))
        # ab -g: one line a request after the header; the fifth column is
        # the request's total time in milliseconds.
        samples += [int(line.split("\t")[4]) for line in times.read_text().splitlines()[1:]]
    return complete, failed, samples


def field(ab_output, name):
    for line in ab_output.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].split()[0]
    raise SystemExit(f"bench: ab printed no {name!r}")


def measure(lab, workdir, scheduler, concurrency, seconds):
    before = connections_per_worker(lab)
    complete, failed, samples = run_clients(lab, workdir, scheduler, concurrency, seconds)
    after = connections_per_worker(lab)
    scheduled = {a: after.get(a, 0) - before.get(a, 0) for a in after}
    if not samples:
        raise SystemExit(f"bench: {scheduler}: no request completed")
    return {"rate": complete / seconds, "complete": complete, "failed": failed,
            "p50": percentile(samples, 0.5), "p99": percentile(samples, 0.99),
            "max": max(samples),
            "slow_share": scheduled.get(WORKERS[SLOW], 0) / max(sum(scheduled.values()), 1)}


def table(rows):
    lines = ["| scheduler | requests/s | p50 ms | p99 ms | max ms | to the slow worker | "
             "requests (failed) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for scheduler, m in rows:
        lines.append(f"| {scheduler} | {m['rate']:.1f} | {m['p50']} | {m['p99']} | {m['max']} | "
                     f"{m['slow_share']:.0%} | {m['complete']} ({m['failed']}) |")
    return "\n".join(lines)


def summary(rows):
    by_name = dict(rows)
    fastest = max(by_name, key=lambda s: by_name[s]["rate"])
    tightest = min(by_name, key=lambda s: by_name[s]["p99"])
    lines = [f"- Most requests: {fastest} ({by_name[fastest]['rate']:.1f}/s); "
             f"lowest p99: {tightest} ({by_name[tightest]['p99']} ms)."]
    fair = 1 / len(WORKERS)
    for scheduler, m in rows:
        lines.append(f"- {scheduler}: {m['rate'] / by_name[fastest]['rate']:.2f}x the most "
                     f"requests, p99 {m['p99'] / max(by_name[tightest]['p99'], 1):.1f}x the "
                     f"lowest; the slow worker got {m['slow_share'] / fair:.2f}x an equal share.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--seconds", type=int, default=20, help="each measurement's length")
    parser.add_argument("--delay", type=int, default=50,
                        help="ms the slow worker adds to all it sends (default 50)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="requests in flight per client (default 4)")
    args = parser.parse_args()
    schedulers = [s for s in args.schedulers.split(",") if s]
    if not schedulers or set(schedulers) - set(SCHEDULERS):
        parser.error(f"schedulers are {', '.join(SCHEDULERS)}")

    workdir = Path(tempfile.mkdtemp(prefix="lbctl-bench-", dir="/run"))
    files = {}
    for scheduler in schedulers:
        files[scheduler] = workdir / f"{scheduler}.yaml"
        files[scheduler].write_text(yaml.safe_dump(cluster_spec(scheduler), sort_keys=False))
    first = files[schedulers[0]]
    lab = Lab(load_cluster(first), first, prefix="sc")
    for name, address in CLIENTS.items():
        lab.add_client(name, address)
    rows = []
    try:
        lab.build()
        lab.sh(SLOW, ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay",
                      f"{args.delay}ms"])
        apply_everywhere(lab, first)
        print(f"{len(CLIENTS)} clients x {args.concurrency} in flight, {args.seconds} s per "
              f"scheduler; {SLOW} answers {args.delay} ms late", flush=True)
        for scheduler in schedulers:
            # A service made anew: the last scheduler's connections (FIN_WAIT
            # lasts 2 minutes) would count against its workers under lc.
            lab.sh("lb1", ["ipvsadm", "-D", "-t", f"{VIP}:80"])
            done = lab.lbctl("lb1", "apply", str(files[scheduler]), "--force")
            if done.returncode != 0:
                raise SystemExit(f"bench: apply {scheduler}: {done.stdout}{done.stderr}")
            rows.append((scheduler, measure(lab, workdir, scheduler, args.concurrency,
                                            args.seconds)))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        lab.teardown()
        shutil.rmtree(workdir, ignore_errors=True)
    text = ("## Schedulers: one worker slower than the others\n\n"
            f"`bench/schedulers.py`, {machine()}.  One balancer, {len(WORKERS)} workers of "
            f"which one ({SLOW}) sends everything {args.delay} ms late (tc netem), "
            f"{len(CLIENTS)} clients from their own addresses each running ab with "
            f"{args.concurrency} requests in flight for {args.seconds} s against a small "
            "page.  Latency is each request's total time as ab measured it.  Each "
            "scheduler gets the service made anew.  Every weight is equal, so wrr "
            "schedules as rr and wlc as lc; sh and mh hash the eight clients' "
            "addresses, so their share of the slow worker is one draw of that hash.\n\n"
            f"{table(rows)}\n\n{summary(rows)}\n\n"
            + image_link("bench/schedulers.py", "throughput and p99 per scheduler"))
    print(data_line("bench/schedulers.py", {"rows": rows}), flush=True)
    print("\n" + section("bench/schedulers.py", text), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
