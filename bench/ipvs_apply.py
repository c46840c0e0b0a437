"""Control-plane speed: lbctl against ipvsadm-restore and ipvsadm-save, in one run.

For each size (default 10, 100 and 1000 services x 10 real servers), in a
private network namespace:

  full apply         `lbctl apply` end to end from an empty table (validate,
                     observe, plan, execute, from the CLI), against
                     ipvsadm-restore of the same rules
  no-op apply        the same apply again, which must change nothing, against
                     ipvsadm-save (what any tool pays to learn the table)
  one-server change  one real server's weight changed in the file, applied,
                     against ipvsadm-save too

and at the largest size the adapter alone (IpvsNetlink.run batched and one
request at a time, IpvsNetlink.dump), and the wall time and peak memory of
lbctl status and lbctl plan against a bare `python3 -c pass` and `ipvsadm -Ln`.
Last, 10,000 connection entries listed by `lbctl status --connections` and by
`ipvsadm -Lnc` (bench/connections.py's measure).

Then the keepalived engine (every service health-checked, so keepalived owns
the table) at one size: the full apply until every real server has passed its
check and holds its weight, a no-op apply, and a one-weight change, timed to
its return and on until the kernel holds the new weight.  The workers' checks
pass against real listeners in a second namespace.  Each service's and real
server's connection counter is read before and after the weight change: a
reload that rebuilt the table would start them again from zero.

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/ipvs_apply.py
Machines are noisy (and the lab VM is emulated): compare the ratios.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from ipaddress import IPv4Address
from pathlib import Path

import yaml

from lbctl.lab.shell import run
from breakdown import imported_modules, ordered_rows
from private_netns import run_benchmark
from report import machine, section

HERE = Path(__file__).resolve().parent

BALANCER = "10.1.0.1"
VIP = "10.2.0.1"


def sh(*argv, **kw):
    return run(list(argv), **kw)


def workers(count):
    return [str(IPv4Address("10.1.1.1") + i) for i in range(count)]


def restore_rules(services, reals):
    lines = []
    for s in range(services):
        lines.append(f"-A -t {VIP}:{1000 + s} -s rr")
        lines += [f"-a -t {VIP}:{1000 + s} -r {w}:{1000 + s} -g -w 1" for w in workers(reals)]
    return "\n".join(lines) + "\n"


def cluster_spec(services, reals, first_weight=1, health=None):
    """`first_weight`: the weight of the first service's first real server;
    `health`: every service's checks (which make keepalived the engine)."""
    names = [f"w{i}" for i in range(reals)]
    spec = {
        "cluster": "bench",
        "network": "10.1.0.0/16",
        "balancers": {"lb": {"address": BALANCER, "interface": "bench0"}},
        "workers": {name: {"address": a} for name, a in zip(names, workers(reals))},
        # The client reaches the VIP through a route to the balancer.
        "services": {f"s{s}": {"vip": VIP, "routed": True, "port": 1000 + s, "scheduler": "rr"}
                     for s in range(services)},
    }
    spec["services"]["s0"]["workers"] = {name: 1 for name in names} | {"w0": first_weight}
    if health is not None:
        for service in spec["services"].values():
            service["health"] = health
    return spec


def ops_for(services, reals):
    from lbctl.adapters.protocols import IpvsOp
    from lbctl.config.model import DestKey, ServiceKey
    from lbctl.state import DestSpec, ServiceSpec

    ops = []
    for s in range(services):
        key = ServiceKey("tcp", IPv4Address(VIP), 1000 + s)
        ops.append(IpvsOp("add", "service", key, ServiceSpec("rr")))
        for w in workers(reals):
            ops.append(IpvsOp("add", "dest", key, DestSpec(1),
                              DestKey(key, IPv4Address(w), 1000 + s)))
    return ops


def timed(func):
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def count_rules():
    return len([line for line in sh("ipvsadm-save", "-n").stdout.splitlines() if line.strip()])


def footprint(argv):
    """(seconds, peak RSS in MB) of a command, its output thrown away.  GNU time
    measures the memory: a child forked from this Python would count the
    Python's pages as its own high-water mark, even after its exec."""
    with tempfile.NamedTemporaryFile("r") as report:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-o", report.name, "-f", "%M", *argv],
                              stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"bench: {' '.join(argv)} failed")
        return seconds, int(report.read().split()[-1]) / 1024


class Applier:
    """`lbctl apply` of a spec as a user runs it, into a file root of its own."""

    def __init__(self, tmp, name):
        self.root = Path(tmp) / f"root-{name}"
        self.root.mkdir()  # apply writes only below an existing root
        self.path = Path(tmp) / f"{name}.yaml"

    def __call__(self, spec, must_say=None, *extra):
        # The comment makes each Applier's files bytes of their own: the
        # first apply of each validates its file, as a new file is.
        self.path.write_text(yaml.safe_dump(spec, sort_keys=False) + f"# {self.path.name}\n")
        done = sh(sys.executable, "-m", "lbctl", "apply", str(self.path), "--node", "lb",
                  "--root", str(self.root), *extra)
        if must_say is not None and must_say not in done.stdout:
            sys.exit(f"bench: apply said {done.stdout!r}, not {must_say!r}")
        return done


def measure_size(services, reals, tmp, run):
    """({operation: (seconds, peer operation)} at one size, the Applier of
    this `run` of them)."""
    expected = services * (1 + reals)
    found = {}
    rules = restore_rules(services, reals)
    peer_restore = timed(lambda: sh("ipvsadm-restore", input=rules))
    assert count_rules() == expected
    peer_save = timed(lambda: sh("ipvsadm-save", "-n"))
    sh("ipvsadm", "-C")
    found["ipvsadm-restore"] = (peer_restore, "ipvsadm-restore")
    found["ipvsadm-save"] = (peer_save, "ipvsadm-save")

    apply = Applier(tmp, f"netlink-{services}-{run}")
    found["lbctl apply, full"] = (timed(lambda: apply(cluster_spec(services, reals))),
                                  "ipvsadm-restore")
    assert count_rules() == expected
    found["lbctl apply, no-op"] = (timed(lambda: apply(cluster_spec(services, reals),
                                                       "no changes")), "ipvsadm-save")
    found["lbctl apply, one server"] = (
        timed(lambda: apply(cluster_spec(services, reals, first_weight=2))), "ipvsadm-save")
    weights = [line for line in sh("ipvsadm-save", "-n").stdout.splitlines()
               if f"-t {VIP}:1000 -r {workers(reals)[0]}:1000" in line]
    assert len(weights) == 1 and weights[0].endswith("-w 2"), weights
    return found, apply


def best_of(runs):
    """Each operation's least seconds over several runs' {operation: (seconds, peer)}."""
    return {name: (min(run[name][0] for run in runs), peer) for name, (_s, peer) in runs[0].items()}


def adapter_and_footprint(services, reals, applied, runs):
    """At the largest size: the netlink adapter alone, then status's and
    plan's footprint, in the root and with the file of the Applier `applied`."""
    from lbctl.adapters.ipvs import IpvsNetlink
    from lbctl.adapters.ipvs_wire import GenlSocket

    expected = services * (1 + reals)
    found = {}
    sh("ipvsadm", "-C")
    netlink = IpvsNetlink()
    ops = ops_for(services, reals)
    found["IpvsNetlink.run, batched"] = (timed(lambda: netlink.run(ops)), "ipvsadm-restore")
    assert count_rules() == expected
    found["IpvsNetlink.dump"] = (timed(netlink.dump), "ipvsadm-save")
    sh("ipvsadm", "-C")
    batch, GenlSocket.BATCH = GenlSocket.BATCH, 1
    try:
        found["IpvsNetlink.run, serial"] = (timed(lambda: netlink.run(ops)), "ipvsadm-restore")
    finally:
        GenlSocket.BATCH = batch
    assert count_rules() == expected
    commands = {"python3 -c pass": [sys.executable, "-c", "pass"],
                "ipvsadm -Ln": ["ipvsadm", "-Ln"],
                "lbctl status": [sys.executable, "-m", "lbctl", "status",
                                 "--root", str(applied.root)],
                "lbctl plan": [sys.executable, "-m", "lbctl", "plan", str(applied.path),
                               "--node", "lb", "--root", str(applied.root)]}
    sizes = {}
    for name, argv in commands.items():
        measured = [footprint(argv) for _ in range(runs)]
        # The least time, and the most memory any run took.
        sizes[name] = (min(m[0] for m in measured), max(m[1] for m in measured))
    sh("ipvsadm", "-C")
    return found, sizes


def breakdowns(services, reals, tmp, runs):
    """At the largest size: where each command's time goes, {command: {part:
    seconds}}, from the run of each command that took least in all.  Each
    command runs twice: under `python -X importtime`, which gives the sum
    of its imports and the modules it needs, then under bench/breakdown.py,
    which imports those first and clocks the command's parts from inside.
    The whole process is timed from outside; what the process did not
    measure itself is the interpreter's start."""
    tmp = Path(tmp)
    files = iter(range(1_000_000))

    def unseen(weight):
        """A file of bytes lbctl has not validated before, as a new file or an
        operator's edit is: the same cluster, a comment of its own."""
        path = tmp / f"breakdown-{next(files)}.yaml"
        path.write_text(yaml.safe_dump(cluster_spec(services, reals, first_weight=weight),
                                       sort_keys=False) + f"# {path.name}\n")
        return path

    def apply(spec, root):
        return ["apply", str(spec), "--node", "lb", "--root", str(root)]

    best = {}
    for repetition in range(runs):
        roots = [tmp / f"root-breakdown-{repetition}-{n}" for n in (1, 2)]
        for root in roots:
            root.mkdir()
        applied = unseen(1)
        # (command, its -X importtime run, its measured run): the importtime
        # run of each apply leaves the table as the measured run expects it.
        commands = (("apply, full", apply(unseen(1), roots[0]), apply(applied, roots[1])),
                    ("apply, no-op", apply(applied, roots[1]), apply(applied, roots[1])),
                    ("apply, one server", apply(unseen(2), roots[1]), apply(unseen(3), roots[1])),
                    ("status", ["status", "--root", str(roots[1])],
                     ["status", "--root", str(roots[1])]))
        for command, importtime_argv, argv in commands:
            if command == "apply, full":
                sh("ipvsadm", "-C")
            done = sh(sys.executable, "-X", "importtime", "-m", "lbctl", *importtime_argv)
            if command == "apply, full":
                sh("ipvsadm", "-C")
            modules, import_sum = imported_modules(done.stderr)
            names = tmp / "imports"
            names.write_text("\n".join(modules))
            start = time.perf_counter()
            inside = sh(sys.executable, str(HERE / "breakdown.py"), str(names), "--", *argv)
            whole = time.perf_counter() - start
            parts = json.loads(inside.stdout.splitlines()[-1])
            found = {"interpreter start": whole - sum(parts.values()), **parts,
                     "the whole command": whole, "-X importtime, its imports": import_sum}
            if command not in best or whole < best[command]["the whole command"]:
                best[command] = found
    sh("ipvsadm", "-C")
    return best


def breakdown_table(found, services, reals):
    commands = list(found)
    lines = [f"Where the time goes at {services} x {reals}, measured inside each command "
             "(bench/breakdown.py: a clock around each part, in the same run; an empty cell "
             "is a part the command does not have).  The interpreter's start is the whole "
             "process's time less what its clocks measured: starting and ending Python and "
             "the process, and the clocks' own few imports.  \"imports\" is lbctl's imports, "
             "made before the command runs; the last row is the sum `python -X importtime` "
             "gives for the same command, its interpreter's own imports included, which "
             "slows what it measures:", "",
             "| part | " + " | ".join(commands) + " |",
             "| --- |" + " --- |" * len(commands)]
    for part in ordered_rows(found):
        cells = [f"{found[c][part]:.2f}" if part in found[c] else "" for c in commands]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# lbctl's default timing (a check every 2 s), in keepalived's own TCP check
# (rise 1; a higher rise runs a script per check, which would measure forks).
KEEPALIVED_HEALTH = {"tcp": {}, "rise": 1}
WAIT_FOR_KERNEL = 600  # seconds; 10,000 first checks in an emulated VM take a while


def weights():
    """How many real servers hold each weight: {weight: count}."""
    found = Counter()
    for line in sh("ipvsadm-save", "-n").stdout.splitlines():
        if line.startswith("-a "):
            found[int(line.split()[-1])] += 1
    return found


def until(condition, what):
    """Seconds until condition() holds, polled as fast as ipvsadm-save answers."""
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > WAIT_FOR_KERNEL:
            sys.exit(f"bench: gave up waiting for {what}")
    return time.perf_counter() - start


def connection_counters():
    """{(service, real server): connections it has scheduled}, and each service's total."""
    from lbctl.adapters.ipvs import IpvsNetlink

    found = {}
    for service in IpvsNetlink().snapshot().services:
        found[(service.label, None)] = service.stats.conns
        for dest in service.dests:
            found[(service.label, str(dest.address))] = dest.stats.conns
    return found


def open_one_connection_per_service(services, workers_netns):
    """A SYN to every service, from a worker's address: IPVS schedules it and
    counts the connection.  The worker it goes to does not hold the VIP, so
    nothing answers, and nothing needs to."""
    sh("ip", "netns", "exec", workers_netns, sys.executable, str(HERE / "tcp_peers.py"),
       "connect", VIP, "1000", str(services))


def keepalived_engine(services, reals, tmp, workers_netns):
    """({operation: (seconds, peer)}, the weight change kept every counter)
    with every service health-checked, so that keepalived owns the table."""
    found = {}
    rules = restore_rules(services, reals)
    found["ipvsadm-restore"] = (timed(lambda: sh("ipvsadm-restore", input=rules)),
                                "ipvsadm-restore")
    found["ipvsadm-save"] = (timed(lambda: sh("ipvsadm-save", "-n")), "ipvsadm-save")
    sh("ipvsadm", "-C")
    apply = Applier(tmp, f"keepalived-{services}")
    servers = services * reals
    start = time.perf_counter()
    apply(cluster_spec(services, reals, health=KEEPALIVED_HEALTH))
    found["keepalived engine: apply, full, returned"] = (time.perf_counter() - start,
                                                         "ipvsadm-restore")
    until(lambda: weights() == {1: servers}, "every real server to pass its check")
    found["keepalived engine: apply, full, every server up"] = (time.perf_counter() - start,
                                                                "ipvsadm-restore")
    found["keepalived engine: apply, no-op"] = (
        timed(lambda: apply(cluster_spec(services, reals, health=KEEPALIVED_HEALTH),
                            "no changes")), "ipvsadm-save")
    open_one_connection_per_service(services, workers_netns)
    # The kernel sums its per-CPU counters every 2 s (its rate estimator).
    until(lambda: sum(n for (_, dest), n in connection_counters().items() if dest is None)
          >= services, "every service to count its connection")
    before = connection_counters()
    start = time.perf_counter()
    apply(cluster_spec(services, reals, first_weight=2, health=KEEPALIVED_HEALTH))
    found["keepalived engine: apply, one weight, returned"] = (time.perf_counter() - start,
                                                               "ipvsadm-save")
    until(lambda: weights() == Counter({1: servers - 1, 2: 1}), "the new weight in the kernel")
    found["keepalived engine: apply, one weight, in the kernel"] = (
        time.perf_counter() - start, "ipvsadm-save")
    kept = connection_counters() == before
    apply(cluster_spec(services, reals, health=KEEPALIVED_HEALTH), None, "--remove")
    sh("ipvsadm", "-C")
    return found, kept


def tables(results, sizes, largest, reals):
    lines = ["| services x real servers | operation | seconds | vs peer | peer |",
             "| --- | --- | --- | --- | --- |"]
    for services, found in results.items():
        for name, (seconds, peer) in found.items():
            if name.startswith("ipvsadm"):
                continue
            ratio = seconds / found[peer][0]
            lines.append(f"| {services} x {reals} | {name} | {seconds:.2f} | {ratio:.2f}x | "
                         f"{peer} ({found[peer][0]:.2f} s) |")
    lines += ["", f"Footprint at {largest} x {reals}, with that table in IPVS:", "",
              "| command | seconds | vs python3 -c pass | peak RSS MB |",
              "| --- | --- | --- | --- |"]
    bare = sizes["python3 -c pass"][0]
    for name, (seconds, rss) in sizes.items():
        lines.append(f"| {name} | {seconds:.2f} | {seconds / bare:.2f}x | {rss:.1f} |")
    return "\n".join(lines)


def connection_listing(count, runs):
    """bench/connections.py's rows for a table of `count` connection entries,
    made in this namespace once the control plane's runs have cleared IPVS."""
    import connections

    sh("ipvsadm", "-C")
    connections.prepare(count, balancer_link=False)  # bench0 is the balancer's already
    rows = connections.ratios(connections.measure([count], runs))
    sh("ipvsadm", "-C")
    return rows


def listing_table(rows, runs):
    lines = [f"Listing the connection table into a pipe (bench/connections.py's measure), "
             f"the least of {runs} runs:", "",
             "| entries | command | seconds | vs ipvsadm -Lnc | peak RSS MB | vs ipvsadm -Lnc |",
             "| --- | --- | --- | --- | --- | --- |"]
    for found, name, seconds, rss, time_ratio, rss_ratio in rows:
        lines.append(f"| {found:,} | `{name}` | {seconds:.3f} | {time_ratio:.2f}x | "
                     f"{rss / 1024:.1f} | {rss_ratio:.2f}x |")
    return "\n".join(lines)


def verdicts(results, sizes, largest, reals, listing):
    """Each target at the largest size, met or not, with the ratio measured."""
    def verdict(ratio, target):
        return f"{ratio:.2f}x; target {target:g}x or less, {'met' if ratio <= target else 'not met'}"

    found = results[largest]
    lines = [f"- At {largest} x {reals}, {name} took {peer}'s time "
             f"{verdict(found[name][0] / found[peer][0], 1.0)}."
             for name, peer in (("lbctl apply, full", "ipvsadm-restore"),
                                ("lbctl apply, no-op", "ipvsadm-save"),
                                ("lbctl apply, one server", "ipvsadm-save"))]
    seconds, rss = sizes["lbctl status"]
    lines.append(f"- lbctl status took a bare Python start's time "
                 f"{verdict(seconds / sizes['python3 -c pass'][0], 5.0)}; its peak RSS "
                 f"{rss:.1f} MB, target 40 MB or less, {'met' if rss <= 40 else 'not met'}.")
    for found, name, _seconds, _rss, time_ratio, _rss_ratio in listing:
        if name == "lbctl status --connections":
            lines.append(f"- At {found:,} connections, `{name}` took `ipvsadm -Lnc`'s time "
                         f"{verdict(time_ratio, 1.5)}.")
    return "\n".join(lines)


@contextmanager
def real_servers(reals, ports):
    """The workers: their addresses at the far end of bench0, in a namespace of
    their own (its name is yielded), with a listener on each service's port for
    the health checks, and a route to the VIP through the balancer."""
    name = f"lbctl-bench-workers-{os.getpid()}"
    sh("ip", "netns", "add", name)
    listeners = None
    try:
        sh("ip", "link", "add", "bench0", "type", "veth", "peer", "name", "bench1",
           "netns", name)
        for address in workers(reals):
            sh("ip", "-n", name, "address", "add", f"{address}/16", "dev", "bench1")
        for link in ("lo", "bench1"):
            sh("ip", "-n", name, "link", "set", link, "up")
        sh("ip", "-n", name, "route", "add", f"{VIP}/32", "via", BALANCER)
        listeners = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, str(HERE / "tcp_peers.py"),
             "listen", "1000", str(ports)], stdout=subprocess.PIPE, text=True)
        if listeners.stdout.readline().strip() != "ready":
            sys.exit("bench: the workers' listeners did not start")
        yield name
    finally:
        if listeners is not None:
            listeners.kill()
            listeners.wait()
        sh("ip", "netns", "del", name, check=False)


def inside(args):
    sh("ip", "link", "set", "lo", "up")
    results = {}
    with real_servers(args.reals, max(*args.services, args.keepalived_services)) as netns, \
            tempfile.TemporaryDirectory() as tmp:
        sh("ip", "address", "add", f"{BALANCER}/16", "dev", "bench0")
        sh("ip", "link", "set", "bench0", "up")
        for services in sorted(args.services):
            runs = [measure_size(services, args.reals, tmp, repetition)
                    for repetition in range(args.runs)]
            results[services] = best_of([found for found, _applied in runs])
            applied = runs[-1][1]
            print(f"{services} x {args.reals}: " + ", ".join(
                f"{name} {seconds:.2f}s" for name, (seconds, _) in results[services].items()),
                flush=True)
        largest = max(args.services)
        adapter, sizes = adapter_and_footprint(largest, args.reals, applied, args.runs)
        results[largest] |= adapter
        parts = breakdowns(largest, args.reals, tmp, args.runs)
        engine, kept = keepalived_engine(args.keepalived_services, args.reals, tmp,
                                          netns)
        print(f"keepalived engine, {args.keepalived_services} x {args.reals}: " + ", ".join(
            f"{name} {seconds:.2f}s" for name, (seconds, _) in engine.items()), flush=True)
        listing = connection_listing(args.connections, args.runs)
    text = ("## Control plane: lbctl apply against ipvsadm\n\n"
            f"`bench/ipvs_apply.py`, {machine()}.  Each apply is the whole command as a "
            "user runs it (a new Python, validation, a dump of the table, the plan, the "
            "changes); a full apply and a one-server change apply a file lbctl has not "
            "validated before, a no-op apply the same file again.  ipvsadm-restore loads "
            "the same rules, and ipvsadm-save reads them, which is what any tool pays to "
            "learn what is there.  Each figure of a command and of its peer is the least of "
            f"{args.runs} runs (the adapter's own rows: one run), and each column of the "
            "breakdown comes from its command's quickest run.  Targets: a full apply at "
            "most 1.0x ipvsadm-restore; a no-op apply and a one-server change at most 1.0x "
            "ipvsadm-save; `lbctl status` at most 5x a bare Python start, in 40 MB; "
            f"{args.connections:,} connections listed in at most 1.5x `ipvsadm -Lnc`'s "
            "time.\n\n"
            + tables(results, sizes, largest, args.reals) + "\n\n"
            + breakdown_table(parts, largest, args.reals) + "\n\n"
            + listing_table(listing, args.runs) + "\n\n"
            + verdicts(results, sizes, largest, args.reals, listing) + "\n\n"
            + keepalived_section(engine, kept, args.keepalived_services, args.reals))
    print("\n" + section("bench/ipvs_apply.py", text), flush=True)


def keepalived_section(found, kept, services, reals):
    lines = [f"### The keepalived engine at {services} x {reals}", "",
             "Every service health-checked (keepalived's TCP check at lbctl's default "
             "timing, every 2 s, against a listener on each worker's port), so "
             "keepalived, not lbctl, writes the table.  apply waits for that table: a "
             "full apply returns once every real server has passed its first check.  A "
             "weight change is a keepalived reload, which keeps the table; keepalived "
             "writes the new weight as it reloads (its \"Changing weight\" line falls "
             "in the second of its \"Reloading\"), and apply returns once the kernel's "
             "table matches the file and the current health.", "",
             "| operation | seconds | vs peer | peer |", "| --- | --- | --- | --- |"]
    for name, (seconds, peer) in found.items():
        if not name.startswith("ipvsadm"):
            lines.append(f"| {name.removeprefix('keepalived engine: ')} | {seconds:.2f} | "
                         f"{seconds / found[peer][0]:.2f}x | {peer} ({found[peer][0]:.2f} s) |")
    returned = found["keepalived engine: apply, one weight, returned"][0]
    held = found["keepalived engine: apply, one weight, in the kernel"][0]
    lines += ["", f"- A one-weight change: the kernel held the new weight {held:.2f} s after "
              f"apply began ({held - returned:.2f} s after apply returned).",
              "- The reload kept the table (target: a one-weight reload does not rebuild it): "
              + ("met; every service's and real server's connection counter kept its value."
                 if kept else "not met; connection counters started again from zero.")]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--reals", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3,
                        help="each figure of the netlink engine the least of this many runs")
    parser.add_argument("--keepalived-services", type=int, default=100,
                        help="services of the keepalived engine's run")
    parser.add_argument("--connections", type=int, default=10_000,
                        help="connection entries listed at the end")
    run_benchmark(parser, inside)


if __name__ == "__main__":
    main()
