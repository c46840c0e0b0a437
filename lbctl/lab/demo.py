"""`lbctl lab demo`: the whole cluster on one machine, with real traffic.

It builds the lab for a cluster file, applies lbctl on every node, sends
requests through the VIP, and shows which worker served each, the balancer's
IPVS status, and the direct-routing proof: how few of the response bytes
crossed the balancer.
"""

import collections
import re
import shutil
import time

from lbctl.config import load_cluster
from lbctl.config.model import Mode
from lbctl.lab.topology import BLOB_BYTES, Lab
from lbctl.lab.traffic import summarize

DOWNLOADS = 10


def _print(out, text=""):
    out.write(text + "\n")
    out.flush()


def demo(cluster_file, out, requests=12):
    cluster = load_cluster(cluster_file)
    balancer = next(iter(cluster.balancers))
    ecmp = cluster.mode == Mode.ECMP
    if ecmp:
        from lbctl.lab.routed import RoutedLab

        lab = RoutedLab(cluster, cluster_file, prefix="demo")
    else:
        lab = Lab(cluster, cluster_file)
    with lab:
        _print(out, f"== lab for cluster {cluster.name}: {len(lab.nodes)} namespaces on one bridge"
                    + (", and the client behind the router" if ecmp else ""))
        for node in lab.nodes.values():
            _print(out, f"   {node.name:<8} {node.role:<9} {node.address}  (netns {node.netns})")
        _print(out, "\n== lbctl apply on every node (workers first)")
        for name, result in lab.apply_all().items():
            _print(out, f"-- {name}: exit {result.returncode}")
            _print(out, (result.stdout + result.stderr).rstrip())
            if result.returncode != 0:
                raise SystemExit(f"lab demo: apply failed on {name}")
        if ecmp:
            _routes(lab, cluster, out)

        for svc in cluster.services.values():
            _print(out, f"\n== {requests} requests from the client to {svc.key} ({svc.scheduler})")
            if svc.protocol == "tcp":
                answers = lab.ask(f"http://{svc.vip}:{svc.port}/", requests)
            else:
                answers = lab.udp_ask(svc.vip, svc.port, count=requests)
            for i, answer in enumerate(answers, 1):
                _print(out, f"   {i:>2}: {answer}")
            counts = collections.Counter(answers)
            _print(out, "   spread: " + ", ".join(f"{k.replace('served by ', '')} {v}"
                                                   for k, v in sorted(counts.items())))

        web = next((s for s in cluster.services.values() if s.protocol == "tcp"), None)
        if web is not None:
            url = f"http://{web.vip}:{web.port}/"
            if shutil.which("ab"):
                _print(out, f"\n== load: ab -n 500 -c 10 {url}")
                ab = lab.sh("client", ["ab", "-q", "-n", "500", "-c", "10", url], check=False)
                for line in ab.stdout.splitlines():
                    if re.match(r"^(Complete requests|Failed requests|Requests per second|"
                                r"Time per request|Transfer rate)", line):
                        _print(out, "   " + line)
            _print(out, f"\n== direct-routing proof: {DOWNLOADS} downloads of a "
                        f"{BLOB_BYTES // 1024} KiB file through the VIP")
            before = [lab.iface_bytes(b) for b in cluster.balancers]
            c_rx0, _ = lab.iface_bytes("client")
            for _ in range(DOWNLOADS):
                lab.sh("client", ["curl", "-sS", "-o", "/dev/null", f"{url}blob"])
            after = [lab.iface_bytes(b) for b in cluster.balancers]
            c_rx1, _ = lab.iface_bytes("client")
            through_balancer = sum((rx1 - rx0) + (tx1 - tx0)
                                   for (rx0, tx0), (rx1, tx1) in zip(before, after))
            delivered = c_rx1 - c_rx0
            share = 100.0 * through_balancer / max(delivered, 1)
            which = "balancers" if len(cluster.balancers) > 1 else "balancer"
            _print(out, f"{'   bytes delivered to the client:':<41}{delivered:>12,}")
            _print(out, f"{f'   bytes through the {which} (rx + tx):':<41}{through_balancer:>12,}")
            _print(out, f"   the {which} carried {share:.2f}% of what the client received: "
                        "responses went from the workers straight to the client")

        if cluster.mode == Mode.FAILOVER and web is not None:
            _failover(lab, cluster, web, out)

        _print(out, f"\n== lbctl status on {balancer}")
        _print(out, lab.lbctl(balancer, "status").stdout.rstrip())
        first_worker = next(iter(cluster.workers))
        _print(out, f"\n== lbctl status on {first_worker}")
        _print(out, lab.lbctl(first_worker, "status").stdout.rstrip())
        _print(out, "\n== tearing the lab down")
    return 0


def _routes(lab, cluster, out):
    """Mode ecmp: the router's route to each VIP, once every balancer offers it."""
    _print(out, "\n== the router's routes: one next hop per balancer that offers the VIP")
    for vip in cluster.vips:
        took = lab.wait_for_next_hops(vip, list(cluster.balancers), timeout=60)
        _print(out, f"   {vip}: via {', '.join(lab.next_hops(vip))} "
                    f"(all offered {took:.1f} s after the last apply)")


def _failover(lab, cluster, web, out):
    """Cut the master off under a steady load, then bring it back: what did clients see?"""
    master, backup = list(cluster.balancers)
    lab.wait_for(lambda: lab.vrrp_state(master) == "MASTER", what=f"{master} to be master")
    interval, timeout = 0.05, 0.5
    _print(out, f"\n== failover: a request to {web.vip}:{web.port} every {interval * 1000:.0f} ms "
                f"(each given {timeout} s); {master} is MASTER, {backup} BACKUP "
                f"(VRRP advert every {cluster.vrrp.advert_interval:g} s)")
    load = lab.traffic("load", web.vip, "--port", web.port, "--seconds", 14,
                       "--interval", interval, "--timeout", timeout)
    time.sleep(2)
    _print(out, f"   {master}: eth0 down (as if its cable were pulled); {backup} takes over")
    preempt = cluster.vrrp.preempt
    cut, restored = lab.cut_master(master, backup, seconds_down=3, failback=preempt)
    if preempt:
        _print(out, f"   {master}: eth0 up again; it waited for its health checks, "
                    "then took back over")
    else:
        _print(out, f"   {master}: eth0 up again; it rejoins as BACKUP and {backup} keeps the "
                    "VIP (no preemption: a failback is a second interruption, so it waits "
                    "for you or for the next failure)")
    records = lab.finish(load)
    down = summarize([r for r in records if r[0] < restored], cut)
    back = summarize([r for r in records if r[0] >= restored], restored)
    gap = "never" if down["gap"] is None else f"{down['gap']:.2f} s"
    _print(out, f"   failover: the VIP answered from {backup} {gap} after the cut; "
                f"{down['failed']} of {down['requests']} requests failed")
    _print(out, f"   {'failback' if preempt else 'master back as backup'}: "
                f"{back['failed']} of {back['requests']} requests failed")
