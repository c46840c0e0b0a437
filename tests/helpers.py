"""Small builders shared by the unit tests."""

import json
import time
from pathlib import Path

from lbctl.config.load import parse_document
from lbctl.config.validate import validate

PI_SINGLE = """\
cluster: pi-web
balancers:
  lb1: {address: 192.168.100.2, interface: eth0}
workers:
  pi1: {address: 192.168.100.3}
  pi2: {address: 192.168.100.4}
  pi3: {address: 192.168.100.6, weight: 2}
services:
  web: {vip: 192.168.100.10, port: 80, scheduler: wrr}
  dns: {vip: 192.168.100.11, port: 53, protocol: udp, scheduler: rr, workers: [pi1, pi2]}
"""

# Mode ecmp: three active balancers announcing the VIPs to the router over BGP.
PI_ECMP = """\
cluster: pi-web
mode: ecmp
bgp:
  as: 65001
  router: {address: 192.168.100.1, as: 65000}
balancers:
  lb1: {address: 192.168.100.2, interface: eth0}
  lb2: {address: 192.168.100.5, interface: eth0}
  lb3: {address: 192.168.100.7, interface: eth0}
workers:
  pi1: {address: 192.168.100.3}
  pi2: {address: 192.168.100.4}
services:
  web: {vip: 10.200.0.10, port: 80, scheduler: mh, scheduler_flags: [mh-port]}
  dns: {vip: 10.200.0.11, port: 53, protocol: udp, scheduler: mh}
"""


def routed(text):
    """The file's services marked `routed: true`: what a cluster that leaves
    mode ecmp with its VIPs off the LAN must say (the router routes them)."""
    return text.replace(", port: ", ", routed: true, port: ")


def cluster_from(text=PI_SINGLE, path="cluster.yaml"):
    return validate(parse_document(text, path))


def keepalived_findings(tmp_path, text):
    """What keepalived's own config test says of the keepalived.conf lbctl
    renders for `text`: (conf, findings), through the real adapter."""
    from lbctl.render.keepalived import (
        SCRIPT_USER, render_keepalived_conf, script_text,
    )
    from lbctl.layout import Layout

    cluster = cluster_from(text)
    layout = Layout(cluster.name, str(tmp_path))
    conf = render_keepalived_conf(cluster, "lb1", "eth0", layout)
    # lbctl's script user may not exist on this host, and keepalived drops
    # every MISC_CHECK unread without one: run them as nobody, with the scripts
    # where the config names them.
    for name in ("lbctl-check", "lbctl-notify"):
        script = tmp_path / "etc/lbctl" / cluster.name / name
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(script_text(name))
        script.chmod(0o755)
    conf = conf.replace(f"script_user {SCRIPT_USER}\n", "script_user nobody\n")
    return conf, keepalived_test(tmp_path, conf, cluster.name)


def install_hook(folder, name):
    """A keepalived hook of lbctl's in `folder`, with the helpers it sources
    from beside it, as apply installs them; its path."""
    from lbctl.layout import HOOK_ORDER
    from lbctl.render.keepalived import script_text

    for each in (HOOK_ORDER, name):
        script = folder / each
        script.write_text(script_text(each))
        script.chmod(0o755)
    return script


def keepalived_test(tmp_path, conf, cluster_name="pi-web"):
    """keepalived's findings on a conf edited after keepalived_findings()."""
    from lbctl.adapters.keepalived import KeepalivedDaemon
    from lbctl.layout import Layout

    return KeepalivedDaemon(Layout(cluster_name, str(tmp_path))).test(conf)


def node_status(role="balancer", **fields):
    """A whole `status --json` answer of a node of pi-web, `fields` changed."""
    status = {"clusters": [{"cluster": "pi-web", "node": None, "role": role}],
              "services": [], "vips_on_lo": [], "ipvs_loaded": True, "drains": [],
              "arp": {"all": {"arp_ignore": "0", "arp_announce": "0"}}, "keepalived": {}}
    return {**status, **fields}


def keepalived_status(**fields):
    """One cluster's entry under a status's "keepalived", `fields` changed."""
    return {"pair": True, "mode": "failover", "vrrp": None, "transitions": 0, "health": [],
            "advertised_addresses": None, "running": True, **fields}


def service_status(service="tcp 192.168.100.10:80", real_servers=(), **fields):
    """One IPVS service as status reports it, its real servers given as
    {"address", "weight"} (the rest idle)."""
    servers = [{"forward": "route", "active": 0, "inactive": 0, "connections": 0,
                "drained": False, "in_bytes": 0, "conns_per_s": 0, "in_bytes_per_s": 0, **rs}
               for rs in real_servers]
    return {"service": service, "scheduler": "wrr", "persistence": 0, "connections": 0,
            "conns_per_s": 0, "in_packets": 0, "in_bytes": 0, "in_packets_per_s": 0,
            "in_bytes_per_s": 0, "real_servers": servers, **fields}


def applied_here(root, text):
    """A cluster applied on this balancer before, as apply leaves it: its
    ownership record and its saved copy under `root`."""
    from lbctl.engine.desired import SAVED_COPY_HEADER
    from lbctl.layout import Layout

    cluster = cluster_from(text)
    layout = Layout(cluster.name, str(root))
    for path, content in ((layout.real(layout.saved_copy), SAVED_COPY_HEADER + text),
                          (layout.real(layout.ownership_record), json.dumps({"node": "lb1"}))):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    return cluster


class KeepalivedRunning:
    """A live process that status takes for the cluster's keepalived: its
    command line names the cluster's keepalived.conf under `root`, and its
    pid is in keepalived's pid file there.  A context manager."""

    def __init__(self, root, cluster="pi-web"):
        from lbctl.layout import Layout

        self.layout = Layout(cluster, str(root))

    def __enter__(self):
        import subprocess
        import sys

        conf = self.layout.real(self.layout.conf)
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", conf])
        pid_file = Path(self.layout.real(self.layout.pid_file()))
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{self.proc.pid}\n")
        # Popen may return while the child's exec is still setting up its new
        # memory, whose command line then reads empty.
        from lbctl.adapters.process import DaemonProcess

        seen = DaemonProcess(self.layout, "keepalived", self.layout.conf)
        deadline = time.monotonic() + 10
        while seen.pid() != self.proc.pid:
            assert time.monotonic() < deadline, "the stand-in keepalived never showed its config"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
