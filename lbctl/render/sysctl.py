"""The worker's sysctl.d file, and the key/value pairs it sets."""

from lbctl.render.templates import render

WORKER_SYSCTL_TEMPLATE = "90-lbctl-dr-worker.conf"


def render_worker_sysctl(cluster_name):
    return render("sysctl", WORKER_SYSCTL_TEMPLATE, cluster=cluster_name)


def parse_sysctl_conf(text):
    """`key = value` lines of a sysctl.d file, in order, as a dict."""
    settings = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        settings[key.strip()] = value.strip()
    return settings
