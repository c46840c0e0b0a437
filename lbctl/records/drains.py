"""Workers an operator took out of rotation with `lbctl drain`, kept on each balancer.

A drain is state of its own, beside the cluster file: the file says what a
worker's weight is, the drain record says it gets no new connections for now.
apply, a keepalived reload, a failover and a reboot all read the record, so
the worker stays drained until `lbctl undrain` takes it out of the record.
"""

import json
from dataclasses import dataclass

from lbctl.config.model import DestKey
from lbctl.errors import NodeError
from lbctl.layout import Layout

# The record's layout; a newer one is refused rather than misread.
DRAIN_FORMAT = 1


class NewerDrainRecord(NodeError):
    """A record this lbctl cannot read because a later one wrote it: unlike a
    damaged one, it is whole, and apply must not act as if it were empty."""


@dataclass(frozen=True)
class Drain:
    """One drained worker: on every service (services None) or on the ones named."""

    worker: str
    services: frozenset | None
    since: float  # epoch seconds of the first drain
    # {weight_key(DestKey): weight} of the real servers this balancer's IPVS
    # table had as the drain took them to 0: the weight the kernel keeps
    # filling an mh table by, 0 for none (see table_weights()).  None in a
    # record written before lbctl kept them.
    weights: dict | None = None

    def covers(self, service):
        return self.services is None or service in self.services

    def describe(self):
        return "every service" if self.services is None else ", ".join(sorted(self.services))


def read_drains(files, cluster_name):
    """{worker: Drain}.  A damaged record is an error: read as empty, it would
    quietly put every drained worker back into rotation."""
    path = Layout(cluster_name).drain_record
    found = files.read(path)
    if found is None:
        return {}
    try:
        data = json.loads(found[0])
        if not isinstance(data, dict) or not isinstance(data.get("drained"), dict):
            raise ValueError("not a drain record")
        if not isinstance(data.get("format"), int) or data["format"] > DRAIN_FORMAT:
            raise NewerDrainRecord(f"{path} was written by a newer lbctl (format "
                                   f"{data.get('format')}); upgrade lbctl on this node")
        drains = {}
        for worker, entry in data["drained"].items():
            services = entry.get("services")
            if services is not None and (not isinstance(services, list) or
                                         not all(isinstance(s, str) for s in services)):
                raise ValueError(f"{worker}: services must be a list of names or null")
            weights = entry.get("weights")
            if weights is not None and (not isinstance(weights, dict) or not all(
                    isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= 65535
                    for w in weights.values())):
                raise ValueError(f"{worker}: weights must map real servers to weights")
            drains[worker] = Drain(worker, None if services is None else frozenset(services),
                                   float(entry["since"]), weights)
        return drains
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise NodeError(f"{path} is damaged ({exc}): which workers are drained is not known; "
                        "fix it, or delete it to undrain every worker") from None


def write_drains(files, cluster_name, drains):
    path = Layout(cluster_name).drain_record
    if not drains:
        files.remove(path)
        return
    text = json.dumps({"format": DRAIN_FORMAT, "drained": {
        d.worker: {"services": None if d.services is None else sorted(d.services),
                   "since": d.since,
                   **({} if d.weights is None else {"weights": dict(sorted(d.weights.items()))})}
        for d in sorted(drains.values(), key=lambda d: d.worker)}}, indent=2) + "\n"
    files.write(path, text, 0o644)


def with_drain(drains, worker, service, now, weights=None):
    """The record after draining `worker` on `service` (None: every service).
    `weights`: table_weights() of the real servers this drain takes."""
    old = drains.get(worker)
    if old is None:
        services = None if service is None else frozenset([service])
        return drains | {worker: Drain(worker, services, now, weights)}
    if service is None or old.services is None:
        services = None
    else:
        services = old.services | {service}
    # The weights of the servers this drain takes replace what the record
    # had for them (table_weights() has every one).  A record from before
    # weights were kept stays without them: the servers it drained are at 0
    # now, and tell nothing.
    kept = None if old.weights is None else old.weights | (weights or {})
    return drains | {worker: Drain(worker, services, old.since, kept)}


def dest_weights(table):
    """{DestKey: weight} of an IPVS dump (fwmark services left out)."""
    return {DestKey(s.key, d.address, d.port): d.weight for s in table if s.key is not None
            for d in s.dests}


def weight_key(key):
    """A real server as the drain record names it (a DestKey's own text may change)."""
    service = key.service
    return f"{service.protocol} {service.vip}:{service.port} -> {key.address}:{key.port}"


def table_weights(cluster, worker, service, table, drains):
    """{weight_key(): weight} of `worker`'s real servers on `service` (None:
    every service) as this balancer's IPVS table had them before a drain.

    The kernel fills an mh table by the last weight above 0 each real
    server had, and a balancer whose keepalived starts while the worker is
    drained gives it that weight for a moment (lbctl-announce), so that its
    table matches the others'.  So each server gets:
    - the weight it has, when that is above 0;
    - drained already: what the drain that took it recorded, and 0 if that
      drain saw none (it joined the service drained, and has slots on no
      balancer);
    - at 0 otherwise (it failed its checks), or where this balancer's table
      lacks the whole service (keepalived is not running): the file's
      weight, the one it had before, as far as lbctl can tell;
    - 0 when the table has the service but not the server: apply adds it
      drained, at 0, on every balancer.
    `table`: the IPVS dump; `drains`: the record before this drain."""
    now = dest_weights(table)
    services_here = {s.key for s in table}
    old = drains.get(worker)
    found = {}
    for svc, key, weight in worker_dests(cluster, worker, service):
        named, seen = weight_key(key), now.get(key)
        if seen:
            found[named] = seen
        elif old is not None and old.covers(svc.name) and old.weights is not None:
            found[named] = old.weights.get(named, 0)
        elif seen == 0 or svc.key not in services_here:
            found[named] = weight
        else:
            found[named] = 0
    return found


def without_drain(drains, cluster, worker, service):
    """The record after undraining `worker` on `service` (None: every service)."""
    old = drains.get(worker)
    if old is None:
        return drains
    rest = {k: v for k, v in drains.items() if k != worker}
    if service is None:
        return rest
    remaining = (old.services if old.services is not None
                 else frozenset(services_of_worker(cluster, worker))) - {service}
    if not remaining:
        return rest
    weights = old.weights
    if weights is not None:
        # A drain of that service again reads the table afresh.
        gone = {weight_key(key) for _, key, _ in worker_dests(cluster, worker, service)}
        weights = {k: w for k, w in weights.items() if k not in gone}
    return rest | {worker: Drain(worker, remaining, old.since, weights)}


def without_weights_of_the_gone(drains, cluster, kept):
    """The record without the weights of real servers that are neither in the
    file nor `kept` (DestKeys the file dropped that keepalived's config keeps
    until their connections end).  keepalived deletes the others from the
    table, and one the file adds back while its worker is drained is added
    at 0, with no slots; one still kept only changes its weight, and keeps
    its slots."""
    file_keys = [key for _, _, key in _real_servers(cluster)]
    present = {weight_key(key) for key in [*file_keys, *kept]}
    found = {}
    for worker, drain in drains.items():
        if drain.weights is not None and not drain.weights.keys() <= present:
            drain = Drain(worker, drain.services, drain.since,
                          {k: w for k, w in drain.weights.items() if k in present})
        found[worker] = drain
    return found


def worker_dests(cluster, worker, service=None):
    """[(service, DestKey, the file's weight)] of the worker, on one service
    or all, by service name."""
    return sorted(((svc, key, rs.weight) for svc, rs, key in _real_servers(cluster)
                   if service in (None, svc.name) and rs.worker == worker),
                  key=lambda found: found[0].name)


def _real_servers(cluster):
    """(service, real server, DestKey) of each of the file's real servers,
    in the file's order."""
    for svc in cluster.services.values():
        for rs in svc.real_servers:
            yield svc, rs, DestKey(svc.key, rs.address, svc.port)


def services_of_worker(cluster, worker):
    return sorted(svc.name for svc in cluster.services.values()
                  if any(rs.worker == worker for rs in svc.real_servers))


def slot_weights(cluster, drains):
    """{DestKey: weight} of the drained real servers that have mh slots on
    the other balancers, with the weight those slots were filled by: the one
    the record kept, or for a record from before lbctl kept them, the file's."""
    found = {}
    for svc, rs, key in _real_servers(cluster):
        drain = drains.get(rs.worker)
        if drain is None or not drain.covers(svc.name):
            continue
        weight = rs.weight if drain.weights is None else drain.weights.get(weight_key(key), 0)
        if weight > 0:
            found[key] = weight
    return found


def drained_dests(cluster, drains):
    """{DestKey: Drain} of the file's real servers that are drained; entries for
    workers or services the file no longer has are ignored."""
    return {key: drains[rs.worker] for svc, rs, key in _real_servers(cluster)
            if rs.worker in drains and drains[rs.worker].covers(svc.name)}
