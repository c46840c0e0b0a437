"""lbctl doctor: what breaks direct routing here and on the LAN, with the fix."""

from lbctl.errors import NodeError


def run(args, out):
    from lbctl.adapters.addrs import AddressIp
    from lbctl.desired import find_node, role_of
    from lbctl.doctor import facts as host, local
    from lbctl.doctor.report import NotRun, format_json, format_text
    from lbctl.observe import node_interface

    cluster, file_hint = _cluster(args)
    addresses = AddressIp().list()
    try:
        here = find_node(cluster, {ip for ip, _p, _n in addresses}, args.node)
    except NodeError:
        if args.node is not None:
            raise
        here = None  # a host on the LAN that is not a node: the wire checks only
    ifname = node_interface(cluster, here, addresses) if here else _lan_interface(cluster,
                                                                                   addresses)
    facts = host.gather([ifname])
    findings, not_run = [], []
    if here is None:
        where = f"a host that is no node of the file ({ifname})"
    elif role_of(cluster, here) == "balancer":
        where = f"balancer {here}"
        findings += local.balancer_findings(cluster, here, ifname, facts)
    else:
        where = f"worker {here}"
        findings += local.worker_findings(cluster, here, ifname, facts, file_hint)
    why_not = _why_no_wire(facts)
    if why_not:
        not_run.append(NotRun("wire", why_not))
    else:
        from lbctl.doctor.wire import listen, wire_findings

        own_ip = next((ip for ip, _p, n in addresses if n == ifname
                       and ip in cluster.network), None)
        holds = {ip for ip, _p in facts.addresses_on(ifname)}
        link = facts.links[ifname]
        heard = listen(cluster, here, ifname, own_ip, link["mac"], holds, link["mtu"])
        findings += wire_findings(cluster, heard, here, ifname, file_hint)
    findings = _unique(findings)
    text = (format_json if args.json else format_text)(cluster.name, where, findings, not_run)
    out.write(text)
    return 1 if findings else 0


def _cluster(args):
    from lbctl.config import load_cluster

    if args.file is not None:
        return load_cluster(args.file), args.file
    from lbctl.saved import applied_cluster

    try:
        cluster, path = applied_cluster(args.root)
    except NodeError as exc:
        raise NodeError(f"doctor: {exc}; on a worker or another host, name the cluster "
                        "file") from None
    return cluster, path


def _lan_interface(cluster, addresses):
    for ip, _prefix, ifname in addresses:
        if ip in cluster.network and ifname != "lo":
            return ifname
    raise NodeError(f"doctor: this host has no address in the cluster's network "
                    f"{cluster.network}, so it is not on the LAN to probe from")


def _why_no_wire(facts):
    if not facts.raw_frames:
        return ("the ARP and direct-routed SYN probes send raw frames, which needs root "
                "(CAP_NET_RAW): run `sudo lbctl doctor`")
    try:
        import scapy  # noqa: F401  (only whether it is there)
    except ImportError:
        return "the probes need scapy: pip install scapy (or apt install python3-scapy)"
    return None


def _unique(findings):
    """One finding per node and check: the wire and the local view may both see it."""
    seen, kept = set(), []
    for f in findings:
        if (f.node, f.check) not in seen:
            seen.add((f.node, f.check))
            kept.append(f)
    return kept
