from lbctl.config import load_cluster
from lbctl.config.model import Mode


def run(args, out):
    cluster = load_cluster(args.file, fresh=True)  # checked anew, never read from the cache
    name = "<stdin>" if args.file == "-" else args.file
    out.write(f"{name}: valid: cluster {cluster.name}, {len(cluster.balancers)} balancer(s), "
              f"{len(cluster.workers)} worker(s), {len(cluster.services)} service(s); "
              f"{_balancers(cluster)}\n")
    return 0


def _balancers(cluster):
    if cluster.mode == Mode.ECMP:
        return (f"mode ecmp: every balancer active, announcing the VIPs over BGP to "
                f"{cluster.bgp.router} (AS {cluster.bgp.router_as})")
    return f"balancers run by {cluster.engine}"
