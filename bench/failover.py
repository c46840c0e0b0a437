"""Failover, measured: lbctl's pair against keepalived's defaults, and the two
ways to keep connections alive across a failover, in the same run.

Builds a pair of balancers and three workers in network namespaces and, for
each variant, applies the cluster, then cuts the master's link under load:

  gap        a request every 50 ms (0.5 s each): from the cut to the first
             answer from the backup, and the requests that failed
  survival   100 downloads of 1 MiB read at 64 KiB/s, in flight across the
             failover and the failback: how many arrive complete

Variants:
  lbctl           lbctl's settings: VRRPv3 advert 200 ms, unicast, sync daemon
  lbctl fast      the same with a 100 ms advert
  keepalived      keepalived's defaults: 1 s advert, no sync daemon (wlc)
  stateless       mh scheduler, sloppy_tcp, no sync daemon (the alternative
                  to syncing connections)

Needs a kernel with IPVS; elsewhere run it as
    python -m lbctl.lab.vm -- .venv/bin/python bench/failover.py
The lab VM may be emulated: compare the variants, not the absolute times.
"""

import copy
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lbctl.config import load_cluster
from lbctl.lab.topology import Lab
from lbctl.lab.traffic import summarize

VIP = "192.168.100.10"
PAIR = {
    "cluster": "bench",
    "balancers": {"lb1": {"address": "192.168.100.2", "interface": "eth0", "priority": 150},
                  "lb2": {"address": "192.168.100.5", "interface": "eth0", "priority": 100}},
    "workers": {"pi1": {"address": "192.168.100.3"}, "pi2": {"address": "192.168.100.4"},
                "pi3": {"address": "192.168.100.6"}},
    "services": {"web": {"vip": VIP, "port": 80, "scheduler": "wlc",
                         "health": {"http": {"path": "/index.html"}}}},
}


def variant(advert="200ms", scheduler="wlc"):
    spec = copy.deepcopy(PAIR)
    # This benchmark measures the failback too, so the master takes back over.
    spec["vrrp"] = {"advert_interval": advert, "preempt": True}
    spec["services"]["web"]["scheduler"] = scheduler
    return spec


VARIANTS = [
    ("lbctl", variant(), "sync"),
    ("lbctl fast", variant("100ms"), "sync"),
    ("keepalived", variant("1s"), "none"),
    ("stateless", variant(scheduler="mh"), "sloppy"),
]


def prepare(lab, connections):
    """Switch the pair to the connection mechanism being measured."""
    for node in ("lb1", "lb2"):
        if connections != "sync":
            for state in ("master", "backup"):
                lab.sh(node, ["ipvsadm", "--stop-daemon", state], check=False)
        lab.sh(node, ["sysctl", "-q", "-w",
                      f"net.ipv4.vs.sloppy_tcp={int(connections == 'sloppy')}"])


def measure(lab, path, connections):
    for node, result in lab.apply_all(path, extra=("--force",)).items():
        if result.returncode != 0:
            raise SystemExit(f"{node}: {result.stdout}{result.stderr}")
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 master")
    prepare(lab, connections)
    load = lab.traffic("load", VIP, "--seconds", 8, "--interval", 0.05, "--timeout", 0.5)
    time.sleep(2)
    cut, _ = lab.cut_master("lb1", "lb2", seconds_down=3)
    summary = summarize([r for r in lab.finish(load) if r[0] < cut + 4], cut)
    downloads = lab.traffic("downloads", VIP, "--count", 100, "--rate", 64 * 1024)
    time.sleep(3)
    lab.cut_master("lb1", "lb2", seconds_down=2)
    results = lab.finish(downloads)
    complete = sum(r["ok"] for r in results)
    return summary, complete, len(results)


def main():
    workdir = Path(tempfile.mkdtemp(prefix="lbctl-bench-", dir="/run"))
    files = []
    for name, spec, _ in VARIANTS:
        path = workdir / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        files.append(path)
    print(f"{'variant':<12} {'VIP back after':>15} {'failed requests':>16} "
          f"{'downloads complete':>19}")
    with Lab(load_cluster(files[0]), files[0]) as lab:
        for (name, _, connections), path in zip(VARIANTS, files):
            summary, complete, total = measure(lab, path, connections)
            gap = "never" if summary["gap"] is None else f"{summary['gap']:.2f} s"
            print(f"{name:<12} {gap:>15} {summary['failed']:>8}/{summary['requests']:<7} "
                  f"{complete:>11}/{total}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
