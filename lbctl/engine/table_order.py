"""Mode ecmp: every balancer fills an mh table alike, from the file alone.

mh fills its table from the real servers in the order of the kernel's list,
and keepalived adds each real server at the head of that list: on a start
in its config's order (so the file's last one heads the list), on a reload
only those its previous config lacked.  The two agree as long as each change
only appends: a worker added at the end of a service's list heads it after a
reload as after a start.  A worker added before others, or workers
reordered, would stand elsewhere after a reload than after a restart, a
reboot or on a new balancer, and flows the router moves between balancers
would reach other workers.  So apply refuses a change that would make this
kernel's list differ from what a start of keepalived gives, and only warns
where the list differed before the change (an lbctl older than this rule, a
real server deleted by hand).

What keepalived had before the change is read from its config on disk,
which it loaded (leaving real servers included), and from the saved copy of
the file: an lbctl before this rule wrote that config in the kernel's order,
so the order lbctl meant is the saved copy's where there is one.

Real servers are (address, port) pairs, as the kernel and keepalived key them.
"""

import re
from ipaddress import IPv4Address

from lbctl.config.model import TABLE_SCHEDULERS, Mode, ServiceKey
from lbctl.errors import ConfigError


def start_order(svc):
    """svc's real servers as a start of keepalived lists them, head first."""
    return [(rs.address, svc.port) for rs in reversed(svc.real_servers)]


def after_reload(svc, listed, previous):
    """...as a reload leaves them, from the kernel's list `listed`: those
    keepalived's `previous` config lacked at the head (the file's last
    first), then those the kernel kept, as they were.  One in both configs
    that the kernel lacks (deleted by hand) stays out: keepalived believes
    it in.  Real servers the file dropped are left out."""
    wanted = set(start_order(svc))
    return [k for k in start_order(svc) if k not in previous] + [k for k in listed if k in wanted]


def check_table_order(cluster, ipvs_table, applied_before=lambda: None,
                      configured=lambda: None):
    """Warnings for this balancer's apply of `cluster`; a ConfigError where
    the apply would put a service's real servers in another order than a
    start gives.  `ipvs_table`: the kernel's services (IpvsService);
    `applied_before()`: the cluster as last applied here (its saved copy),
    or None; `configured()`: keepalived's config on disk as
    configured_real_servers() reads it, or None.  Both are read only where
    the kernel's order differs from the file's."""
    if cluster.mode != Mode.ECMP:
        return []
    listed = {s.key: [(d.address, d.port) for d in s.dests] for s in ipvs_table
              if s.key is not None}
    applied, before, loaded = None, None, None
    problems, warnings = [], []
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        now = listed.get(svc.key)
        if svc.scheduler not in TABLE_SCHEDULERS or not now:
            continue  # a start fills it (keepalived deleted its table as it stopped)
        if now == start_order(svc):
            continue  # as a start lists them: a reload changes nothing
        if before is None:
            applied, loaded = applied_before(), configured() or {}
            before = {s.key: s for s in applied.services.values()} if applied else {}
        old = _Before(before.get(svc.key), loaded.get(svc.key))
        if after_reload(svc, now, old.members | set(now)) == start_order(svc):
            continue
        names = _names(applied, cluster)
        problem = _new_before_held(cluster, svc, now, old, names) or \
            _reordered(cluster, svc, now, old, names)
        if problem is not None:
            problems.append(problem)
        else:
            warnings.append(_drifted(svc, now, names))
    if problems:
        raise ConfigError(problems)
    return warnings


class _Before:
    """A service as it was before this apply: `applied`, the saved copy's
    Service (or None); `configured`, the (address, port)s of keepalived's
    config on disk in its order (or None)."""

    def __init__(self, applied, configured):
        self.applied, self.configured = applied, configured

    @property
    def members(self):
        """What keepalived holds configured, and so will not add again on a
        reload (leaving real servers included)."""
        return set(self.configured or ()) | \
            (set(start_order(self.applied)) if self.applied is not None else set())

    @property
    def start_order(self):
        """The order a start of keepalived gave before this apply, as lbctl
        meant it: the saved copy's where there is one (an older lbctl wrote
        keepalived's config in the kernel's order); None where neither tells."""
        if self.applied is not None:
            return start_order(self.applied)
        return list(reversed(self.configured)) if self.configured is not None else None

    def address_of(self, worker):
        if self.applied is None:
            return None
        return next((rs.address for rs in self.applied.real_servers if rs.worker == worker),
                    None)


def configured_real_servers(conf_text):
    """{ServiceKey: [(address, port)]} of a keepalived.conf lbctl wrote, each
    service's real servers in the config's order."""
    found = {}
    for block in conf_text.split("\nvirtual_server ")[1:]:
        head = re.match(r"([0-9.]+) (\d+) \{", block)
        protocol = re.search(r"^\s*protocol (TCP|UDP)\s*$", block, re.M)
        if head is None or protocol is None:
            continue  # not one of lbctl's (a fwmark service)
        key = ServiceKey(protocol[1].lower(), IPv4Address(head[1]), int(head[2]))
        found[key] = [(IPv4Address(a), int(p)) for a, p in
                      re.findall(r"^\s*real_server ([0-9.]+) (\d+) \{", block, re.M)]
    return found


def _new_before_held(cluster, svc, listed, old, names):
    """A worker keepalived would add at the head, placed in the file before
    one the kernel holds: whatever the saved copy says, a reload lists it
    elsewhere than a start."""
    previous, held = old.members | set(listed), set(listed)
    key = {rs.worker: (rs.address, svc.port) for rs in svc.real_servers}
    kept = [rs for rs in svc.real_servers if key[rs.worker] in held]
    if not kept:
        return None
    last_kept = kept[-1]
    early = next((rs for rs in svc.real_servers[:svc.real_servers.index(last_kept)]
                  if key[rs.worker] not in previous), None)
    if early is None:
        return None
    was = old.address_of(early.worker)
    what = (f"worker {early.worker} moves from {was} to {early.address}: to this balancer's "
            f"table that is a new real server, and it stands before {last_kept.worker}, "
            "which the table has" if was is not None and was != early.address else
            f"worker {early.worker} is new to this balancer's table and stands before "
            f"{last_kept.worker}, which the table has")
    how = (f"move {early.worker} after the others (here after {last_kept.worker}) as its "
           "address changes" if was is not None and was != early.address else
           f"add new workers after the others (here after {last_kept.worker})")
    message = (f"services.{svc.name}: {what}: in mode ecmp keepalived adds a new worker at "
               "the head of the kernel's list on a reload, but a restart lists them in the "
               f"file's order, and the balancers' mh tables would differ; {how}")
    return _at_worker(cluster, svc, early.worker, message)


def _reordered(cluster, svc, listed, old, names):
    """Workers the kernel holds, placed in another order than its list: a
    refusal where what was applied before shows this change makes it; None
    where the kernel differed already, or the file did not change."""
    before = old.start_order
    wanted = set(start_order(svc))
    if before is None or not _kept_in_start_order(before, listed) or \
            [k for k in before if k in wanted] == start_order(svc):
        return None
    key = {rs.worker: (rs.address, svc.port) for rs in svc.real_servers}
    held = set(listed)
    kept = [rs for rs in svc.real_servers if key[rs.worker] in held]
    ordered = [k for k in reversed(listed) if k in {key[rs.worker] for rs in kept}]
    moved = next((rs for rs, k in zip(kept, ordered) if key[rs.worker] != k), None)
    if moved is None:
        return None  # the same order: what differs is a real server deleted by hand
    left = [rs.worker for rs in kept if key[rs.worker] not in set(before)]
    back = (f"; {', '.join(left)} left the service but is still in this balancer's table, "
            "where it stays while it has connections: add it back at its old place, or wait "
            "until every balancer has dropped it (`lbctl status --all`), or drop it here now "
            "by an `apply --force` of the file without it, then add it after the others"
            if left else
            f"; if the other balancers took {moved.worker} out and back in, this balancer "
            "missed the apply that took it out: apply that file here first")
    message = (f"services.{svc.name}: worker {moved.worker} is not where this balancer's "
               f"table has it: keep the workers the table has in its order, "
               f"{_shown(ordered, names)} (the head of the kernel's list last), and add new "
               f"ones after them; a reordered list reaches the kernel only at a restart, and "
               f"the balancers' mh tables would differ{back}")
    return _at_worker(cluster, svc, moved.worker, message)


def _kept_in_start_order(before, listed):
    """Does the kernel list the real servers of `before` (a start order) it
    has as that start would?"""
    mine, present = set(before), set(listed)
    return [k for k in listed if k in mine] == [k for k in before if k in present]


def _at_worker(cluster, svc, worker, message):
    from lbctl.config.places import worker_diagnostic

    return worker_diagnostic(cluster, svc.name, worker, message)


def _names(*clusters):
    """{address: worker name} from the clusters given (None left out); a
    later one's name wins: the file being applied names its workers."""
    return {w.address: w.name for c in clusters if c is not None for w in c.workers.values()}


def _shown(keys, names):
    return ", ".join(names.get(address, str(address)) for address, _port in keys)


def _drifted(svc, listed, names):
    return (f"service {svc.name}: this balancer's kernel lists its real servers as "
            f"{_shown(listed, names)} (head first), not as a start of keepalived would: a "
            "restart or reboot of this balancer would fill another mh table than the other "
            "balancers', and flows the router moves between them could reach another worker; "
            "`lbctl doctor --all` shows whether the balancers differ, and how to rebuild (where "
            "every balancer lists them so, the file's workers put in that order mend it with "
            "no restart)")
