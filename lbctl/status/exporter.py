"""lbctl exporter: what only lbctl knows about a balancer, as Prometheus metrics.

node_exporter's ipvs collector already exports the kernel's counters per real
server (connections, packets, bytes, weight).  This exports the rest, named
by the cluster file: each worker's health and since when, drains, the file's
weight beside the kernel's, the VRRP role and how often it changed, the sync
daemons, drift from the file, and the last apply.  Every scrape reads it
afresh but for three things that cost a Pi a moment each:
- drift (a whole plan) is kept for `drift_every` seconds (60 by default),
  and made again at once after an apply, so a node that an apply brought
  back in step shows so at the next scrape;
- the saved copies are validated again only once an apply changed them
  (records.saved.SavedCopies);
- the count of connections learned from the peer reads the kernel's whole
  connection table (hundreds of thousands of lines on a busy balancer), so
  a count is kept for LEARNED_REUSE times as long as it took to make: it
  costs at most a twentieth of a CPU, however often Prometheus scrapes.
  Never longer than LEARNED_MAX_AGE (so a count that takes more than 1.5 s
  costs more), and not across a change of VRRP role or of the sync daemons,
  which changes the count at once.
"""

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

DRIFT_SECONDS = 60
LEARNED_REUSE = 20
LEARNED_MAX_AGE = 30.0
VRRP_STATES = ("MASTER", "BACKUP", "FAULT", "STOP")


class LbctlCollector:
    """A prometheus_client collector over this balancer's state (see module doc).

    `clusters()` gives the cluster files to name things by (the saved copies,
    asked for each scrape so an apply is seen), `snapshot()` the IPVS snapshot or
    None, `drift(cluster)` the number of pending changes (None: not known),
    `learned()` the number of connections learned from the peer.
    """

    def __init__(self, root, clusters, snapshot, drift, clock=time.monotonic,
                 drift_every=DRIFT_SECONDS, learned=None):
        from lbctl.status.collect import learned_connections

        self.root, self.clusters, self.snapshot, self.drift = root, clusters, snapshot, drift
        self.clock, self.drift_every = clock, drift_every
        self.learned = learned or learned_connections
        self._drift = {}  # {cluster: (when, last apply's time, changes)}
        self._learned = None  # (until when it is kept, what it was counted in, the count)

    def collect(self):
        from lbctl.status.collect import drains_here, keepalived_states
        from lbctl.config.model import DestKey
        from lbctl.records.drains import dest_weights
        from lbctl.records.last_apply import read_last_apply

        clusters = self.clusters()
        snapshot = self.snapshot()
        kernel = {} if snapshot is None else dest_weights(snapshot.services)
        states = keepalived_states(self.root, clusters)
        labels = ["cluster", "service", "worker"]
        healthy = GaugeMetricFamily("lbctl_worker_healthy", "1 when the worker's health check "
                                    "passes, 0 when it fails (absent: no check)", labels=labels)
        since = GaugeMetricFamily("lbctl_worker_health_since_seconds", "When the worker's "
                                  "health last changed, in Unix time", labels=labels)
        drained = GaugeMetricFamily("lbctl_worker_drained", "1 while `lbctl drain` keeps the "
                                    "worker out of rotation", labels=labels)
        configured = GaugeMetricFamily("lbctl_worker_weight_configured",
                                       "The worker's weight in the cluster file", labels=labels)
        in_kernel = GaugeMetricFamily("lbctl_worker_weight_kernel", "The worker's weight in "
                                      "IPVS now (0: drained, failed or leaving)", labels=labels)
        record_ok = GaugeMetricFamily("lbctl_drain_record_ok", "0 when the drain record "
                                      "cannot be read (apply then treats no worker as "
                                      "drained)", labels=["cluster"])
        for cluster in clusters:
            info = states.get(cluster.name)
            health = {} if info is None else info.health_by_pair()
            out, listed = drains_here(self.root, [cluster])
            record_ok.add_metric([cluster.name], 0 if any(d.error is not None for d in listed)
                                 else 1)
            for svc in sorted(cluster.services.values(), key=lambda s: s.name):
                for rs in svc.real_servers:
                    key = DestKey(svc.key, rs.address, svc.port)
                    values = [cluster.name, svc.name, rs.worker]
                    h = health.get((svc.name, rs.worker))
                    if svc.health is not None and h is not None and h.state is not None:
                        healthy.add_metric(values, 1 if h.state == "up" else 0)
                        since.add_metric(values, h.since)
                    drained.add_metric(values, 1 if key in out else 0)
                    configured.add_metric(values, rs.weight)
                    if key in kernel:
                        in_kernel.add_metric(values, kernel[key])
        yield from (healthy, since, drained, record_ok, configured, in_kernel)
        yield from self._vrrp(clusters, states)
        yield from self._sync(snapshot, states)
        yield from self._drift_and_apply(clusters, read_last_apply)

    def _vrrp(self, clusters, states):
        role = GaugeMetricFamily("lbctl_vrrp_state", "1 for the VRRP role this balancer is in",
                                 labels=["cluster", "state"])
        since = GaugeMetricFamily("lbctl_vrrp_state_since_seconds",
                                  "When the VRRP role last changed, in Unix time",
                                  labels=["cluster"])
        changes = CounterMetricFamily("lbctl_vrrp_transitions", "VRRP role changes since "
                                      "keepalived's state folder was made (boot)",
                                      labels=["cluster"])
        for cluster in clusters:
            info = states.get(cluster.name)
            if cluster.vrrp is None or info is None or info.vrrp is None:
                continue
            held = info.held_vrrp  # none while keepalived is not running: STOP
            now_in = "STOP" if held is None else held.state
            for state in VRRP_STATES:
                role.add_metric([cluster.name, state], 1 if now_in == state else 0)
            if held is not None:
                since.add_metric([cluster.name], held.since)
            changes.add_metric([cluster.name], info.transitions)
        return role, since, changes

    def _sync(self, snapshot, states):
        running = GaugeMetricFamily("lbctl_sync_daemon_running", "1 for each IPVS connection "
                                    "sync daemon running", labels=["role", "interface"])
        learned = GaugeMetricFamily("lbctl_sync_learned_connections", "Connections this "
                                    "balancer learned from its peer's sync daemon")
        if snapshot is not None:
            for d in snapshot.sync_daemons:
                running.add_metric([d.role, d.interface], 1)
            if snapshot.sync_daemons:
                roles = sorted((name, info.vrrp.state, info.vrrp.since)
                               for name, info in states.items() if info.vrrp is not None)
                daemons = sorted((d.role, d.interface) for d in snapshot.sync_daemons)
                learned.add_metric([], self._learned_count((roles, daemons)))
        return running, learned

    def _learned_count(self, counted_in):
        """The learned count, kept while `counted_in` (the VRRP roles and the
        sync daemons) stays as it was."""
        began = self.clock()
        if self._learned is not None:
            until, seen_in, count = self._learned
            if began < until and seen_in == counted_in:
                return count
        count = self.learned()
        ended = self.clock()
        kept = min(LEARNED_REUSE * (ended - began), LEARNED_MAX_AGE)
        self._learned = (ended + kept, counted_in, count)
        return count

    def _drift_and_apply(self, clusters, read_last_apply):
        drift = GaugeMetricFamily("lbctl_drift_changes", "Changes `lbctl apply` of the file as "
                                  "last applied would make here (0: in step)",
                                  labels=["cluster"])
        when = GaugeMetricFamily("lbctl_last_apply_timestamp_seconds",
                                 "When lbctl apply last ran here, in Unix time",
                                 labels=["cluster"])
        ok = GaugeMetricFamily("lbctl_last_apply_success", "1 when the last apply succeeded",
                               labels=["cluster"])
        for cluster in clusters:
            last = read_last_apply(self.root, cluster.name)
            changes = self._cached_drift(cluster, None if last is None else last["time"])
            if changes is not None:
                drift.add_metric([cluster.name], changes)
            if last is not None:
                when.add_metric([cluster.name], last["time"])
                ok.add_metric([cluster.name], 1 if last["ok"] else 0)
        return drift, when, ok

    def _cached_drift(self, cluster, applied_at):
        when, seen_apply, changes = self._drift.get(cluster.name, (None, None, None))
        if when is None or self.clock() - when >= self.drift_every or applied_at != seen_apply:
            changes = self.drift(cluster)
            self._drift[cluster.name] = (self.clock(), applied_at, changes)
        return changes
