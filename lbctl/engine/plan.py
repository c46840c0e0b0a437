"""The difference between what a node has and what the file wants.

Pure: it takes two NodeStates and the ownership record and returns an
ordered list of changes.  Additions and changes come before removals, so a
service never goes without real servers while it is being edited, and only
objects the file declares, or lbctl created earlier, are ever touched.
"""

from dataclasses import dataclass, field
from enum import StrEnum

from lbctl.state import DAEMON_ORDER, DAEMONS, Ownership

ADD, CHANGE, DRAIN, DRAINING, REMOVE = "add", "change", "drain", "draining", "remove"
SYMBOLS = {ADD: "+", CHANGE: "~", DRAIN: "-", DRAINING: "~", REMOVE: "-"}
IPVS, KEEPALIVED = "ipvs", "keepalived"


# What a Change acts on; its value is how plans print it.  Each kind has one
# handler in execute.py.  The daemons' kinds (start, reload or stop) are
# their names in state.DAEMONS.
Kind = StrEnum("Kind", [
    ("ADDRESS", "address"),
    ("SERVICE", "service"),
    ("REAL_SERVER", "real server"),
    ("SYSCTL", "sysctl"),
    ("IPVS_TIMEOUT", "ipvs timeout"),
    ("SYNC_DAEMON", "sync daemon"),
    ("FILE", "file"),
    ("LINK", "link"),
    ("SYSTEMD", "systemd"),  # systemd told of changed units
    *((entry.name.upper(), entry.name) for entry in DAEMONS),
], module=__name__)


IPVS_KINDS = (Kind.SERVICE, Kind.REAL_SERVER)
DAEMON_KINDS = tuple(Kind(name) for name in DAEMON_ORDER)


@dataclass(frozen=True)
class Change:
    action: str
    kind: Kind
    key: object
    new: object = None
    old: object = None
    note: str = ""
    # Who carries a real-server change out: lbctl over netlink, or keepalived
    # when it reloads a config that no longer lists (or drains) the server.
    through: str = IPVS
    # An edit of an IPVS entry keepalived is about to take over: made before
    # keepalived starts (see NodeState.start_services).
    handover: bool = False

    def __str__(self):
        text = f"{SYMBOLS[self.action]} {self.kind} {self.key}"
        return f"{text}{self.note}"


@dataclass
class Plan:
    node: str
    role: str
    cluster: str
    changes: list = field(default_factory=list)
    # Ownership to record before the changes run, and after they all succeed.
    owned_before: Ownership = field(default_factory=Ownership)
    owned_after: Ownership = field(default_factory=Ownership)
    # Removals held back (keep_leaving): a later apply makes them.
    deferred: list = field(default_factory=list)

    @property
    def empty(self):
        return not self.changes

    @property
    def pair_config_left(self):
        """The keepalived config of the failover pair this balancer leaves
        (its file replaced by one without a VRRP instance, or removed), or
        None when it leaves no pair."""
        for c in self.changes:
            if c.kind == Kind.FILE and c.old is not None and "vrrp_instance" in c.old.content \
                    and (c.new is None or "vrrp_instance" not in c.new.content):
                return c.old.content
        return None

    def counts(self):
        add = sum(c.action == ADD for c in self.changes)
        change = sum(c.action in (CHANGE, DRAINING) for c in self.changes)
        remove = sum(c.action in (DRAIN, REMOVE) for c in self.changes)
        return add, change, remove


def _service_note(spec):
    persist = f" persistence {spec.persistence}s" if spec.persistence else ""
    flags = f" flags {','.join(spec.flags)}" if spec.flags else ""
    return f" scheduler {spec.scheduler}{flags}{persist}"


def make_plan(desired, observed, owned, force=False, keep_leaving=False, shared_sysctls=()):
    """Changes that take `observed` to `desired` on this node.

    `keep_leaving`: additions and changes only.  `apply --all` applies the
    workers so before the balancers: a worker keeps an old VIP until no
    balancer sends it traffic for that VIP any more, then a second pass
    removes it.
    """
    plan = Plan(desired.node, desired.role, desired.cluster)
    adds, removes = [], []
    # Stopping a daemon comes first: keepalived takes its VIPs and services
    # with it, BIRD its routes, and apply plans again once they have stopped.
    stops = _daemon_stops(desired, observed)

    # Sysctls before addresses: a worker must ignore ARP for the VIP before it
    # holds the VIP, or for a moment it answers ARP for it on the LAN and
    # clients send their traffic to the worker instead of the balancer.
    sysctl_originals = {}
    for key, value in desired.sysctls.items():
        now = observed.sysctls.get(key)
        if key not in owned.sysctls:
            # None: the key did not exist yet (ip_vs not loaded), or an older
            # lbctl set it already: there is no value of the node's own to put back.
            sysctl_originals[key] = None if owned.legacy else now
        if now != value:
            shown = " ".join(value.split())  # vector values read back tab-separated
            adds.append(Change(CHANGE, Kind.SYSCTL, key, value, now,
                               f" = {shown} (now {' '.join((now or 'unset').split())})"))
    for addr in sorted(desired.addresses - observed.addresses):
        adds.append(Change(ADD, Kind.ADDRESS, addr))
    for path, spec in sorted(desired.files.items()):
        old = observed.files.get(path)
        if old != spec:
            adds.append(Change(ADD if old is None else CHANGE, Kind.FILE, path, spec, old))
    for path, target in sorted(desired.links.items()):
        if observed.links.get(path) != target:
            adds.append(Change(ADD, Kind.LINK, path, target, observed.links.get(path),
                               f" -> {target}"))

    # keepalived is about to start: it takes over what the kernel holds of its table.
    starting = desired.keepalived is not None and observed.keepalived is None
    timeout_changes, restores, originals = _timeouts(desired, observed, owned, starting)
    adds += timeout_changes
    if starting:
        adds += _handover(desired, observed)
    adds += _daemon_starts_and_reloads(desired, observed, adds)

    # Only what differs is sorted: a table of thousands that matches the
    # file costs a look-up per entry, not a sort of all of them.
    for key in sorted(k for k, spec in desired.services.items()
                      if observed.services.get(k) != spec):
        spec, old = desired.services[key], observed.services.get(key)
        if old is None:
            adds.append(Change(ADD, Kind.SERVICE, key, spec, note=_service_note(spec)))
        else:
            adds.append(Change(CHANGE, Kind.SERVICE, key, spec, old,
                               f"{_service_note(old)} ->{_service_note(spec)}"))
    for key in sorted(k for k, spec in desired.dests.items()
                      if not _same_dest(observed.dests.get(k), spec)):
        spec, old = desired.dests[key], observed.dests.get(key)
        if old is None:
            adds.append(Change(ADD, Kind.REAL_SERVER, key, spec, note=f" weight {spec.weight} route"))
        else:
            adds.append(Change(CHANGE, Kind.REAL_SERVER, key, spec, old,
                               f" weight {old.weight} -> {spec.weight}"))

    external = desired.external
    ours = (owned.services | set(desired.services)) - external
    leaving_services = {k for k in observed.services if k in owned.services
                        and k not in desired.services and k not in external}
    for key in sorted(k for k in observed.dests.keys() - desired.dests.keys()
                      if k.service in ours and k.service not in leaving_services):
        removes.append(_dest_removal(key, observed.dests[key], force))
    # keepalived drops a leaving real server when it reloads a config without
    # it; a keepalived that is only starting never touches it, so lbctl does.
    for key, spec in sorted(desired.leaving.items()):
        removes.append(_dest_removal(key, spec, force, through=IPVS if starting else KEEPALIVED))
    for key in sorted(leaving_services):
        removes.append(Change(REMOVE, Kind.SERVICE, key, old=observed.services[key]))
    for addr in sorted(observed.addresses & owned.addresses - desired.addresses - external):
        removes.append(Change(REMOVE, Kind.ADDRESS, addr))
    for path in sorted(owned.links - set(desired.links)):
        if path in observed.links:
            removes.append(Change(REMOVE, Kind.LINK, path))
    for path in sorted(owned.files - set(desired.files)):
        if path in observed.files:
            removes.append(Change(REMOVE, Kind.FILE, path))
    removes += restores
    removes += _stray_sync_daemons(desired, observed)
    # Last, after the VIPs have gone: a worker answers ARP again only once it
    # no longer holds a VIP.
    removes += _sysctl_restores(desired, observed, owned, shared_sysctls)

    if keep_leaving:
        plan.deferred, removes = removes, []
    plan.changes = stops + adds + removes
    desired_owned = Ownership.of(desired)
    plan.owned_before = owned.union(desired_owned)
    plan.owned_before.timeouts = owned.timeouts | originals
    # Draining real servers keep their service owned; they are inside it.
    plan.owned_after = desired_owned
    # Under keepalived none are lbctl's: keepalived restores its own on stop.
    plan.owned_after.timeouts = {name: value for name, value in plan.owned_before.timeouts.items()
                                 if name in desired.timeouts}
    plan.owned_before.sysctls = owned.sysctls | sysctl_originals
    plan.owned_after.sysctls = {key: value for key, value in plan.owned_before.sysctls.items()
                                if key in desired.sysctls}
    if plan.deferred:
        plan.owned_after = plan.owned_before  # still ours until they are removed
    return plan


def _same_dest(old, spec):
    return old is not None and old.same_config(spec)


def _stray_sync_daemons(desired, observed):
    """The sync daemons a pair of this cluster ran, on a balancer now alone.

    They would go on sending every connection to a peer that is gone, and
    status would report a pair's sync on one balancer.
    """
    if desired.stray_sync is None:
        return []
    return [Change(REMOVE, Kind.SYNC_DAEMON, d.role, old=d,
                   note=f" on {d.interface} syncid {d.syncid} (a pair's, and this balancer "
                        "is alone)")
            for d in sorted(observed.sync_daemons, key=lambda d: d.role)
            if (d.interface, d.syncid) == desired.stray_sync]


def _sysctl_restores(desired, observed, owned, shared=()):
    """Sysctls lbctl set that the node no longer wants, back to their values from before."""
    return [Change(REMOVE, Kind.SYSCTL, key, before, observed.sysctls.get(key),
                   f" = {before}, as before lbctl set it (now {observed.sysctls.get(key)})")
            for key, before in sorted(owned.sysctls.items())
            if key not in desired.sysctls and before is not None and key not in shared
            and observed.sysctls.get(key) not in (None, before)]


def _handover(desired, observed):
    """Edits that make what the kernel already holds of keepalived's table
    match what keepalived would create; entries it lacks keepalived adds."""
    changes = []
    for key, spec in sorted(desired.start_services.items()):
        old = observed.services.get(key)
        if old is not None and old != spec:
            changes.append(Change(CHANGE, Kind.SERVICE, key, spec, old, handover=True,
                                  note=f"{_service_note(old)} ->{_service_note(spec)}"))
    for key, spec in sorted(desired.start_dests.items()):
        old = observed.dests.get(key)
        if old is not None and not old.same_config(spec):
            why = " (keepalived brings it in once its checks pass)" if spec.weight == 0 else ""
            changes.append(Change(CHANGE, Kind.REAL_SERVER, key, spec, old, handover=True,
                                  note=f" weight {old.weight} -> {spec.weight}{why}"))
    return changes


def _timeouts(desired, observed, owned, starting=False):
    """(changes, restores, originals) for the IPVS timeouts lbctl sets itself.

    The file's timeouts are set; one lbctl set before that the file no longer
    names goes back to the kernel's value from before (`owned.timeouts`).
    Under keepalived, its lvs_timeouts does both.  keepalived remembers the
    values it finds when it first sets them and puts those back when it stops,
    so before it starts, lbctl puts back the kernel's own.
    `originals` are the kernel's values of timeouts lbctl is about to set for
    the first time, for the ownership record.
    """
    if desired.keepalived is not None:
        if not starting:
            return [], [], {}
        return [_restore(name, before, observed) for name, before in sorted(owned.timeouts.items())
                if observed.timeouts.get(name) not in (None, before)], [], {}
    changes, originals = [], {}
    for name, value in sorted(desired.timeouts.items()):
        now = observed.timeouts.get(name)
        if name not in owned.timeouts and now is not None:
            originals[name] = now
        if now != value:
            changes.append(Change(CHANGE, Kind.IPVS_TIMEOUT, name, value, now,
                                  f" = {value}s (now {_seconds_or_unset(now)})"))
    restores = [_restore(name, before, observed) for name, before in sorted(owned.timeouts.items())
                if name not in desired.timeouts
                and observed.timeouts.get(name) not in (None, before)]
    return changes, restores, originals


def _restore(name, before, observed):
    now = observed.timeouts.get(name)
    return Change(CHANGE, Kind.IPVS_TIMEOUT, name, before, now,
                  f" = {before}s, as before lbctl set it (now {now}s)")


def _seconds_or_unset(value):
    return "unknown" if value is None else f"{value}s"


STOP_NOTES = {Kind(entry.name): f" ({entry.stops})" for entry in DAEMONS}


def _daemon_stops(desired, observed):
    """Daemons that run and the file no longer wants, in the reverse of the
    order they start in."""
    return [Change(REMOVE, Kind(name), "stop", old=observed.daemons[name],
                   note=STOP_NOTES.get(Kind(name), ""))
            for name in reversed(DAEMON_ORDER)
            if name in observed.daemons and name not in desired.daemons]


def _daemon_starts_and_reloads(desired, observed, file_changes):
    """Every start before any reload, each in DAEMON_ORDER: a daemon that
    depends on another (BIRD on keepalived's announce hook) starts after it,
    and a running keepalived's reload, which has BIRD read the offers again,
    finds a BIRD that was down running again."""
    starts, reloads = [], []
    for name in DAEMON_ORDER:
        daemon = desired.daemons.get(name)
        if daemon is None:
            continue
        running = observed.daemons.get(name)
        if running is None:
            starts.append(Change(ADD, Kind(name), "start", daemon))
            continue
        why = _why_reload(daemon, running, file_changes)
        if why:
            reloads.append(Change(CHANGE, Kind(name), "reload", daemon, running, note=why))
    return starts + reloads


def _why_reload(daemon, running, file_changes):
    changed = sorted(c.key for c in file_changes if c.kind == Kind.FILE and c.key in daemon.files)
    if changed:
        return f" (changed: {', '.join(changed)})"
    if not running.digest:
        return (" (no record of what it last loaded: the first apply by this lbctl, or one "
                f"cut short before {daemon.name} took the files)")
    if running.digest != daemon.digest:
        return (" (it is not known to run the files on disk: a reload was lost, or they were "
                "changed by hand)")
    return ""


def _dest_removal(key, spec, force, through=IPVS):
    """How a real server the file no longer lists leaves: at once when idle or
    forced, else weight 0 first and deleted by a later apply once idle."""
    if force:
        return Change(REMOVE, Kind.REAL_SERVER, key, old=spec, note=" (forced)", through=through)
    busy = spec.in_use(key.service.protocol)
    what = "connections" if key.service.protocol == "udp" else "active connections"
    if spec.weight > 0 and (busy == 0 and through == IPVS):
        return Change(DRAIN, Kind.REAL_SERVER, key, old=spec,
                      note=" (idle: weight 0, then delete)", through=through)
    if spec.weight > 0 and busy:
        return Change(DRAIN, Kind.REAL_SERVER, key, old=spec, through=through,
                      note=f" (weight {spec.weight} -> 0, drain {busy} {what})")
    if busy:
        return Change(DRAINING, Kind.REAL_SERVER, key, old=spec, through=through,
                      note=f" draining (weight 0, {busy} {what};"
                           " deleted once idle, or now with --force)")
    return Change(REMOVE, Kind.REAL_SERVER, key, old=spec, note=" (idle)", through=through)


# How `apply --keep-leaving` names what it held back, and how a balancer names
# the real servers still draining; `apply --all` looks for both.
DEFERRED_MARK = "left for the next apply"
DRAINING_MARK = "still draining on this balancer"
# How `plan --fingerprint` names the plan's fingerprint, on standard error.
FINGERPRINT_MARK = "plan fingerprint"


def fingerprint(plan):
    """What the plan will do, as a short digest: apply --all shows each node's
    plan, and after the question each node applies only if its plan is
    still the one shown (--expect-plan).  Removals held back for a later
    apply count as in the plan: the worker's first pass of apply --all
    matches the plan shown before it.  Values that move on their own (a
    weight now, a count of connections) are left out, and a real server
    that drains or goes at once is removed either way."""
    import hashlib

    lines = []
    for change in plan.changes + plan.deferred:
        action = change.action
        if change.kind == Kind.REAL_SERVER and action in (DRAIN, DRAINING, REMOVE):
            action = REMOVE
        lines.append(f"{action} {change.kind} {change.key}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def format_plan(plan):
    if plan.empty:
        return f"{plan.role} {plan.node} of cluster {plan.cluster}: no changes"
    lines = [f"{plan.role} {plan.node} of cluster {plan.cluster}:"]
    lines += [f"  {change}" for change in plan.changes]
    add, change, remove = plan.counts()
    lines.append(f"{add} to add, {change} to change, {remove} to remove.")
    return "\n".join(lines)
