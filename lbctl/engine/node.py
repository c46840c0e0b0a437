"""Everything plan and apply need about this node, gathered in one place.

Validation runs before anything on the node is read, so a bad file is
reported fast and without touching the kernel.
"""

import os
import re
import sys
from dataclasses import dataclass, field
from ipaddress import IPv4Network

from lbctl.adapters.protocols import Adapters
from lbctl.config import load_cluster
from lbctl.records.drains import NewerDrainRecord, drained_dests, read_drains, slot_weights
from lbctl.engine.desired import (
    BootApply, desired_state, find_node, leaving_real_servers, role_of, strip_saved_copy_header,
)
from lbctl.errors import NodeError
from lbctl.engine.observe import node_interface, observe
from lbctl.records.ownership import read_ownership, sysctls_of_other_clusters
from lbctl.engine.plan import Kind, make_plan
from lbctl.state import NodeState


@dataclass
class NodeContext:
    cluster: object
    node: str
    desired: object
    observed: object
    owned: object
    adapters: Adapters
    plan: object
    drains: dict  # {worker: Drain} on a balancer: what `lbctl drain` took out
    drain_problem: str | None = None  # the drain record could not be read
    # What other clusters on this balancer share with this one and want
    # otherwise (engine/neighbours.py): plan and apply show them.
    warnings: list = field(default_factory=list)


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


def load_node(path, node=None, root="/", force=False, remove=False, cluster=None,
              keep_leaving=False, read_only=False):
    """`remove`: the node is to hold nothing of the cluster's (apply --remove).
    `cluster`: the file already loaded, so standard input is read only once.
    `read_only`: only a plan is wanted (plan, status's drift, the exporter):
    nothing on the node changes, ip_vs is not even loaded."""
    cluster = cluster or load_cluster(path)
    from lbctl.adapters.addrs import AddressIp
    from lbctl.adapters.files import FilesRoot
    from lbctl.adapters.sysctl import SysctlProc

    addresses = AddressIp()
    address_list = addresses.list()
    name = find_node(cluster, {ip for ip, _prefix, _ifname in address_list}, node)
    ifname = node_interface(cluster, name, address_list)
    if not any(n == ifname for _, _, n in address_list) and ifname not in _link_names():
        raise NodeError(f"node {name}: interface {ifname} does not exist on this host")
    is_balancer = role_of(cluster, name) == "balancer"
    from lbctl.adapters.daemons import balancer_daemons
    from lbctl.adapters.systemd import Systemd

    systemd = Systemd(root)
    ipvs = layout = None
    daemons = {}
    if is_balancer:
        if not remove:
            check_real_servers_reachable(cluster, address_list, ifname)
        from lbctl.adapters.ipvs import IpvsNetlink
        from lbctl.layout import Layout

        ipvs = IpvsNetlink(load_module=not read_only)
        layout = Layout(cluster.name, root)
        # Every daemon, also where the file wants none (the netlink engine):
        # one it no longer wants is stopped.
        daemons = balancer_daemons(cluster, layout, systemd, remove)
    # A node being removed gets no unit: whatever runs its Python, it may go.
    boot, boot_warning = (_boot_apply(cluster, root) if is_balancer and not remove
                          else (None, None))
    ipvs_table = ipvs.dump() if ipvs is not None else []
    leaving = leaving_real_servers(cluster, ipvs_table) if is_balancer else {}
    order_warnings = []
    if is_balancer and not remove:
        from lbctl.engine.table_order import check_table_order

        # Before anything runs: a refused order changes nothing here.
        order_warnings = check_table_order(cluster, ipvs_table,
                                           lambda: _applied_here(cluster.name, root),
                                           lambda: _configured_here(layout))
    adapters = Adapters(ipvs=ipvs, addresses=addresses, sysctls=SysctlProc(),
                        files=FilesRoot(root), daemons=daemons, systemd=systemd)
    drains, drain_problem = {}, None
    if is_balancer and not remove:
        try:
            drains = read_drains(adapters.files, cluster.name)
        except NewerDrainRecord:
            raise
        except NodeError as exc:
            # Refusing would keep a rebooted balancer's boot unit from bringing
            # its VIPs back: one drained worker taking traffic again is the
            # smaller harm, and apply says so on every run.
            drain_problem = f"{exc}; applied as if no worker were drained"
    if remove:
        desired = NodeState(role_of(cluster, name), name, cluster.name)
    else:
        desired = desired_state(cluster, name, ifname, boot=boot, layout=layout,
                                leaving=leaving, force=force,
                                drained=set(drained_dests(cluster, drains)),
                                slots=slot_weights(cluster, drains))
    # A daemon nothing here can run (the exporter, where systemd does not run
    # the node) is left to its unit file.
    desired.daemons = {name: spec for name, spec in desired.daemons.items()
                       if name in adapters.daemons}
    owned = read_ownership(adapters.files, adapters.ownership_dir, cluster.name, strict=remove)
    shared = sysctls_of_other_clusters(adapters.files, root, adapters.ownership_dir, cluster.name)
    observed = observe(desired, owned, adapters, address_list, ipvs_table)
    plan = make_plan(desired, observed, owned, force=force, keep_leaving=keep_leaving,
                     shared_sysctls=shared)
    if root == "/" and not remove:
        _reload_stale_units(plan, systemd)
    warnings = []
    if is_balancer and not remove:
        from lbctl.engine.neighbours import clusters_here, shared_kernel_warnings

        warnings = shared_kernel_warnings(cluster, clusters_here(cluster, root)) + order_warnings
    if boot_warning is not None:
        warnings.append(boot_warning)
    if is_balancer and plan.pair_config_left is not None:
        warnings.append(LEAVING_A_PAIR)
    return NodeContext(cluster, name, desired, observed, owned, adapters, plan, drains,
                       drain_problem, warnings)


LEAVING_A_PAIR = (
    "this balancer leaves its failover pair: should the other balancer still run the pair's "
    "keepalived, it takes the VIPs over as this one lets them go, and apply leaves them to it "
    "(an error names its MAC).  To shrink a pair without a gap, run `lbctl apply --remove` on "
    "the balancer that leaves first.")


def _applied_here(name, root):
    """The cluster as last applied here (its saved copy), or None where
    there is none or it no longer loads."""
    from lbctl.errors import LbctlError
    from lbctl.layout import Layout

    layout = Layout(name, root)
    if not os.path.exists(layout.real(layout.saved_copy)):
        return None
    try:
        return load_cluster(layout.real(layout.saved_copy))
    except LbctlError:
        return None


def _configured_here(layout):
    """The real servers of keepalived's config on disk, or None where there
    is none (engine/table_order.py)."""
    from lbctl.engine.table_order import configured_real_servers

    try:
        with open(layout.real(layout.conf)) as fh:
            return configured_real_servers(fh.read())
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _boot_apply(cluster, root):
    """The saved copy, and the interpreter for the units that run lbctl, with
    a warning when one of them is left out.

    Two units cannot work without it: the netlink engine's boot unit
    (keepalived brings its balancers back itself) and the exporter's.  A
    single balancer's keepalived unit only announces with it the VIPs it puts
    back: where that Python is not root's alone, the announcement is left out
    rather than the apply refused.  Checked only where systemd will run them:
    a --root tree (the lab) holds units no boot reads."""
    from lbctl.config.model import Mode

    python = sys.executable
    required = cluster.engine == "netlink" or cluster.exporter is not None
    announces = cluster.engine == "keepalived" and cluster.mode == Mode.SINGLE
    problem = None
    if required or announces:
        problem = _unit_python_problem(python, os.path.abspath(root) == "/")
    if problem is not None and required:
        raise NodeError(problem)
    boot = BootApply(strip_saved_copy_header(cluster.text), python, announce=problem is None)
    if problem is not None and announces:
        return boot, (f"the keepalived unit will not announce the VIPs it puts back at boot "
                      f"(gratuitous ARP): {problem}")
    return boot, None


def _unit_python_problem(python, on_this_host):
    """Why a unit must not run `python -I -m lbctl` as root, or None."""
    if not re.fullmatch(r"/[A-Za-z0-9_./+-]+", python):
        return (f"the boot unit cannot run {python!r}: install lbctl under a path "
                "without spaces or special characters")
    if on_this_host:
        try:
            require_root_only_python(python)
        except NodeError as exc:
            return str(exc)
    return None


# What the unit's `PYTHON -I -m lbctl` imports: lbctl first, then the path.
_IMPORTS = "import sys, lbctl; print(lbctl.__file__); print(*filter(None, sys.path), sep='\\n')"


def require_root_only_python(python):
    """The units run `python -I -m lbctl` as root at every boot: whoever can
    change that interpreter, the lbctl it imports, or any folder it imports
    from (a checkout in /home/pi, a venv a user owns, a folder under /tmp)
    would get root.  Asked of that interpreter itself, as the unit runs it,
    not of this process, which may import from elsewhere.  Refuse such a unit."""
    from lbctl.adapters.programs import run
    from lbctl.trust import first_unsafe

    found = run([python, "-I", "-c", _IMPORTS])
    if found.returncode != 0:
        raise NodeError(f"the boot unit would run {python} -I -m lbctl, which cannot import "
                        "lbctl (installed only for this user, or through PYTHONPATH?): install "
                        "lbctl as the README's 'Install on a node' says, in /opt/lbctl")
    package, *path = found.stdout.splitlines()
    package_dir = os.path.dirname(package)
    # lbctl's own files one by one (a user's file in root's folder is enough),
    # and every folder its imports come from.
    # Following links: a checkout's lbctl/data/ links in the template folders.
    files = [os.path.join(folder, name)
             for folder, _, names in os.walk(package_dir, followlinks=True) for name in names]
    unsafe = first_unsafe([python, package_dir, *files, *(p for p in path if os.path.exists(p))])
    if unsafe is not None:
        where, info = unsafe
        raise NodeError(
            f"the boot unit would run {python} with lbctl from {package_dir} as root, but "
            f"{where} is owned by uid {info.st_uid} with mode {info.st_mode & 0o7777:04o}, so "
            "another user could change what root runs: install lbctl where only root can "
            "write (README, 'Install on a node': a venv in /opt/lbctl)")


def _link_names():
    return set(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else set()


def _reload_stale_units(plan, systemd):
    """A daemon-reload first, when systemd runs an older copy of a unit of
    lbctl's than the one on disk: an apply cut short after writing it, or an
    edit by hand.  Otherwise the next start or restart would use the old one."""
    written = {c.key for c in plan.changes if c.kind in (Kind.FILE, Kind.LINK)}
    units = sorted(os.path.basename(path) for path in plan.owned_after.files
                   if path.endswith(".service") and path not in written)
    stale = systemd.stale(units)
    if stale:
        from lbctl.engine.plan import CHANGE, Change

        plan.changes.insert(0, Change(CHANGE, Kind.SYSTEMD, "daemon-reload",
                                      note=f": {', '.join(stale)} changed on disk since "
                                           "systemd loaded it"))
