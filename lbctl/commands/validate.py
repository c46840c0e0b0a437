from lbctl.config import load_cluster


def run(args, out):
    cluster = load_cluster(args.file)
    name = "<stdin>" if args.file == "-" else args.file
    out.write(f"{name}: valid: cluster {cluster.name}, {len(cluster.balancers)} balancer(s), "
              f"{len(cluster.workers)} worker(s), {len(cluster.services)} service(s); "
              f"balancers run by {cluster.engine}\n")
    return 0
