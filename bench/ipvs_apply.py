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
request at a time, IpvsNetlink.dump), and lbctl status's wall time and peak
memory against a bare `python3 -c pass` and `ipvsadm -Ln`.

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/ipvs_apply.py
Machines are noisy (and the lab VM is emulated): compare the ratios.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from ipaddress import IPv4Address
from pathlib import Path

import yaml

from lbctl.lab.shell import run
from private_netns import run_benchmark
from report import machine, section

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


def cluster_spec(services, reals, first_weight=1):
    """`first_weight`: the weight of the first service's first real server."""
    names = [f"w{i}" for i in range(reals)]
    spec = {
        "cluster": "bench",
        "network": "10.1.0.0/16",
        "balancers": {"lb": {"address": BALANCER, "interface": "bench0"}},
        "workers": {name: {"address": a} for name, a in zip(names, workers(reals))},
        "services": {f"s{s}": {"vip": VIP, "port": 1000 + s, "scheduler": "rr"}
                     for s in range(services)},
    }
    spec["services"]["s0"]["workers"] = {name: 1 for name in names} | {"w0": first_weight}
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


def measure_size(services, reals, tmp):
    """{operation: (seconds, peer operation)} at one size."""
    expected = services * (1 + reals)
    found = {}
    rules = restore_rules(services, reals)
    peer_restore = timed(lambda: sh("ipvsadm-restore", input=rules))
    assert count_rules() == expected
    peer_save = timed(lambda: sh("ipvsadm-save", "-n"))
    sh("ipvsadm", "-C")
    found["ipvsadm-restore"] = (peer_restore, "ipvsadm-restore")
    found["ipvsadm-save"] = (peer_save, "ipvsadm-save")

    root = Path(tmp) / f"root-{services}"
    root.mkdir()  # apply writes only below an existing root
    path = Path(tmp) / f"bench-{services}.yaml"

    def apply(spec, must_say=None):
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        done = sh(sys.executable, "-m", "lbctl", "apply", str(path), "--node", "lb",
                  "--root", str(root))
        if must_say is not None and must_say not in done.stdout:
            sys.exit(f"bench: apply said {done.stdout!r}, not {must_say!r}")

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
    return found


def adapter_and_footprint(services, reals, tmp):
    """At the largest size: the netlink adapter alone, then status's footprint."""
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
    sizes = {"python3 -c pass": footprint([sys.executable, "-c", "pass"]),
             "ipvsadm -Ln": footprint(["ipvsadm", "-Ln"]),
             "lbctl status": footprint([sys.executable, "-m", "lbctl", "status",
                                        "--root", str(Path(tmp) / f"root-{services}")])}
    sh("ipvsadm", "-C")
    return found, sizes


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


def verdicts(results, sizes, largest, reals):
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
    return "\n".join(lines)


def inside(args):
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "bench0", "type", "dummy")
    sh("ip", "address", "add", f"{BALANCER}/16", "dev", "bench0")
    sh("ip", "link", "set", "bench0", "up")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for services in sorted(args.services):
            results[services] = measure_size(services, args.reals, tmp)
            print(f"{services} x {args.reals}: " + ", ".join(
                f"{name} {seconds:.2f}s" for name, (seconds, _) in results[services].items()),
                flush=True)
        largest = max(args.services)
        adapter, sizes = adapter_and_footprint(largest, args.reals, tmp)
        results[largest] |= adapter
    text = ("## Control plane: lbctl apply against ipvsadm\n\n"
            f"`bench/ipvs_apply.py`, {machine()}.  Each apply is the whole command as a "
            "user runs it (a new Python, validation, a dump of the table, the plan, the "
            "changes); ipvsadm-restore loads the same rules, and ipvsadm-save reads them, "
            "which is what any tool pays to learn what is there.  Targets: a full apply at "
            "most 1.0x ipvsadm-restore; a no-op apply and a one-server change at most 1.0x "
            "ipvsadm-save; `lbctl status` at most 5x a bare Python start, in 40 MB.\n\n"
            + tables(results, sizes, largest, args.reals) + "\n\n"
            + verdicts(results, sizes, largest, args.reals))
    print("\n" + section("bench/ipvs_apply.py", text), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--reals", type=int, default=10)
    run_benchmark(parser, inside)


if __name__ == "__main__":
    main()
