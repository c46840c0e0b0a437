"""The boot units: a worker's VIPs on lo, a balancer's whole configuration."""

from lbctl.render.templates import render

WORKER_UNIT_TEMPLATE = "lbctl-worker-vips.service"
BALANCER_UNIT_TEMPLATE = "lbctl-balancer.service"
EXPORTER_UNIT_TEMPLATE = "lbctl-exporter.service"


def render_worker_unit(cluster_name, vips, sysctl_file, ip="/usr/sbin/ip", sysctl="/usr/sbin/sysctl"):
    return render("systemd", WORKER_UNIT_TEMPLATE, cluster=cluster_name, vips=vips,
                  sysctl_file=sysctl_file, ip=ip, sysctl=sysctl)


def render_balancer_unit(cluster_name, node, config_path, python):
    return render("systemd", BALANCER_UNIT_TEMPLATE, cluster=cluster_name, node=node,
                  config=config_path, python=python)


def render_exporter_unit(cluster_name, node, python, listen, scrapers=None):
    """`scrapers`: the addresses and networks that may reach it (IPAddressAllow=),
    or None for anyone."""
    return render("systemd", EXPORTER_UNIT_TEMPLATE, cluster=cluster_name, node=node,
                  python=python, listen=listen, scrapers=scrapers)


def exec_start_lines(unit_text, key="ExecStart"):
    """The commands of `key` (ExecStart, ExecStartPre) the unit runs, as argument
    lists, in order."""
    return [line.partition("=")[2].split() for line in unit_text.splitlines()
            if line.startswith(f"{key}=")]
