"""The daemons lbctl may run on a balancer, one adapter each: the one place a
new daemon is registered (its name goes in state.DAEMON_ORDER too)."""

from lbctl.config.model import Mode
from lbctl.state import BIRD, EXPORTER, KEEPALIVED


def balancer_daemons(cluster, layout, systemd, remove=False):
    """{name: Daemon} for a balancer of `cluster`: every daemon, wanted or not,
    so that one the file no longer wants (or `apply --remove`) is stopped.
    The exporter only where systemd runs the node: nothing else runs it."""
    from lbctl.adapters.bird import BirdDaemon
    from lbctl.adapters.exporter import ExporterDaemon
    from lbctl.adapters.keepalived import KeepalivedDaemon

    mode = None if remove else cluster.mode
    daemons = {KEEPALIVED: KeepalivedDaemon(layout, systemd, takeover=mode == Mode.FAILOVER,
                                            announce=mode == Mode.ECMP),
               BIRD: BirdDaemon(layout, systemd)}
    if systemd.runs:
        daemons[EXPORTER] = ExporterDaemon(layout, systemd)
    return daemons
