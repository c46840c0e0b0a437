"""keepalived.conf for a balancer, and where lbctl keeps keepalived's files."""

import os
from dataclasses import dataclass

from lbctl.render.systemd import systemd_unit_name
from lbctl.render.templates import render, template_text

SCRIPT_USER = "lbctl"  # unprivileged user for health checks and notify hooks
CHECK_SCRIPT = "lbctl-check"
NOTIFY_SCRIPT = "lbctl-notify"


@dataclass(frozen=True)
class KeepalivedLayout:
    """keepalived's files for one cluster, as paths inside the node's root.

    `real()` gives the path keepalived itself sees, which is what goes into
    keepalived.conf; in the lab each node has its own root folder.
    """

    cluster: str
    root: str = "/"

    @property
    def etc_dir(self):
        return f"/etc/lbctl/{self.cluster}"

    @property
    def conf(self):
        return f"{self.etc_dir}/keepalived.conf"

    @property
    def check(self):
        return f"{self.etc_dir}/{CHECK_SCRIPT}"

    @property
    def notify(self):
        return f"{self.etc_dir}/{NOTIFY_SCRIPT}"

    @property
    def run_dir(self):
        return f"/run/lbctl/{self.cluster}"

    @property
    def state_dir(self):
        """Written by the notify hooks and checks, as the script user."""
        return f"{self.run_dir}/state"

    @property
    def unit(self):
        return systemd_unit_name(self.cluster, "keepalived")

    def pid_file(self, process="keepalived"):
        return f"{self.run_dir}/{process}.pid"

    def real(self, path):
        return os.path.join(self.root, path.lstrip("/"))


def render_keepalived_conf(cluster, node, interface, layout, draining=()):
    """`draining`: DestKeys of real servers the file dropped that still have
    connections; they stay at weight 0 until idle."""
    balancer = cluster.balancers[node]
    peers = [b.address for name, b in cluster.balancers.items() if name != node]
    leaving = {svc.name: sorted((key.address, key.port) for key in draining
                                if key.service == svc.key)
               for svc in cluster.services.values()}
    return render("keepalived", "keepalived.conf.j2",
                  cluster=cluster.name, node=node, interface=interface,
                  address=balancer.address, priority=balancer.priority or 100,
                  peer=peers[0] if peers else None, vrrp=cluster.vrrp, vips=cluster.vips,
                  preempt_delay=f"{cluster.health_settle_seconds + 1:g}",
                  services=list(cluster.services.values()), leaving=leaving,
                  timeouts=cluster.ipvs_timeouts,
                  script_user=SCRIPT_USER,
                  notify=layout.real(layout.notify), check=layout.real(layout.check),
                  state_dir=layout.real(layout.state_dir))


def render_keepalived_unit(layout, ipvs_sysctls=None, vips=(), keepalived="/usr/sbin/keepalived",
                           ip="/usr/sbin/ip"):
    """The unit; `ipvs_sysctls` are set after ip_vs loads (sysctl.d runs too early),
    and `vips` (Addresses) are the ones a single balancer holds itself."""
    settings = [f"{key}={' '.join(value.split())}" for key, value in (ipvs_sysctls or {}).items()]
    return render("systemd", "lbctl-keepalived.service", cluster=layout.cluster,
                  argv=" ".join(keepalived_argv(layout, keepalived)), settings=settings,
                  state_dir=layout.real(layout.state_dir), script_user=SCRIPT_USER,
                  vips=vips, ip=ip)


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
