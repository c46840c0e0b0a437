"""The daemons lbctl may run on a balancer, one adapter each, made from
their registrations in state.DAEMONS."""

from importlib import import_module

from lbctl.state import DAEMONS


def balancer_daemons(cluster, layout, systemd, remove=False):
    """{name: Daemon} for a balancer of `cluster`: every daemon, wanted or not,
    so that one the file no longer wants (or `apply --remove`) is stopped.
    An adapter's for_balancer() may decline (the exporter where systemd does
    not run the node: nothing else runs it)."""
    mode = None if remove else cluster.mode
    daemons = {}
    for entry in DAEMONS:
        module, _, name = entry.adapter.partition(":")
        adapter = getattr(import_module(module), name).for_balancer(layout, systemd, mode)
        if adapter is not None:
            daemons[entry.name] = adapter
    return daemons
