"""Plain YAML data to a Cluster, reporting every problem at once.

Each check names the path in the file, what was found and what is allowed.
Strings that other files will carry (names, interface names) are held to
tight patterns, so nothing from the config can inject text into generated
sysctl, systemd or keepalived files.
"""

from lbctl.config.access import check_exporter, check_ssh
from lbctl.config.bgp import check_bgp, check_ecmp, with_mh_fallback
from lbctl.config.checker import Checker
from lbctl.config.model import Cluster, Ssh
from lbctl.config.services import check_ipvs_timeouts, check_services
from lbctl.config.topology import (
    check_balancers, check_mode, check_network, check_vrrp, check_workers, cross_checks,
)
from lbctl.errors import ConfigError

TOP_KEYS = {"cluster", "network", "balancers", "workers", "services", "vrrp", "ipvs", "ssh",
            "exporter", "mode", "bgp"}


def validate(doc):
    c = Checker(doc)
    top = c.mapping(doc.data, (), TOP_KEYS, required=("cluster", "balancers", "workers", "services"))
    if top is None:
        raise ConfigError(c.errors)
    cluster_name = top.get("cluster")
    if "cluster" in top:
        c.name(cluster_name, ("cluster",), "cluster name", key=False)

    mode = check_mode(c, top)
    ecmp = mode == "ecmp"
    # A missing section was reported above; checking it again would only repeat that.
    balancers = check_balancers(c, top["balancers"], ecmp) if "balancers" in top else {}
    if mode == "failover" and isinstance(top.get("balancers"), dict) \
            and len(top["balancers"]) != 2:
        c.error(("mode",), "mode: failover is a VRRP pair and needs two balancers; this "
                f"file has {len(top['balancers'])}")
    workers = check_workers(c, top["workers"]) if "workers" in top else {}
    network = check_network(c, top, balancers)
    services = check_services(c, top["services"], workers) if "services" in top else {}
    cross_checks(c, balancers, workers, services, network, ecmp)
    bgp = check_bgp(c, top, ecmp, balancers, workers, services, network)
    if ecmp:
        check_ecmp(c, top, services, network)
        services = with_mh_fallback(services)
    vrrp = None if ecmp else check_vrrp(c, top, cluster_name, balancers, services)
    timeouts = check_ipvs_timeouts(c, top["ipvs"]) if "ipvs" in top else {}
    ssh = check_ssh(c, top["ssh"], balancers, workers) if "ssh" in top else Ssh()
    exporter, exporter_public = check_exporter(
        c, top["exporter"], balancers, [svc.vip for svc in services.values()]) \
        if "exporter" in top else (None, False)
    if c.errors:
        raise ConfigError(c.errors)
    return Cluster(name=cluster_name, network=network, balancers=balancers,
                   workers=workers, services=services, source=doc.path, text=doc.text,
                   vrrp=vrrp, ipvs_timeouts=timeouts, ssh=ssh, bgp=bgp,
                   exporter=exporter, exporter_public=exporter_public)
