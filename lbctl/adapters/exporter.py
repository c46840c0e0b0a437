"""This cluster's exporter (`exporter:` in the file): a unit only systemd
runs.  Where systemd does not run the node, lbctl writes the unit and runs
nothing: for_balancer() declines there."""

from lbctl.adapters.systemd import Systemd


class ExporterDaemon:
    name = "exporter"

    def __init__(self, layout, systemd=None):
        self.layout = layout
        self.systemd = systemd or Systemd(layout.root)

    @classmethod
    def for_balancer(cls, layout, systemd, mode):
        return cls(layout, systemd) if systemd.runs else None

    def running(self):
        # None: systemctl could not ask systemd, which happens to a reader that
        # is not root, on a host without a D-Bus system bus: the exporter
        # itself, working out its drift, which is running as it asks.
        return self.systemd.is_active(self.layout.exporter_unit) is not False

    def test(self, text):
        """Its config is its unit file, which systemd reads at daemon-reload."""
        return []

    def prepare(self, programs=frozenset()):
        pass  # apply checks the Python its unit runs before writing the unit (node.py)

    def start(self):
        self.systemd.start(self.layout.exporter_unit, "the exporter")

    def reload(self):
        # It has no reload: its listen address is on its command line.
        self.systemd.restart(self.layout.exporter_unit, "the exporter")

    def stop(self):
        self.systemd.stop(self.layout.exporter_unit, "the exporter")
