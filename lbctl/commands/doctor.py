"""lbctl doctor: what breaks direct routing here and on the LAN, with the fix."""

from lbctl.errors import NodeError


def run(args, out):
    from lbctl.adapters.addrs import AddressIp
    from lbctl.engine.desired import role_of
    from lbctl.doctor import facts as host, local
    from lbctl.doctor.report import NotRun, format_json, format_text, merge
    from lbctl.engine.observe import node_interface

    cluster, file_hint = _cluster(args)
    addresses = AddressIp().list()
    here = _this_node(cluster, addresses, args.node)
    ifname = node_interface(cluster, here, addresses) if here else _lan_interface(cluster,
                                                                                   addresses)
    facts = host.gather()
    link = facts.links.get(ifname)
    if link is None:  # every other check reads that interface
        found = [_interface_missing(cluster, here, ifname, facts, addresses)]
        out.write((format_json if args.json else format_text)(
            cluster.name, f"balancer {here}", found,
            [NotRun("all others", f"they read interface {ifname}, which this host lacks")]))
        return 1
    findings, not_run = [], []
    if here is None:
        where = f"a host that is no node of the file ({ifname})"
    elif role_of(cluster, here) == "balancer":
        where = f"balancer {here}"
        findings += local.balancer_findings(cluster, here, ifname, facts, file_hint)
    else:
        where = f"worker {here}"
        findings += local.worker_findings(cluster, here, ifname, facts, file_hint)
    why_not = "--no-wire: only this node's own checks" if args.no_wire else \
        _why_no_wire(facts, link)
    if why_not:
        not_run.append(NotRun("wire", why_not))
    else:
        from lbctl.doctor.wire import listen, wire_findings

        # The probes speak from the node's own address, never a VIP it may hold.
        own_ip = _node_address(cluster, here) if here else next(
            ip for ip, _p, n in addresses if n == ifname and ip in cluster.network
            and ip not in cluster.vips)
        holds = {ip for ip, _p in facts.addresses_on(ifname)}
        heard = listen(cluster, here, ifname, own_ip, link["mac"], holds, link["mtu"])
        findings += wire_findings(cluster, heard, here, ifname, file_hint)
    findings = merge(findings)
    if args.json:
        tables = _table_digests(cluster, here, facts)
        out.write(format_json(cluster.name, where, findings, not_run, tables))
    else:
        out.write(format_text(cluster.name, where, findings, not_run))
    return 1 if findings else 0


def _table_digests(cluster, here, facts):
    """An ECMP balancer's {service label: {"order": digest, "weights":
    digest}} of its mh and sh services, for doctor --all to compare between
    balancers; else None."""
    from lbctl.config.model import Mode

    if here not in cluster.balancers or cluster.mode != Mode.ECMP or not facts.ipvs_loaded:
        return None
    from lbctl.adapters.ipvs import IpvsNetlink
    from lbctl.config.model import TABLE_SCHEDULERS
    from lbctl.status.model import table_parts

    return {svc.label: table_parts(((f"{d.address}:{d.port}", d.weight) for d in svc.dests),
                                   svc.flags)
            for svc in IpvsNetlink(load_module=False).dump()
            if svc.scheduler in TABLE_SCHEDULERS}


def _cluster(args):
    from lbctl.config import load_cluster

    if args.file is not None:
        # Read from standard input (as --all sends it), the file has no name here.
        return load_cluster(args.file), "FILE" if args.file == "-" else args.file
    from lbctl.records.saved import applied_cluster

    try:
        cluster, path = applied_cluster(args.root)
    except NodeError as exc:
        raise NodeError(f"doctor: {exc}; on a worker or another host, name the cluster "
                        "file") from None
    return cluster, path


def _this_node(cluster, addresses, requested):
    """This host's node name, or None for a host on the LAN that is no node."""
    from lbctl.engine.desired import find_node

    local = {ip for ip, _p, _n in addresses}
    if requested is None and not local & set(cluster.node_names_by_address()):
        return None
    return find_node(cluster, local, requested)


def _interface_missing(cluster, here, ifname, facts, addresses):
    from lbctl.doctor.report import Finding
    from lbctl.engine.observe import interface_of

    actual = interface_of(addresses, _node_address(cluster, here))
    return Finding(
        here, "interface-missing",
        f"has no interface {ifname}, which the file names as its LAN interface",
        f"this host's interfaces: {', '.join(sorted(facts.links))}",
        f"set `interface: {actual}` for {here} in the file (the same NIC has other names "
        "on other images: eth0, end0, enp1s0)" if actual else
        f"name {here}'s LAN interface under `interface:` in the file")


def _node_address(cluster, name):
    return (cluster.balancers.get(name) or cluster.workers[name]).address


def _lan_interface(cluster, addresses):
    for ip, _prefix, ifname in addresses:
        if ip in cluster.network and ifname != "lo" and ip not in cluster.vips:
            return ifname
    raise NodeError(f"doctor: this host has no address in the cluster's network "
                    f"{cluster.network}, so it is not on the LAN to probe from")


def _why_no_wire(facts, link):
    if not link["mac"] or link["mac"] == "00:00:00:00:00:00":
        return "the LAN interface has no MAC address (a tunnel?): ARP cannot be asked there"
    if not facts.raw_frames:
        return ("the ARP and direct-routed SYN probes send raw frames, which needs root "
                "(CAP_NET_RAW): run `sudo lbctl doctor`")
    try:
        import scapy  # noqa: F401  (only whether it is there)
    except ImportError:
        return "the probes need scapy: pip install scapy (or apt install python3-scapy)"
    return None
