"""keepalived.conf for a balancer, and the hooks it runs."""


from lbctl.config.model import Mode
from lbctl.render.bird import announce_key
from lbctl.render.templates import render, template_text

SCRIPT_USER = "lbctl"  # unprivileged user for health checks and notify hooks


PREEMPT_DELAY_MAX = 1000  # seconds; keepalived drops a longer preempt_delay


def preempt_delay_seconds(cluster):
    """A returning master takes the VIPs back only once its own checks could
    have found every healthy worker, or it would serve from a table that
    lacks them.  Every check runs with `warmup 0`, so its first probe comes a
    second after keepalived starts: `rise` passes take no longer than the
    settle time plus that second.  Checks far apart (hourly) are capped at
    keepalived's limit: past it keepalived drops the value and preempts at
    once."""
    return min(cluster.health_settle_seconds + 1, PREEMPT_DELAY_MAX)


def render_keepalived_conf(cluster, node, interface, layout, draining=(), drained=()):
    """`draining`: DestKeys of real servers the file dropped that still have
    connections; they stay at weight 0 until idle.  `drained`: DestKeys
    `lbctl drain` took out; weight 0, checks still running."""
    balancer = cluster.balancers[node]
    pair = cluster.mode == Mode.FAILOVER
    anchor = vrrp_anchor(cluster) if pair else None
    peers = [b.address for name, b in cluster.balancers.items() if name != node] if pair else []
    leaving = {svc.name: sorted((key.address, key.port) for key in draining
                                if key.service == svc.key)
               for svc in cluster.services.values()}
    return render("keepalived", "keepalived.conf.j2",
                  cluster=cluster.name, node=node, interface=interface,
                  address=balancer.address, priority=balancer.priority or 100,
                  peer=peers[0] if peers else None, vrrp=cluster.vrrp, vips=cluster.vips,
                  preempt_delay=f"{preempt_delay_seconds(cluster):g}",
                  services=list(cluster.services.values()), leaving=leaving,
                  drained={(key.service, key.address) for key in drained},
                  timeouts=cluster.ipvs_timeouts,
                  script_user=SCRIPT_USER,
                  notify=layout.real(layout.notify), check=layout.real(layout.check),
                  anchor=anchor,
                  takeover=f"{layout.real(layout.takeover)} {layout.real(layout.takeover_rules)} "
                           f"{layout.nft_table} {anchor}",
                  state_dir=layout.real(layout.state_dir),
                  announce=" ".join(layout.announce_argv()) if cluster.mode == Mode.ECMP else None,
                  checker_fifo=layout.real(layout.checker_fifo),
                  announce_keys={svc.name: announce_key(svc) for svc in cluster.services.values()})


def vrrp_anchor(cluster):
    """The one address a pair's VRRP adverts carry: fixed by the router id, so
    no edit of the file changes what the two balancers advertise.

    keepalived 2.2.7 ignores an advert whose addresses differ from its own
    config: with the VIPs in the adverts, a balancer reloaded with other VIPs
    would stop hearing its peer and take the VIPs over.  The VIPs go in
    virtual_ipaddress_excluded (added and announced the same, not advertised);
    the anchor sits on the master's lo with host scope, so nothing routes to it."""
    return f"169.254.255.{cluster.vrrp.router_id}"


def render_takeover_rules(cluster, layout):
    """The nftables rules of a pair's takeover grace: every TCP VIP:port.

    (UDP needs none: IPVS schedules any UDP packet it does not know, and the
    kernel answers no reset for it.)"""
    endpoints = sorted({(svc.vip, svc.port) for svc in cluster.services.values()
                        if svc.protocol == "tcp"})
    return render("keepalived", "takeover.nft.j2", cluster=cluster.name, table=layout.nft_table,
                  endpoints=[f"{vip} . {port}" for vip, port in endpoints])


def render_keepalived_unit(layout, ipvs_sysctls=None, vips=(), keepalived="/usr/sbin/keepalived",
                           ip="/usr/sbin/ip", bird=False, python=None):
    """The unit; `ipvs_sysctls` are set after ip_vs loads (sysctl.d runs too early),
    and `vips` (Addresses) are the ones the balancer holds itself (after the
    sysctls: in mode ecmp those keep it from answering ARP for them).
    `bird`: mode ecmp, where BIRD runs with keepalived.  `python`: the
    interpreter that announces `vips` once they are back (mode single)."""
    settings = [f"{key}={' '.join(value.split())}" for key, value in (ipvs_sysctls or {}).items()]
    companion = None
    if bird:
        companion = {"unit": layout.bird_unit, "announce_dir": layout.real(layout.announce_dir),
                     "sync": " ".join(layout.announce_argv("sync")),
                     "reset": " ".join(layout.announce_argv("reset"))}
    return render("systemd", "lbctl-keepalived.service", cluster=layout.cluster,
                  argv=" ".join(keepalived_argv(layout, keepalived)), settings=settings,
                  state_dir=layout.real(layout.state_dir), script_user=SCRIPT_USER,
                  vips=vips, ip=ip, bird=companion, python=python)


def keepalived_argv(layout, keepalived="/usr/sbin/keepalived"):
    """keepalived in the foreground, logging to its output only (the journal, or a
    log file in the lab), with this cluster's own files."""
    return [keepalived, "--dont-fork", "--log-console", "--no-syslog", "--log-detail",
            "--use-file", layout.real(layout.conf),
            "--pid", layout.real(layout.pid_file()),
            "--vrrp_pid", layout.real(layout.pid_file("vrrp")),
            "--checkers_pid", layout.real(layout.pid_file("checkers"))]


def script_text(name):
    return template_text("keepalived", name)
