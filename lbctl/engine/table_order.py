"""Mode ecmp: every balancer fills an mh (or sh) table alike, from the file alone.

mh fills its table from the real servers in the order of the kernel's list,
and keepalived adds each real server at the head of that list: on a start
in its config's order (so the file's last one heads the list), on a reload
only the new ones.  The two agree as long as each change only appends: a
worker added at the end of a service's list heads it after a reload as
after a start.  A worker added before others, or workers reordered, would
stand elsewhere after a reload than after a restart, a reboot or on a new
balancer, and flows the router moves between balancers would reach other
workers.  So apply refuses a change that would make this kernel's list
differ from what a start of keepalived gives, and only warns where the
list differed before the change (an lbctl older than this rule, a real
server deleted by hand).
"""

from lbctl.config.model import TABLE_SCHEDULERS, Mode
from lbctl.errors import ConfigError


def start_order(svc):
    """svc's real servers' addresses as a start of keepalived lists them, head first."""
    return [rs.address for rs in reversed(svc.real_servers)]


def after_reload(svc, listed):
    """...as a reload leaves them, from the kernel's list `listed`: the new
    ones at the head (the file's last first), then those it kept, as they
    were.  Real servers the file dropped are left out."""
    held = set(listed)
    wanted = {rs.address for rs in svc.real_servers}
    return [a for a in start_order(svc) if a not in held] + [a for a in listed if a in wanted]


def _in_start_order(svc, listed):
    """Does the kernel list the real servers it has of svc as a start would?"""
    present = set(listed)
    return [a for a in listed if a in {rs.address for rs in svc.real_servers}] == \
        [a for a in start_order(svc) if a in present]


def check_table_order(cluster, ipvs_table, applied_before=lambda: None):
    """Warnings for this balancer's apply of `cluster`; a ConfigError where
    the apply would put a service's real servers in another order than a
    start gives.  `ipvs_table`: the kernel's services (IpvsService);
    `applied_before()`: the cluster as last applied here (its saved copy),
    or None; read only where the kernel's order differs."""
    if cluster.mode != Mode.ECMP:
        return []
    listed = {s.key: [d.address for d in s.dests] for s in ipvs_table if s.key is not None}
    applied, before = None, None
    problems, warnings = [], []
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        now = listed.get(svc.key)
        if svc.scheduler not in TABLE_SCHEDULERS or not now:
            continue  # a start fills it (keepalived deleted its table as it stopped)
        if after_reload(svc, now) == start_order(svc):
            continue
        if before is None:
            applied = applied_before()
            before = {s.key: s for s in applied.services.values()} if applied else {}
        old = before.get(svc.key)
        if old is None or not _in_start_order(old, now) or _addresses(old) == _addresses(svc):
            warnings.append(_drifted(svc, now, _names(cluster, applied)))
        else:
            problems.append(_refusal(cluster, svc, now, old))
    if problems:
        raise ConfigError(problems)
    return warnings


def _addresses(svc):
    return [rs.address for rs in svc.real_servers]


def _names(*clusters):
    """{address: worker name} from the clusters given (None left out)."""
    return {w.address: w.name for c in clusters if c is not None for w in c.workers.values()}


def _shown(addresses, names):
    return ", ".join(names.get(a, str(a)) for a in addresses)


def _drifted(svc, listed, names):
    return (f"service {svc.name}: this balancer's kernel lists its real servers as "
            f"{_shown(listed, names)} (head first), not as a start of keepalived would: a "
            "restart or reboot of this balancer would fill another mh table than the other "
            "balancers', and flows the router moves between them could reach another worker; "
            "`lbctl doctor --all` shows whether the balancers differ, and how to rebuild")


def _refusal(cluster, svc, listed, old):
    """The Diagnostic naming the first worker the file places where a reload
    would not, at its place in the file."""
    from lbctl.config.places import worker_diagnostic

    names = _names(cluster)
    held = set(listed)
    kept = [rs for rs in svc.real_servers if rs.address in held]
    new = [rs for rs in svc.real_servers if rs.address not in held]
    ordered = [a for a in reversed(listed) if a in {rs.address for rs in kept}]
    last_kept = kept[-1] if kept else None
    first_new_early = next((rs for rs in new if last_kept is not None
                            and svc.real_servers.index(rs) < svc.real_servers.index(last_kept)),
                           None)
    tail = ("in mode ecmp keepalived adds a new worker at the head of the kernel's list on a "
            "reload, but a restart lists them in the file's order, and the balancers' mh "
            "tables would differ")
    if first_new_early is not None:
        message = (f"services.{svc.name}: worker {first_new_early.worker} is new to this "
                   f"balancer's table and stands before {last_kept.worker}, which the table "
                   f"has: {tail}; add new workers after the others (here after "
                   f"{last_kept.worker})")
        return worker_diagnostic(cluster, svc.name, first_new_early.worker, message)
    moved = next(rs for rs, address in zip(kept, ordered) if rs.address != address)
    left = [rs.worker for rs in kept if rs.address not in {r.address for r in old.real_servers}]
    back = (f"; {', '.join(left)} left the service but is still in its table, where it "
            "stays while it has connections: add it back at its old place, or after an "
            "apply without it has dropped it" if left else "")
    message = (f"services.{svc.name}: worker {moved.worker} is not where this balancer's "
               f"table has it: keep the workers the table has in its order, "
               f"{_shown(ordered, names)} (the head of the kernel's list last), and add new "
               f"ones after them; a reordered list reaches the kernel only at a restart, and "
               f"the balancers' mh tables would differ{back}")
    return worker_diagnostic(cluster, svc.name, moved.worker, message)
