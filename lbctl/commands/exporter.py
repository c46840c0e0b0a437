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
    from prometheus_client.registry import CollectorRegistry

    from lbctl.adapters.ipvs import IpvsNetlink
    from lbctl.records.saved import SavedCopies
    from lbctl.status.exporter import LbctlCollector

    from lbctl.config.model import DEFAULT_EXPORTER_LISTEN

    listen = args.listen or DEFAULT_EXPORTER_LISTEN
    address, port = parse_listen(listen)
    if args.file is not None:
        from lbctl.config import load_cluster

        given = load_cluster(args.file)

        def clusters():
            return [given]
    else:
        clusters = SavedCopies(args.root)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Reused(LbctlCollector(args.root, clusters, IpvsNetlink().snapshot,
                                            lambda cluster: _drift(args.root, cluster),
                                            drift_every=args.drift_every)))
    try:
        server = serve(address, port, registry)
    except OSError as exc:
        raise UsageError(f"--listen {listen}: {exc.strerror or exc}") from None
    out.write(f"lbctl exporter: serving http://{address}:{port}/metrics\n")
    out.flush()
    # Until SIGTERM (systemd) or Ctrl-C.
    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# A client that sends nothing (or reads nothing) for this long is dropped.
CLIENT_SECONDS = 10


def serve(address, port, registry):
    """An HTTP server for /metrics that answers one request at a time: a
    scrape flood queues in the kernel's backlog instead of starting a thread
    (and a collection) per request, and an idle client is dropped."""
    import socket
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    class Handler(WSGIRequestHandler):
        timeout = CLIENT_SECONDS  # for each read: a client that sends nothing

        def setup(self):
            super().setup()
            # And for the whole request to arrive: one that sends a byte now
            # and then would otherwise hold the only thread for good.
            self._deadline = threading.Timer(CLIENT_SECONDS, self._cut)
            self._deadline.start()

        def parse_request(self):
            # The request is in: the deadline was for reading it, not for
            # the collection that answers it.
            self._deadline.cancel()
            return super().parse_request()

        def _cut(self):
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self):
            self._deadline.cancel()
            super().finish()

        def log_message(self, *args):
            pass  # Prometheus scrapes every few seconds: no line each time

    class Server(WSGIServer):
        request_queue_size = 16

    return make_server(address, port, make_wsgi_app(registry), server_class=Server,
                       handler_class=Handler)


class Reused:
    """A collector that shares one collection among the scrapes that arrive
    while it is still fresh: for as long after it as it took.  Scrapes seconds
    apart (Prometheus) always get a new one; a flood of them, served one at a
    time, costs at most half the CPU in collections, however many arrive."""

    def __init__(self, collector, clock=None):
        import time

        self.collector, self.clock = collector, clock or time.monotonic
        self._last = None  # (when it ended, how long it took, [metric families])

    def collect(self):
        if self._last is not None:
            ended, took, families = self._last
            if self.clock() - ended < took:
                return iter(families)
        began = self.clock()
        families = list(self.collector.collect())
        ended = self.clock()
        self._last = (ended, ended - began, families)
        return iter(families)


def _stop(_signum, _frame):
    raise KeyboardInterrupt


def _drift(root, cluster):
    """How many changes apply of the cluster as last applied would make; None if unknown."""
    from lbctl.errors import LbctlError
    from lbctl.engine.node import load_node
    from lbctl.records.saved import applied_cluster

    try:
        applied, saved = applied_cluster(root, cluster.name)
        return len(load_node(saved, None, root, cluster=applied, read_only=True).plan.changes)
    except LbctlError:
        return None
