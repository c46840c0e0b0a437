"""What a node has now, read from the kernel and the filesystem.

Only what the plan can touch is read: the services in IPVS, the addresses on
the node's interfaces, and the sysctls, files and links lbctl declares or
created before.
"""

from lbctl.config.model import DestKey
from lbctl.errors import NodeError
from lbctl.layout import Layout
from lbctl.state import Address, DaemonSpec, DestSpec, FileSpec, NodeState, ServiceSpec


def interface_of(addresses, ip):
    """The interface that holds `ip`, from Addresses.list() output."""
    for addr, _prefix, ifname in addresses:
        if addr == ip:
            return ifname
    return None


def node_interface(cluster, node, address_list):
    """The LAN interface of this node: the file's `interface`, else where its address is."""
    balancer = cluster.balancers.get(node)
    if balancer is not None and balancer.interface:
        return balancer.interface
    own = (balancer or cluster.workers[node]).address
    found = interface_of(address_list, own)
    if found is None:
        raise NodeError(f"node {node}: its address {own} is not on any interface of this host")
    return found


def observe(desired, owned, adapters, address_list, ipvs_table=None):
    """`ipvs_table`: the IPVS dump when the caller has read it already."""
    state = NodeState(desired.role, desired.node, desired.cluster)
    relevant = {a.ifname for a in desired.addresses | owned.addresses}
    state.addresses = {Address(ip, ifname, prefix) for ip, prefix, ifname in address_list
                       if ifname in relevant and prefix == 32}
    if adapters.ipvs is not None:
        if ipvs_table is None:
            ipvs_table = adapters.ipvs.dump()
        for svc in ipvs_table:
            if svc.key is None:
                continue  # fwmark and IPv6 services are never lbctl's
            state.services[svc.key] = ServiceSpec(svc.scheduler, svc.persistence, svc.flags)
            for d in svc.dests:
                state.dests[DestKey(svc.key, d.address, d.port)] = DestSpec(
                    d.weight, d.forward, d.active, d.inactive)
    if adapters.ipvs is not None and (desired.timeouts or owned.timeouts):
        state.timeouts = adapters.ipvs.timeouts()
    if adapters.ipvs is not None and desired.stray_sync is not None:
        state.sync_daemons = adapters.ipvs.sync_daemons()
    for key in set(desired.sysctls) | set(owned.sysctls):
        value = adapters.sysctls.read(key)
        if value is not None:
            state.sysctls[key] = value
    for path in set(desired.files) | owned.files:
        found = adapters.files.read(path)
        if found is not None:
            state.files[path] = FileSpec(*found)
    for path in set(desired.links) | owned.links:
        target = adapters.files.readlink(path)
        if target is not None:
            state.links[path] = target
    for name, daemon in adapters.daemons.items():
        if daemon.running():
            loaded = adapters.files.read(Layout(desired.cluster).loaded(name))
            state.daemons[name] = DaemonSpec(name, "", digest=loaded[0].strip() if loaded else "")
    return state
