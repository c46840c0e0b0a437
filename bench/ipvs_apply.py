"""Control-plane speed: lbctl against ipvsadm-restore, measured in the same run.

Programs S services x R real servers (default 1000 x 10) into IPVS in a
private network namespace, four ways, and prints the times side by side with
their ratio to ipvsadm-restore:

  ipvsadm-restore           the peer: one process, one netlink request per rule
  lbctl apply (end to end)  validate, observe, plan, execute, from the CLI
  IpvsNetlink.run batched   the adapter alone, 256 requests to a sendmsg()
  IpvsNetlink.run serial    the same, one request at a time (what batching saves)

and the read side: ipvsadm-save against IpvsNetlink.dump.

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/ipvs_apply.py
Machines are noisy (and the lab VM is emulated): compare the ratios.
"""

import argparse
import sys
import tempfile
import time
from ipaddress import IPv4Address
from pathlib import Path

import yaml

from lbctl.lab.shell import run
from private_netns import run_benchmark

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


def cluster_file(services, reals, directory):
    spec = {
        "cluster": "bench",
        "network": "10.1.0.0/16",
        "balancers": {"lb": {"address": BALANCER, "interface": "bench0"}},
        "workers": {f"w{i}": {"address": a} for i, a in enumerate(workers(reals))},
        "services": {f"s{s}": {"vip": VIP, "port": 1000 + s, "scheduler": "rr"}
                     for s in range(services)},
    }
    path = Path(directory) / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def ops_for(services, reals):
    from lbctl.adapters.protocols import IpvsOp
    from lbctl.config.model import DestKey, ServiceKey
    from lbctl.state import DestSpec, ServiceSpec

    ops = []
    for s in range(services):
        key = ServiceKey("tcp", IPv4Address(VIP), 1000 + s)
        ops.append(IpvsOp("add", "service", key, ServiceSpec("rr")))
        for w in workers(reals):
            ops.append(IpvsOp("add", "dest", key, DestSpec(1), DestKey(key, IPv4Address(w), 1000 + s)))
    return ops


def timed(func):
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def count_rules():
    return len([l for l in sh("ipvsadm-save", "-n").stdout.splitlines() if l.strip()])


def inside(args):
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "bench0", "type", "dummy")
    sh("ip", "address", "add", f"{BALANCER}/16", "dev", "bench0")
    sh("ip", "link", "set", "bench0", "up")
    expected = args.services * (1 + args.reals)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        rules = restore_rules(args.services, args.reals)
        results["ipvsadm-restore"] = timed(lambda: sh("ipvsadm-restore", input=rules))
        assert count_rules() == expected
        results["ipvsadm-save (read)"] = timed(lambda: sh("ipvsadm-save", "-n"))
        sh("ipvsadm", "-C")

        path = cluster_file(args.services, args.reals, tmp)
        root = Path(tmp) / "root"
        root.mkdir()  # apply writes only below an existing root
        results["lbctl apply (end to end)"] = timed(lambda: sh(
            sys.executable, "-m", "lbctl", "apply", str(path), "--node", "lb", "--root", str(root)))
        assert count_rules() == expected
        sh("ipvsadm", "-C")

        from lbctl.adapters.ipvs import IpvsNetlink
        from lbctl.adapters.ipvs_wire import GenlSocket

        netlink = IpvsNetlink()
        ops = ops_for(args.services, args.reals)
        results["IpvsNetlink.run batched"] = timed(lambda: netlink.run(ops))
        assert count_rules() == expected
        results["IpvsNetlink.dump (read)"] = timed(netlink.dump)
        sh("ipvsadm", "-C")
        GenlSocket.BATCH = 1
        results["IpvsNetlink.run serial"] = timed(lambda: netlink.run(ops))
        assert count_rules() == expected
        sh("ipvsadm", "-C")

    print(f"IPVS control plane: {args.services} services x {args.reals} real servers "
          f"({expected} rules), one run")
    print(f"{'operation':<28}{'seconds':>10}{'vs peer':>10}  peer")
    for name, seconds in results.items():
        peer = "ipvsadm-save (read)" if "(read)" in name else "ipvsadm-restore"
        ratio = seconds / results[peer]
        print(f"{name:<28}{seconds:>10.2f}{ratio:>9.2f}x  {peer}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--reals", type=int, default=10)
    run_benchmark(parser, inside)


if __name__ == "__main__":
    main()
