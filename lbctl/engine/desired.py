"""The state one node should have, from the validated cluster."""

from dataclasses import dataclass

from lbctl.config.model import DestKey, Mode
from lbctl.errors import NodeError
from lbctl.render.sysctl import parse_sysctl_conf, render_worker_sysctl
from lbctl.layout import (
    ANNOUNCE_SCRIPT, CHECK_SCRIPT, HOOK_ORDER, NOTIFY_SCRIPT, TAKEOVER_SCRIPT, Layout,
)
from lbctl.render.systemd import render_balancer_unit, render_exporter_unit, render_worker_unit
from lbctl.state import (
    BIRD, EXPORTER, KEEPALIVED, Address, DaemonSpec, DestSpec, FileSpec, NodeState, ServiceSpec,
)

KEEPALIVED_SCRIPTS = (CHECK_SCRIPT, NOTIFY_SCRIPT, HOOK_ORDER)
# A failover pair's sync daemon sends a connection when it becomes
# established and at each later change of state, and re-sends one that goes
# on every 10 s (at its next packet).  The kernel's default counts packets
# instead, and sends a TCP connection at its third incoming packet: a client
# that had finished its handshake but not sent yet (a server-speaks-first
# protocol waits for the greeting) was lost if the VIP moved in between.
# With a sync period of 0 and a refresh period, the count is not looked at.
SYNC_REFRESH_SECONDS = 10


def pair_sysctls(cluster):
    """The sync settings of a failover pair's balancers.  The kernel skips a
    connection whose timer moved less than the refresh period since it was
    last sent, and measures the first send from the connection's start: with
    a timeout below the period a new connection would not be sent at all, so
    the period is never above the file's tcp and udp timeouts."""
    timeouts = [cluster.ipvs_timeouts[name] for name in ("tcp", "udp")
                if name in cluster.ipvs_timeouts]
    # The period first: with the threshold's period of 0 and no refresh
    # period yet, the kernel would send a connection only at its third packet.
    return {"net.ipv4.vs.sync_refresh_period": str(min([SYNC_REFRESH_SECONDS, *timeouts])),
            "net.ipv4.vs.sync_threshold": "3\t0"}


# Every balancer: a packet for a connection whose real server was deleted
# expires that connection and is scheduled afresh, instead of being dropped.
# Without it a client that reuses a source port of a recently closed
# connection to a removed worker (IPVS keeps it in FIN_WAIT for two minutes)
# sees its SYNs vanish until the entry times out.
#
# And a persistence template whose real server has weight 0 (draining, or
# inhibited by a failed check) expires instead of sending its client there
# for as long as the client keeps coming back: without it, a drain under
# persistence never ends.
BALANCER_SYSCTLS = {"net.ipv4.vs.expire_nodest_conn": "1",
                    "net.ipv4.vs.expire_quiescent_template": "1"}
# An ECMP balancer holds the VIPs on lo, as a worker does, and must not
# answer ARP for them on the LAN: the router routes them to it.  And the
# router may move a flow to another balancer mid-stream (a balancer joins or
# leaves): IPVS there must take a packet that is not a SYN as the start of a
# connection (sloppy_tcp, sloppy_sctp) and schedule ICMP errors too, so mh's
# hash sends it on to the same worker.
ECMP_SYSCTLS = {"net.ipv4.conf.all.arp_ignore": "1",
                "net.ipv4.conf.all.arp_announce": "2",
                "net.ipv4.vs.sloppy_tcp": "1",
                "net.ipv4.vs.sloppy_sctp": "1",
                "net.ipv4.vs.schedule_icmp": "1"}


def find_node(cluster, local_addresses, requested=None):
    """The node name this host is: --node if given, else by its own addresses."""
    nodes = cluster.node_names_by_address()
    if requested is not None:
        if requested not in cluster.balancers and requested not in cluster.workers:
            known = ", ".join(sorted(list(cluster.balancers) + list(cluster.workers)))
            raise NodeError(f"node {requested!r} is not in {cluster.source} (nodes: {known})")
        # Never trust the name alone: a wrong host name in ssh.hosts or a swapped
        # DHCP lease would otherwise give one node another's plan, removals included.
        address = (cluster.balancers.get(requested) or cluster.workers[requested]).address
        if address not in local_addresses:
            raise NodeError(f"node {requested} has address {address}, which this host does not "
                            "have: is this the right machine? (a static address is needed; "
                            "check ssh.hosts and ~/.ssh/config)")
        return requested
    matches = sorted({nodes[a] for a in local_addresses if a in nodes})
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NodeError(f"none of this host's addresses is a node address in {cluster.source}; "
                        "run on a node of the cluster (a node is known by its address)")
    raise NodeError(f"this host has the addresses of several nodes ({', '.join(matches)}); "
                    "pass --node NAME")


def role_of(cluster, node):
    return "balancer" if node in cluster.balancers else "worker"


# First line of a balancer's saved copy.  The copy is the cluster file itself,
# so its format is the file's; the number is there for a later lbctl that
# saves more than the file to tell old copies from new.
SAVED_COPY_HEADER = ("# lbctl saved-copy format 1: the cluster file as last applied here, "
                     "read by the boot unit; edit the file you apply, not this copy\n")


def strip_saved_copy_header(text):
    """The file as the user wrote it: the boot unit applies the saved copy itself,
    and its header must not be saved again under a new one."""
    while text.startswith("# lbctl saved-copy format "):
        text = text.partition("\n")[2]
    return text


@dataclass(frozen=True)
class BootApply:
    """What a balancer's boot unit needs: the file to keep and the Python that
    runs lbctl.  `announce`: that Python may also announce a single balancer's
    VIPs from keepalived's unit (False where it is not root's alone)."""

    config_text: str
    python: str
    announce: bool = True


def _enable(state, purpose, text):
    """lbctl's units: "vips" on a worker; "balancer", or "keepalived" (with
    "bird" in mode ecmp), and "exporter" on a balancer."""
    layout = Layout(state.cluster)
    state.files[layout.unit_file(purpose)] = FileSpec(text)
    state.links[layout.unit_wanted(purpose)] = layout.unit_file(purpose)


def leaving_real_servers(cluster, ipvs_services):
    """{DestKey: DestSpec} of real servers the kernel holds for a service of the
    file that the file no longer lists."""
    listed = {svc.key: {(rs.address, svc.port) for rs in svc.real_servers}
              for svc in cluster.services.values()}
    leaving = {}
    for svc in ipvs_services:
        wanted = listed.get(svc.key)
        if wanted is None:
            continue
        for d in svc.dests:
            if (d.address, d.port) not in wanted:
                leaving[DestKey(svc.key, d.address, d.port)] = DestSpec(
                    d.weight, d.forward, d.active, d.inactive)
    return leaving


def _saved_copy(state, cluster, boot):
    """The file as applied, kept on a balancer: its boot unit applies it, and
    drain, undrain, status and the exporter read names and weights from it."""
    if boot is None:
        return
    state.files[Layout(cluster.name).saved_copy] = FileSpec(SAVED_COPY_HEADER + boot.config_text)
    if cluster.exporter is not None:
        listen = cluster.exporter
        own = cluster.balancers[state.node].address
        if listen.startswith("node:"):
            listen = f"{own}:{listen.partition(':')[2]}"
        _enable(state, "exporter", render_exporter_unit(
            cluster.name, state.node, boot.python, listen, _scrapers(cluster, own, listen)))
        # Restarted when its unit changes; it reads the saved copy at each scrape.
        unit = Layout(cluster.name).unit_file("exporter")
        _run_daemon(state, EXPORTER, unit, [unit])


def _scrapers(cluster, own, listen):
    """Who may reach the exporter (systemd's IPAddressAllow=): anyone when the
    file says `public: true` (None: no list), this host when it listens on
    127.0.0.1, else this host and the file's network."""
    from lbctl.config.model import split_listen

    if cluster.exporter_public:
        return None
    address, _port = split_listen(listen)
    return ["localhost"] if address.is_loopback else ["localhost", str(cluster.network)]


def desired_keepalived_balancer(cluster, node, interface, layout, leaving=None, force=False,
                                drained=frozenset(), boot=None, slots=None):
    """keepalived runs this balancer: lbctl writes its files and keeps it running.

    keepalived owns the VIPs (VRRP) and the IPVS table (its checkers add and
    remove real servers), so those are external to lbctl's plan here.

    A real server dropped from the file would be deleted by keepalived at its
    next reload, and every connection to it cut.  So while it still has
    connections (`leaving`, from the kernel) it stays in keepalived's config
    at weight 0, without checks, and a later apply drops it once it is idle;
    `force` drops it at once.  `drained` (DestKeys) stay in at weight 0,
    checks and all, until `lbctl undrain`; `slots` ({DestKey: weight},
    drains.slot_weights()) are those of them whose mh slots the announce hook
    gives back (mode ecmp).
    """
    from lbctl.render.keepalived import (
        render_keepalived_conf, render_keepalived_unit, render_takeover_rules, script_text,
    )

    state = NodeState("balancer", node, cluster.name)
    state.leaving = dict(leaving or {})
    if not force:
        state.draining = {key for key, spec in state.leaving.items()
                          if spec.in_use(key.service.protocol)}
    state.drained = set(drained)
    state.sysctls = dict(BALANCER_SYSCTLS)
    if cluster.mode == Mode.FAILOVER:
        state.sysctls.update(pair_sysctls(cluster))
    elif cluster.mode == Mode.ECMP:
        state.sysctls.update(ECMP_SYSCTLS)
    state.files[layout.conf] = FileSpec(render_keepalived_conf(cluster, node, interface, layout,
                                                               state.draining, state.drained))
    _saved_copy(state, cluster, boot)
    scripts = {f"{layout.etc_dir}/{name}": name for name in KEEPALIVED_SCRIPTS}
    if cluster.mode == Mode.FAILOVER:
        scripts[layout.takeover] = TAKEOVER_SCRIPT
        state.files[layout.takeover_rules] = FileSpec(render_takeover_rules(cluster, layout))
    if cluster.mode == Mode.ECMP:
        scripts[layout.announce] = ANNOUNCE_SCRIPT
        _ecmp_files(state, cluster, node, interface, layout, slots or {})
    for path, name in scripts.items():
        state.files[path] = FileSpec(script_text(name), 0o755)
    vips = {Address(vip, "lo" if cluster.mode == Mode.ECMP else interface) for vip in cluster.vips}
    if cluster.mode == Mode.FAILOVER:
        state.external = vips  # VRRP moves them between the pair
    else:
        state.addresses = vips  # nothing to fail over to: lbctl holds them itself
    if cluster.mode == Mode.SINGLE:
        # keepalived starts the pair's sync daemons, but a reload into a
        # config without them leaves them running (only its stop ends them).
        state.stray_sync = (interface, cluster.vrrp.router_id)
    # A pair's VIPs come from VRRP; the others' unit puts them back at boot.
    boot_vips = [] if cluster.mode == Mode.FAILOVER else sorted(vips)
    # On the LAN (mode single) they are announced too; on lo (mode ecmp) never.
    announcer = None
    if boot is not None and boot.announce and cluster.mode == Mode.SINGLE:
        announcer = boot.python
    _enable(state, "keepalived", render_keepalived_unit(layout, state.sysctls, boot_vips,
                                                        bird=cluster.mode == Mode.ECMP,
                                                        python=announcer))
    programs = frozenset(svc.health.command[0] for svc in cluster.services.values()
                         if svc.health is not None and svc.health.kind == "exec")
    _run_daemon(state, KEEPALIVED, layout.conf,
                [layout.conf, *scripts, layout.takeover_rules, layout.announce_map], programs)
    if cluster.mode == Mode.ECMP:
        _run_daemon(state, BIRD, layout.bird_conf, [layout.bird_conf])
    state.external |= {svc.key for svc in cluster.services.values()}
    for svc in cluster.services.values():
        state.start_services[svc.key] = ServiceSpec(svc.scheduler, svc.persistence, svc.flags)
        for rs in svc.real_servers:
            # alpha and inhibit_on_failure: a checked server starts at weight 0
            # and gets its weight once a check passes.
            key = DestKey(svc.key, rs.address, svc.port)
            weight = 0 if svc.health or key in state.drained else rs.weight
            state.start_dests[key] = DestSpec(weight)
    return state


def _run_daemon(state, name, config, files, programs=frozenset()):
    """The daemon `name` runs on `files` (those of them this node has), which
    it reads again when one changes; the digest tells whether it runs them."""
    import hashlib

    files = frozenset(path for path in files if path in state.files)
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{state.files[path].content}\0".encode())
    state.daemons[name] = DaemonSpec(name, config, files, programs, digest.hexdigest())


def _ecmp_files(state, cluster, node, interface, layout, slots):
    """Mode ecmp: BIRD's config and unit, and what keepalived's announce hook
    reads: the map of which services each VIP carries, and the drained
    workers' mh slots."""
    from lbctl.render.bird import (
        render_announce_map, render_announce_slots, render_bird_conf, render_bird_unit,
    )

    state.files[layout.bird_conf] = FileSpec(render_bird_conf(cluster, node, interface, layout))
    state.files[layout.announce_map] = FileSpec(render_announce_map(cluster))
    # (Not a file of keepalived's: the hook reads it at each run.)
    state.files[layout.announce_slots] = FileSpec(render_announce_slots(slots),
                                                  lock=layout.announce_slots_lock)
    _enable(state, "bird", render_bird_unit(layout))


def desired_balancer(cluster, node, interface, boot=None, drained=frozenset()):
    state = NodeState("balancer", node, cluster.name)
    state.drained = set(drained)
    state.sysctls = dict(BALANCER_SYSCTLS)
    # (Under keepalived, its lvs_timeouts sets them at every start instead.)
    state.timeouts = dict(cluster.ipvs_timeouts)
    # A single balancer holds the VIPs itself; it answers ARP for them.
    state.addresses = {Address(vip, interface) for vip in cluster.vips}
    for svc in cluster.services.values():
        state.services[svc.key] = ServiceSpec(svc.scheduler, svc.persistence, svc.flags)
        for rs in svc.real_servers:
            key = DestKey(svc.key, rs.address, svc.port)
            state.dests[key] = DestSpec(0 if key in state.drained else rs.weight)
    if boot is not None:
        # At boot the balancer applies a saved copy of the file, so a reboot
        # brings back the VIPs and the IPVS table without anyone logging in.
        _saved_copy(state, cluster, boot)
        _enable(state, "balancer", render_balancer_unit(cluster.name, node,
                                                        Layout(cluster.name).saved_copy,
                                                        boot.python))
    return state


def desired_worker(cluster, node):
    state = NodeState("worker", node, cluster.name)
    worker = cluster.workers[node]
    vips = sorted({s.vip for s in cluster.services.values()
                   if any(rs.address == worker.address for rs in s.real_servers)})
    state.addresses = {Address(vip, "lo") for vip in vips}
    sysctl_text = render_worker_sysctl(cluster.name)
    state.sysctls = parse_sysctl_conf(sysctl_text)
    sysctl_conf = Layout(cluster.name).sysctl_conf
    state.files[sysctl_conf] = FileSpec(sysctl_text)
    _enable(state, "vips", render_worker_unit(cluster.name, vips, sysctl_conf))
    return state


def desired_state(cluster, node, interface, boot=None, layout=None, leaving=None, force=False,
                  drained=frozenset(), slots=None):
    """`layout` (a Layout) is needed on balancers of keepalived clusters,
    and `leaving` (leaving_real_servers()) there tells which real servers drain.
    `drained`: DestKeys `lbctl drain` took out (drains.drained_dests()), and
    `slots` the weights of their mh slots (drains.slot_weights())."""
    if role_of(cluster, node) == "worker":
        return desired_worker(cluster, node)
    if cluster.engine == "keepalived":
        return desired_keepalived_balancer(cluster, node, interface, layout, leaving, force,
                                           drained, boot, slots)
    return desired_balancer(cluster, node, interface, boot, drained)
