"""Everything plan and apply need about this node, gathered in one place.

Validation and node lookup run before pyroute2 is imported, so a bad file is
reported fast and without touching the kernel.
"""

import os
import re
import sys
from dataclasses import dataclass
from ipaddress import IPv4Network

from lbctl.adapters.protocols import Adapters
from lbctl.config import load_cluster
from lbctl.desired import BootApply, desired_state, find_node, leaving_real_servers, role_of
from lbctl.errors import NodeError
from lbctl.observe import node_interface, observe
from lbctl.ownership import read_ownership
from lbctl.plan import make_plan


@dataclass
class NodeContext:
    cluster: object
    node: str
    desired: object
    observed: object
    owned: object
    adapters: Adapters
    plan: object


def connected_networks(address_list, ifname):
    return [IPv4Network(f"{ip}/{prefix}", strict=False) for ip, prefix, name in address_list
            if name == ifname and prefix < 32]


def check_real_servers_reachable(cluster, address_list, ifname):
    """Direct routing forwards by MAC: every real server must be on a LAN of this interface."""
    networks = connected_networks(address_list, ifname)
    shown = ", ".join(str(n) for n in networks) or "none"
    for svc in sorted(cluster.services.values(), key=lambda s: s.key):
        for rs in svc.real_servers:
            if not any(rs.address in net for net in networks):
                raise NodeError(f"plan: real server {rs.address} of {svc.key} is not on a "
                                f"network directly connected to {ifname} (connected: {shown}); "
                                "direct routing needs the workers on the balancer's LAN")


def load_node(path, node=None, root="/", force=False):
    cluster = load_cluster(path)
    from lbctl.adapters.addrs import AddressNetlink, local_ipv4_addresses
    from lbctl.adapters.files import FilesRoot
    from lbctl.adapters.sysctl import SysctlProc

    name = find_node(cluster, local_ipv4_addresses(), node)
    addresses = AddressNetlink()
    address_list = addresses.list()
    ifname = node_interface(cluster, name, address_list)
    if not any(n == ifname for _, _, n in address_list) and ifname not in _link_names():
        raise NodeError(f"node {name}: interface {ifname} does not exist on this host")
    is_balancer = role_of(cluster, name) == "balancer"
    ipvs = keepalived = layout = None
    if is_balancer:
        check_real_servers_reachable(cluster, address_list, ifname)
        from lbctl.adapters.ipvs import IpvsNetlink
        from lbctl.adapters.keepalived import KeepalivedProcess
        from lbctl.render.keepalived import KeepalivedLayout

        ipvs = IpvsNetlink()
        # Also for the netlink engine: a balancer leaving keepalived stops it.
        layout = KeepalivedLayout(cluster.name, root)
        keepalived = KeepalivedProcess(layout)
    boot = _boot_apply(cluster) if is_balancer and cluster.engine == "netlink" else None
    ipvs_table = ipvs.dump() if ipvs is not None else []
    leaving = leaving_real_servers(cluster, ipvs_table) if is_balancer else {}
    desired = desired_state(cluster, name, ifname, boot=boot, layout=layout,
                            leaving=leaving, force=force)
    adapters = Adapters(ipvs=ipvs, addresses=addresses, sysctls=SysctlProc(),
                        files=FilesRoot(root), keepalived=keepalived)
    owned = read_ownership(adapters.files, adapters.ownership_dir, cluster.name)
    observed = observe(desired, owned, adapters, address_list, ipvs_table)
    plan = make_plan(desired, observed, owned, force=force)
    return NodeContext(cluster, name, desired, observed, owned, adapters, plan)


def _boot_apply(cluster):
    """The saved copy and interpreter for a balancer's boot unit."""
    python = sys.executable
    if not re.match(r"^/[A-Za-z0-9_./+-]+$", python):
        raise NodeError(f"the boot unit cannot run {python!r}: install lbctl under a path "
                        "without spaces or special characters")
    return BootApply(cluster.text, python)


def _link_names():
    return set(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else set()
