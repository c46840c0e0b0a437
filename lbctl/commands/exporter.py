"""lbctl exporter: serve this balancer's lbctl metrics over HTTP for Prometheus."""

import signal

from lbctl.errors import UsageError

def parse_listen(text):
    """("127.0.0.1", 9588) from ADDRESS:PORT; the address must be IPv4."""
    from lbctl.config.model import split_listen

    try:
        address, port = split_listen(text)
    except ValueError:
        raise UsageError(f"--listen: {text!r} is not ADDRESS:PORT (an IPv4 address, a port "
                         "from 1 to 65535), e.g. 127.0.0.1:9588") from None
    return str(address), port


def run(args, out):
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    from lbctl.adapters.ipvs import IpvsNetlink
    from lbctl.saved import saved_clusters
    from lbctl.exporter import LbctlCollector

    from lbctl.config.model import DEFAULT_EXPORTER_LISTEN

    listen = args.listen or DEFAULT_EXPORTER_LISTEN
    address, port = parse_listen(listen)
    if args.file is not None:
        from lbctl.config import load_cluster

        given = load_cluster(args.file)

        def clusters():
            return [given]
    else:
        def clusters():
            return saved_clusters(args.root, strict=False)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(LbctlCollector(args.root, clusters, IpvsNetlink().snapshot,
                                     lambda cluster: _drift(args.root, cluster),
                                     drift_every=args.drift_every))
    try:
        server, thread = start_http_server(port, address, registry)
    except OSError as exc:
        raise UsageError(f"--listen {listen}: {exc.strerror or exc}") from None
    out.write(f"lbctl exporter: serving http://{address}:{port}/metrics\n")
    out.flush()
    # Until SIGTERM (systemd) or Ctrl-C; the HTTP server runs in its own thread.
    signal.signal(signal.SIGTERM, _stop)
    try:
        while thread.is_alive():
            thread.join(1)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _stop(_signum, _frame):
    raise KeyboardInterrupt


def _drift(root, cluster):
    """How many changes apply of the cluster as last applied would make; None if unknown."""
    from lbctl.errors import LbctlError
    from lbctl.node import load_node
    from lbctl.saved import applied_cluster

    try:
        applied, saved = applied_cluster(root, cluster.name)
        return len(load_node(saved, None, root, cluster=applied, read_only=True).plan.changes)
    except LbctlError:
        return None
