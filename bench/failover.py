"""Failover and health, as distributions: lbctl's defaults, its fast settings,
and a plain keepalived.conf with keepalived's own defaults, in one run.

Builds two balancers, eight workers and a client in network namespaces.  For
each configuration:

  failover    the cable of the balancer holding the VIP pulled, once the
              other's checks have every worker in its pool; from the pull
              to the other's kernel adding the VIP (as `ip -ts monitor`
              reads it), and the requests made meanwhile (a new one every
              20 ms): those not answered within 0.5 s; those a real client
              never got an answer for (3 s for each attempt, in which the
              kernel resends the SYN after 1 s, and one more attempt 1 s
              later, as `curl --connect-timeout 3 --retry 1`); and the 99th
              percentile of the time a request took.  The cable goes back
              in and the pair settles before the next run.
  detection   the web servers of every worker killed, each at its own random
              moment within a check interval; from each kill until the
              worker has left the pool of the balancer holding the VIP
              (weight 0, or deleted).  Then they are restarted and return.
  survival    100 downloads of 1 MiB read at 64 KiB/s, in flight across one
              failover: how many arrive complete.

Configurations:
  lbctl defaults        advert 200 ms, unicast, sync daemon; health `steady`
                        (2 s interval, 1 s timeout, 2 retries)
  lbctl fast            advert 100 ms; health `fast` (1 s, 500 ms, 1 retry)
  keepalived defaults   keepalived.conf as its manual's defaults leave it:
                        VRRPv2 multicast, 1 s advert; HTTP_GET with a 60 s
                        delay_loop, 5 s connect_timeout, 1 retry 3 s later;
                        no sync daemon
  stateless             (survival only) lbctl with the mh scheduler,
                        sloppy_tcp and no sync daemon: the alternative to
                        syncing connections

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/failover.py
The lab VM may be emulated: compare the configurations, not the absolute
times.  It prints its section of docs/benchmarks.md last.
"""

import argparse
import collections
from dataclasses import dataclass
from datetime import datetime
import math
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from lbctl.config import load_cluster
from lbctl.lab.topology import Lab
from lab_apply import apply_everywhere
from plots import data_line, image_link
from pool_watch import hex_endpoint, pool
from report import machine, percentile, section

HERE = Path(__file__).resolve().parent
VIP = "192.168.100.10"
BALANCERS = {"lb1": ("192.168.100.2", 150), "lb2": ("192.168.100.3", 100)}
WORKERS = {f"pi{n}": f"192.168.100.{10 + n}" for n in range(1, 9)}  # --workers takes the first N


def lbctl_spec(workers, advert="200ms", health=None, scheduler="wlc"):
    return {
        "cluster": "failover",
        "vrrp": {"advert_interval": advert},
        "balancers": {name: {"address": address, "interface": "eth0", "priority": priority}
                      for name, (address, priority) in BALANCERS.items()},
        "workers": {name: {"address": address} for name, address in workers.items()},
        "services": {"web": {"vip": VIP, "port": 80, "scheduler": scheduler,
                             "health": {"http": {"path": "/index.html"}, **(health or {})}}},
    }


def plain_keepalived_conf(name, workers):
    """What an operator writes from keepalived's manual, every timer left at
    its default."""
    address, priority = BALANCERS[name]
    top = max(p for _, p in BALANCERS.values())
    reals = "".join(f"    real_server {a} 80 {{\n        HTTP_GET {{\n            url {{\n"
                    f"                path /index.html\n                status_code 200\n"
                    f"            }}\n        }}\n    }}\n" for a in workers.values())
    return (f"global_defs {{\n    router_id {name}\n}}\n"
            f"vrrp_instance web {{\n    state {'MASTER' if priority == top else 'BACKUP'}\n"
            f"    interface eth0\n    virtual_router_id 51\n    priority {priority}\n"
            f"    virtual_ipaddress {{\n        {VIP}/32\n    }}\n}}\n"
            f"virtual_server {VIP} 80 {{\n    lb_algo wlc\n    lb_kind DR\n"
            f"    protocol TCP\n{reals}}}\n")


# -- the pair -------------------------------------------------------------------
def lab_workers(lab):
    """{worker name: address} of the workers in the lab."""
    return {name: str(w.address) for name, w in lab.cluster.workers.items()}


def holders(lab):
    """The balancers that hold the VIP on their LAN interface."""
    return [name for name in BALANCERS
            if f" {VIP}/" in lab.sh(name, ["ip", "-4", "-o", "address", "show", "dev", "eth0"],
                                    check=False).stdout]


def settled_holder(lab, advert, timeout=90):
    """The one balancer holding the VIP, once one alone has held it for a few
    adverts (a preempting master takes back over some seconds after its
    cable returns)."""
    quiet = 4 * advert + 1
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = holders(lab)
        current = now[0] if len(now) == 1 else None
        if current != last:
            last, since = current, time.monotonic()
        elif current and time.monotonic() - since >= quiet:
            return current
        time.sleep(0.1)
    raise SystemExit(f"bench: no single balancer settled holding {VIP} (now {holders(lab)})")


def start_plain_keepalived(lab, workdir):
    """lbctl's keepalived stopped and each balancer's namespace made anew (no
    IPVS table, no address, no nftables left), then keepalived on its own."""
    procs = []
    for name in BALANCERS:
        lab.kill_keepalived(name, signal.SIGTERM)
        lab.wire(name)
        conf = workdir / f"{name}-keepalived.conf"
        conf.write_text(plain_keepalived_conf(name, lab_workers(lab)))
        check = lab.sh(name, ["keepalived", "--config-test", "--use-file", str(conf)],
                       check=False)
        if check.returncode != 0:
            raise SystemExit(f"bench: keepalived refuses {conf}: {check.stderr}")
        procs.append(lab.spawn(name, [
            "keepalived", "--dont-fork", "--log-console", "--no-syslog", "--use-file", str(conf),
            *(arg for kind in ("pid", "vrrp_pid", "checkers_pid")
              for arg in (f"--{kind}", str(workdir / f"{name}-{kind}")))]))
    return procs


# -- failover ---------------------------------------------------------------------
class Watch:
    """A command's output lines, each kept as parse() reads it, as they come."""

    def __init__(self, argv):
        self.items = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            item = self.parse(line)
            if item is not None:
                self.items.append(item)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        self.reader.join(timeout=5)


class KernelEvents(Watch):
    """`ip -ts monitor` in a node's namespace: the kernel's own events, each
    with the time ip read it (a busy CPU can make that late, never early).
    Keeps (epoch, line) of the lines `wanted` accepts."""

    def __init__(self, lab, node, objects, wanted):
        self.wanted = wanted
        super().__init__(["ip", "-n", lab.nodes[node].netns, "-ts", "monitor", *objects])

    def parse(self, line):
        stamp, _, rest = line.partition("] ")
        if not stamp.startswith("[") or not self.wanted(rest):
            return None
        # ip prints the local time; fromisoformat() reads a naive stamp as local too.
        return datetime.fromisoformat(stamp[1:]).timestamp(), rest

    def first(self, since):
        """The time of the first event read at `since` or later, or None."""
        return next((at for at, _line in self.items if at >= since), None)


def pool_of(lab, balancer):
    """The worker addresses `balancer` would send new connections to now."""
    table = lab.sh(balancer, ["cat", "/proc/net/ip_vs"]).stdout
    return {e.rsplit(":", 1)[0] for e in pool(table, hex_endpoint(VIP, 80))}


# A real client: an attempt waits up to 3 s (the kernel resends its SYN
# after 1 s), and a failed one is made once more 1 s later.
CLIENT_TIMEOUT, CLIENT_RETRIES = 3.0, 1
HALF_SECOND = 0.5  # a request not answered within it counts as failed


@dataclass
class Failover:
    gap: float | None  # seconds until the other balancer held the VIP, or None
    requests: int
    failed: int  # not answered within HALF_SECOND
    failed_retrying: int  # never answered, for a client that waits and retries
    times: list  # seconds each request took, through every attempt


def failover(lab, advert):
    """One cut of the VIP holder's cable under load: a Failover."""
    holder = settled_holder(lab, advert)
    # The standby's checks failed while its own cable was out (the run
    # before): what is timed is VRRP's takeover, not their return.
    standby = next(name for name in BALANCERS if name != holder)
    lab.wait_for(lambda: pool_of(lab, standby) >= set(lab_workers(lab).values()), timeout=150,
                 what=f"every worker back in {standby}'s pool")
    window = max(4.0, 6 * advert + 2)
    # The failover time: from the moment the cable is pulled (just before the
    # `ip link set down` that pulls it) to the standby's kernel adding the VIP
    # (keepalived sends its gratuitous ARP then), as `ip monitor` reads it.
    # The holder's own link-down event, read by a second `ip monitor`, is no
    # start: on a busy emulated CPU that reader can lag the standby's by more
    # than the failover takes, and the figure came out negative.  The time
    # read here can only lag, so a failover is never timed short; an add read
    # before the pull (a standby that took over for a moment) is not this one.
    took_over = KernelEvents(lab, standby, ["address"],
                             lambda line: f" inet {VIP}/" in line and "Deleted" not in line)
    # A fresh request every 20 ms, none waiting for another.
    load = lab.traffic("probes", VIP, "--seconds", 1.5 + window, "--interval", 0.02,
                       "--timeout", CLIENT_TIMEOUT, "--retries", CLIENT_RETRIES)
    try:
        time.sleep(1.5)
        cut = time.time()
        lab.set_link(holder, False)
        records = [r for r in lab.finish(load) if r[0] < cut + window]
    finally:
        lab.set_link(holder, True)
        took_over.stop()
    moved = took_over.first(since=cut)
    times = [round(end - start, 3) for start, end, _ok, _body in records]
    return Failover(gap=moved - cut if moved is not None else None, requests=len(records),
                    failed=sum(not r[2] or t > HALF_SECOND for r, t in zip(records, times)),
                    failed_retrying=sum(not r[2] for r in records), times=times)


def survival(lab, advert, count, synced):
    """`count` slow downloads across one failover: (how many arrived complete,
    how many ran, what broke the others).

    `synced`: the balancers run the connection sync daemon.  It sends a new
    connection to the standby up to 3 s later (lab.learned_ports), so the
    cable is pulled once the standby knows every download: what is measured
    is what the sync promises, not a race with its batch.  Without it, 3 s
    after they start."""
    holder = settled_holder(lab, advert)
    standby = next(name for name in BALANCERS if name != holder)
    before = lab.learned_ports(standby, VIP, 80)
    downloads = lab.traffic("downloads", VIP, "--count", count, "--rate", 64 * 1024,
                            "--timeout", 300)
    if synced:
        lab.wait_until_learned(standby, VIP, 80, count, before)
    else:
        time.sleep(3)
    lab.set_link(holder, False)
    # keepalived's defaults preempt: its master takes the VIP back as soon as
    # the cable returns, so its downloads cross a failback too.
    time.sleep(3 + 4 * advert)
    lab.set_link(holder, True)
    results = lab.finish(downloads)
    return sum(r["ok"] for r in results), len(results), broken(results, holder)


def broken(results, holder):
    """What became of the downloads that did not arrive whole, for the notes:
    "" if every one did."""
    failed = [r for r in results if not r["ok"]]
    if not failed:
        return ""
    why = collections.Counter(r["error"] or f"short ({r['bytes']} of {r['expected']} bytes)"
                              for r in failed)
    received = sorted(r["bytes"] for r in failed)
    return (f"{len(failed)} broke across the cut of {holder}'s cable: "
            + ", ".join(f"{count}x {error}" for error, count in why.most_common())
            + f"; {received[0] // 1024}-{received[-1] // 1024} KiB had arrived")


# -- detection ---------------------------------------------------------------------
class PoolWatch(Watch):
    """bench/pool_watch.py in a balancer's namespace: (epoch, {worker address})
    each time the pool changes."""

    def __init__(self, lab, node):
        super().__init__(["ip", "netns", "exec", lab.nodes[node].netns, sys.executable,
                          str(HERE / "pool_watch.py"), VIP, "80"])

    def parse(self, line):
        when, *live = line.split()
        return float(when), {e.rsplit(":", 1)[0] for e in live}

    @property
    def changes(self):
        return self.items

    def live(self):
        return self.changes[-1][1] if self.changes else set()

    def left_at(self, address, after):
        """When `address` was first seen out of the pool after `after`."""
        for when, live in self.changes:
            if when >= after and address not in live:
                return when
        return None

def detection_round(lab, advert, spread, timeout=180):
    """Every worker's web server killed at its own random moment within
    `spread` seconds (a check interval at least, so the kills fall anywhere
    in the checks' cycle): the seconds each took to leave the pool."""
    watch = PoolWatch(lab, settled_holder(lab, advert))
    workers = lab_workers(lab)
    addresses = set(workers.values())
    try:
        lab.wait_for(lambda: watch.live() >= addresses, timeout=timeout,
                     what="every worker in the pool")
        start = time.time()
        killed = {}
        for name, offset in sorted(((n, random.uniform(0, spread)) for n in workers),
                                   key=lambda item: item[1]):
            time.sleep(max(0.0, start + offset - time.time()))
            lab.web_server(name).kill()
            killed[workers[name]] = time.time()
        lab.wait_for(lambda: not watch.live() & addresses, timeout=timeout,
                     what="every worker out of the pool")
        samples = [watch.left_at(address, at) - at for address, at in killed.items()]
    finally:
        for name in workers:  # those a failed wait left alive too, or wait() would hang
            lab.web_server(name).kill()
            lab.web_server(name).wait()
            lab.ensure_web_server(name)
        lab.wait_for(lambda: watch.live() >= addresses, timeout=timeout,
                     what="every worker back in the pool")
        watch.stop()
    return samples


# -- the run -----------------------------------------------------------------------
def stop_sync_daemons(lab):
    """The stateless variant keeps no connection table in step."""
    for node in BALANCERS:
        for state in ("master", "backup"):
            lab.sh(node, ["ipvsadm", "--stop-daemon", state], check=False)
        lab.sh(node, ["sysctl", "-q", "-w", "net.ipv4.vs.sloppy_tcp=1"])


# Each configuration's VRRP advert interval and health-check interval, in seconds.
TIMERS = {"lbctl defaults": (0.2, 2.0), "lbctl fast": (0.1, 1.0),
          "keepalived defaults": (1.0, 60.0), "stateless": (0.2, 2.0)}


def measure(lab, name, runs, rounds, downloads, log):
    advert, check_interval = TIMERS[name]
    figures = {"failover": [], "failed": [], "failed_retrying": [], "times": [], "requests": 0,
               "detection": []}
    for run in range(runs):
        cut = failover(lab, advert)
        figures["failover"].append(cut.gap)
        figures["failed"].append(cut.failed)
        figures["failed_retrying"].append(cut.failed_retrying)
        figures["times"] += cut.times
        figures["requests"] += cut.requests
        log(f"{name}: failover {run + 1}/{runs}: {seconds(cut.gap)}, {cut.failed} of "
            f"{cut.requests} failed at {HALF_SECOND} s, {cut.failed_retrying} retrying")
    for run in range(rounds):
        samples = detection_round(lab, advert, spread=max(5.0, check_interval))
        figures["detection"] += samples
        log(f"{name}: detection round {run + 1}/{rounds}: "
            + " ".join(f"{s:.2f}" for s in sorted(samples)))
    figures["survived"], figures["downloads"], figures["broken"] = survival(
        lab, advert, downloads, synced=name != "keepalived defaults")
    log(f"{name}: {figures['survived']} of {figures['downloads']} downloads complete")
    return figures


def seconds(value):
    return "never" if value is None else f"{value:.2f} s"


def distribution(values):
    return " | ".join(seconds(percentile(values, q)) for q in (0.5, 0.95, 1.0))


def report(results, runs):
    lines = ["| configuration | VIP on the other balancer: median | p95 | max | failed requests "
             "per run, given 0.5 s: median | max | failed for a client that retries: max | "
             "request time: p99 | worker out of the pool: median | p95 | max | "
             "downloads across a failover, complete |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, f in results.items():
        if not f["failover"]:
            lines.append(f"| {name} | | | | | | | | | | | {f['survived']} of {f['downloads']} |")
            continue
        lines.append(f"| {name} | {distribution(f['failover'])} | "
                     f"{statistics.median(f['failed']):g} | {max(f['failed'])} | "
                     f"{max(f['failed_retrying'])} | "
                     f"{seconds(percentile(f['times'], 0.99)) if f['times'] else 'none made'} | "
                     f"{distribution(f['detection'])} | {f['survived']} of {f['downloads']} |")
    fast, plain = results.get("lbctl fast"), results.get("keepalived defaults")
    notes = []
    if fast:
        p95 = percentile(fast["failover"], 0.95)
        notes.append(f"- lbctl fast: failover p95 {seconds(p95)} (target 0.5 s or less: "
                     f"{'met' if p95 is not None and p95 <= 0.5 else 'not met'}); "
                     f"detection p95 {seconds(percentile(fast['detection'], 0.95))} "
                     f"(target 1 s or less: "
                     f"{'met' if percentile(fast['detection'], 0.95) <= 1 else 'not met'}).")
    for name in ("lbctl defaults", "lbctl fast"):
        mine = results.get(name)
        if mine and plain and None not in mine["failover"] + plain["failover"]:
            notes.append(
                f"- {name} against keepalived's defaults, median for median: the VIP back "
                f"{statistics.median(plain['failover']) / statistics.median(mine['failover']):.1f}x"
                f" sooner, a dead worker out "
                f"{statistics.median(plain['detection']) / statistics.median(mine['detection']):.1f}x"
                " sooner.")
    for name, f in results.items():
        if f.get("broken"):
            notes.append(f"- {name}: {f['broken']}.")
    samples = max(len(f["detection"]) for f in results.values())
    return (f"{runs} failovers and {samples} detections per configuration.\n\n"
            + "\n".join(lines) + "\n\n" + "\n".join(notes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20,
                        help="failovers per configuration, and at least as many "
                             "detections (default 20)")
    parser.add_argument("--configurations", default="lbctl defaults,lbctl fast,"
                                                    "keepalived defaults,stateless")
    parser.add_argument("--workers", type=int, default=len(WORKERS),
                        help=f"workers in the lab, 1 to {len(WORKERS)} (default {len(WORKERS)})")
    parser.add_argument("--downloads", type=int, default=100,
                        help="downloads in flight across the survival failover (default 100)")
    args = parser.parse_args()
    chosen = [c for c in args.configurations.split(",") if c]
    known = tuple(TIMERS)
    if set(chosen) - set(known) or args.runs < 1 or not 1 <= args.workers <= len(WORKERS):
        parser.error(f"configurations are {', '.join(known)}; runs at least 1; "
                     f"workers 1 to {len(WORKERS)}")
    workers = dict(list(WORKERS.items())[:args.workers])
    rounds = math.ceil(args.runs / len(workers))

    def log(line):
        print(line, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="lbctl-bench-", dir="/run"))
    specs = {"lbctl defaults": lbctl_spec(workers),
             "lbctl fast": lbctl_spec(workers, "100ms", {"profile": "fast"}),
             "stateless": lbctl_spec(workers, scheduler="mh")}
    files = {}
    for name, spec in specs.items():
        files[name] = workdir / f"{name.replace(' ', '-')}.yaml"
        files[name].write_text(yaml.safe_dump(spec, sort_keys=False))
    results = {}
    lab = Lab(load_cluster(files["lbctl defaults"]), files["lbctl defaults"], prefix="fo")
    plain = []
    try:
        lab.build()
        # The workers keep lbctl's VIP on lo and ARP settings throughout: direct
        # routing needs them whoever runs the balancers.
        apply_everywhere(lab, files["lbctl defaults"], ("--force",))
        for name in (c for c in known if c in chosen and c != "keepalived defaults"):
            apply_everywhere(lab, files[name], ("--force",))
            if name == "stateless":
                stop_sync_daemons(lab)
                results[name] = {"failover": [], "detection": [], "downloads": args.downloads}
                results[name]["survived"], _, results[name]["broken"] = survival(
                    lab, TIMERS[name][0], args.downloads, synced=False)
                log(f"{name}: {results[name]['survived']} of {args.downloads} downloads complete")
            else:
                results[name] = measure(lab, name, args.runs, rounds, args.downloads, log)
        if "keepalived defaults" in chosen:
            plain = start_plain_keepalived(lab, workdir)
            results["keepalived defaults"] = measure(lab, "keepalived defaults", args.runs,
                                                     rounds, args.downloads, log)
    finally:
        for proc in plain:
            proc.terminate()
            proc.wait(timeout=15)
        lab.teardown()
        shutil.rmtree(workdir, ignore_errors=True)
    print(data_line("bench/failover.py", results), flush=True)
    text = ("## Failover and health: lbctl against keepalived's defaults\n\n"
            f"`bench/failover.py`, {machine()}.  A pair of balancers and {len(workers)} "
            "workers.  "
            "Failover: the VIP holder's cable pulled (once the other balancer's checks "
            "have every worker in its pool), timed from the pull to the other's kernel "
            "adding the VIP, as `ip -ts monitor` reads it; "
            "meanwhile a request every 20 ms, each on a new connection, none waiting for "
            "another: failed given 0.5 s is those not answered within 0.5 s; failed for a "
            "client that retries is those never answered by a client that gives each "
            "attempt 3 s (its kernel resends the SYN after 1 s) and makes one more 1 s "
            "later, as `curl --connect-timeout 3 --retry 1` (the goal: 0); the request "
            "time spans every attempt.  Detection: each worker's web server killed (so "
            "connections to it are refused) at a random moment within a check interval "
            "(at least 5 s), timed until the worker leaves the pool, read off the "
            "balancer's IPVS table every 20 ms.  Survival: "
            f"{args.downloads} downloads of 1 MiB at 64 KiB/s across one failover, the "
            "cable pulled once the standby has learned them where a sync daemon runs (it "
            "sends a new connection up to 3 s later), else 3 s after they start (and, "
            "for keepalived's defaults, whose master preempts, the failback).  "
            "keepalived's defaults: VRRPv2 multicast, advert 1 s; HTTP_GET every 60 s, "
            "a 5 s connect timeout, retried once after 3 s, a failed worker deleted; no "
            "sync daemon.  They are timers left at their defaults, not another "
            "keepalived: lbctl runs keepalived too, with its own.  Stateless: mh, "
            "sloppy_tcp, no sync daemon.\n\n" + report(
                {n: results[n] for n in known if n in results}, args.runs)
            + "\n\n" + image_link("bench/failover.py", "failover and detection times"))
    print("\n" + section("bench/failover.py", text), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
