"""What the LAN shows: who answers ARP for each node and VIP, and whether each
worker takes a SYN for the VIP sent to its MAC, as the balancer sends it.

The probes need root (raw frames) and scapy, imported only here: it costs a
Pi seconds.  The analysis is a pure function of what was heard.
"""

import random
from dataclasses import dataclass, field

from lbctl.config.model import Mode
from lbctl.doctor.report import Finding

REPLY_WAIT = 2.0  # seconds to collect answers; an emulated or busy LAN is slow
SYN_ACK, RESET, SILENT = "syn-ack", "reset", "silent"  # else "ICMP <type>/<code> from <address>"
# Sent frames are not taken for ours: the NIC stays out of promiscuous mode
# (a production balancer's dmesg gets no line), and a frame lost to a busy
# LAN or Wi-Fi power save is asked once more.
SEND = {"promisc": False, "retry": 1, "verbose": 0}


@dataclass
class Heard:
    node_macs: dict  # {node: MAC, or None when its address got no ARP answer}
    vip_macs: dict  # {VIP: sorted MACs that answered ARP for it}
    syn: dict = field(default_factory=dict)  # {(service, worker): SYN_ACK | RESET | SILENT}
    # {node: (a small ping answered, a ping the size of this host's MTU answered)}
    pings: dict = field(default_factory=dict)
    mtu: int = 1500  # this host's LAN interface's
    # {MAC: node} of every MAC that answered for a node's address (a node on
    # the LAN by Wi-Fi and Ethernet has two); node_macs holds the one probed.
    owners: dict = field(default_factory=dict)
    # From a host that is no node, as a client: {service: (error or None, MAC
    # the SYN-ACK came from, or None)} of one real connection through the VIP.
    client: dict = field(default_factory=dict)


def listen(cluster, here, ifname, own_ip, own_mac, holds, mtu):
    """Ask the LAN from `ifname`.  `here`: this host's node name (or None);
    `holds`: the VIPs this host holds on ifname, which it cannot hear itself
    answer; `mtu`: ifname's MTU."""
    import logging

    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    from scapy.config import conf

    # Every socket scapy opens from here on, sniffers and sends included,
    # leaves the NIC out of promiscuous mode.
    conf.sniff_promisc = False
    from scapy.layers.inet import ICMP, IP, TCP
    from scapy.layers.l2 import ARP, Ether
    from scapy.sendrecv import sendp, srp

    def who_has(targets):
        asks = [Ether(dst="ff:ff:ff:ff:ff:ff", src=own_mac) /
                ARP(op=1, hwsrc=own_mac, psrc=str(own_ip), pdst=str(t)) for t in targets]
        answered, _ = srp(asks, iface=ifname, timeout=REPLY_WAIT, multi=True, **SEND)
        macs = {}
        for _sent, reply in answered:
            macs.setdefault(reply[ARP].psrc, set()).add(reply[ARP].hwsrc.lower())
        return macs

    addresses = {name: n.address for name, n in {**cluster.balancers, **cluster.workers}.items()
                 if name != here}
    # The nodes and the VIPs in one round: a round waits the whole REPLY_WAIT
    # (every host that answers for a VIP counts, not only the first).
    by_address = who_has(sorted(set(addresses.values()) | set(cluster.vips), key=int))
    node_macs = {name: min(by_address.get(str(a), {None}) - {None}, default=None)
                 for name, a in addresses.items()}
    owners = {mac: name for name, a in addresses.items() for mac in by_address.get(str(a), ())}
    if here is not None:
        node_macs[here] = own_mac.lower()
        owners[own_mac.lower()] = here
    vip_macs = {vip: sorted(by_address.get(str(vip), set()) | ({own_mac.lower()} if vip in holds
                                                                 else set()))
                for vip in cluster.vips}

    probes = {}
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        if svc.protocol != "tcp":
            continue
        for rs in svc.real_servers:
            mac = node_macs.get(rs.worker)
            if rs.worker == here or mac is None:
                continue
            sport = random.randint(33000, 60999)
            probes[(svc.name, rs.worker)] = Ether(dst=mac, src=own_mac) / IP(
                src=str(own_ip), dst=str(svc.vip)) / TCP(sport=sport, dport=svc.port, flags="S",
                                                         seq=random.getrandbits(32))
    syn = {key: SILENT for key in probes}
    if probes:
        answered, _ = srp(list(probes.values()), iface=ifname, timeout=REPLY_WAIT, **SEND)
        for sent, reply in answered:
            key = next(k for k, p in probes.items() if p is sent)
            if TCP not in reply:  # an ICMP error quoting the SYN: a reject, or a redirect
                syn[key] = (f"ICMP {reply[ICMP].type}/{reply[ICMP].code} from {reply[IP].src}"
                            if ICMP in reply else SILENT)
                continue
            flags = reply[TCP].flags
            syn[key] = RESET if flags & 0x04 else SYN_ACK if flags & 0x12 == 0x12 else SILENT
            if syn[key] == SYN_ACK:  # leave the worker no half-open connection
                sendp(Ether(dst=sent.dst, src=own_mac) / IP(src=sent[IP].src, dst=sent[IP].dst) /
                      TCP(sport=sent[TCP].sport, dport=sent[TCP].dport, flags="R",
                          seq=reply[TCP].ack), iface=ifname, count=2, promisc=False,
                      verbose=0)  # twice: a lost RST leaves it half-open a minute
    return Heard(node_macs, vip_macs, syn, _pings(cluster, node_macs, here, ifname, own_ip,
                                                  own_mac, mtu, (Ether, IP, ICMP, srp)), mtu,
                 owners, {} if here is not None else _as_a_client(cluster, ifname))


def _as_a_client(cluster, ifname):
    """One real connection to each TCP service's VIP, as a client makes it,
    noting which MAC its SYN-ACK came from: with direct routing, a worker's.
    (From a node this means nothing: a worker serves its own VIP locally.)"""
    import socket
    import threading

    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.sendrecv import AsyncSniffer

    seen = {}
    for svc in sorted(cluster.services.values(), key=lambda s: s.name):
        if svc.protocol != "tcp":
            continue
        vip, port = str(svc.vip), svc.port
        listening = threading.Event()
        sniffer = AsyncSniffer(
            iface=ifname, promisc=False, store=True, count=1, started_callback=listening.set,
            lfilter=lambda p: (IP in p and TCP in p and p[IP].src == vip and p[TCP].sport == port
                               and p[TCP].flags & 0x12 == 0x12))
        sniffer.start()
        listening.wait(REPLY_WAIT * 5)  # scapy opens its socket in a thread of its own
        error = None
        try:
            with socket.create_connection((vip, port), timeout=REPLY_WAIT * 2):
                pass
        except OSError as exc:
            error = exc.strerror or type(exc).__name__
        sniffer.join(timeout=REPLY_WAIT)
        if sniffer.running:
            sniffer.stop()
        got = sniffer.results or []
        seen[svc.name] = (error, got[0][Ether].src.lower() if got else None)
    return seen


def _pings(cluster, node_macs, here, ifname, own_ip, own_mac, mtu, scapy):
    """A small ping and one as large as this host's MTU, not to be fragmented,
    to every node that answered ARP: a node that answers only the small one
    has a smaller MTU, and drops the full-size frames a balancer forwards."""
    Ether, IP, ICMP, srp = scapy
    ident = random.getrandbits(16)
    asks = {}
    for name, mac in node_macs.items():
        if name == here or mac is None:
            continue
        node = cluster.balancers.get(name) or cluster.workers[name]
        for seq, size in ((1, 64), (2, mtu)):
            asks[(name, seq)] = Ether(dst=mac, src=own_mac) / IP(
                src=str(own_ip), dst=str(node.address), flags="DF") / ICMP(
                id=ident, seq=seq) / (b"\0" * (size - 28))
    answered, _ = srp(list(asks.values()), iface=ifname, timeout=REPLY_WAIT, **SEND) \
        if asks else ([], [])
    got = {key for key, ask in asks.items() for sent, _reply in answered if sent is ask}
    return {name: ((name, 1) in got, (name, 2) in got) for name, _seq in asks}


def wire_findings(cluster, heard, here, ifname, file_hint):
    """Findings from what the LAN answered, seen from `here` (a node name or a host)."""
    where = f"{here or 'this host'}'s {ifname}"
    owner = {**heard.owners, **{mac: name for name, mac in heard.node_macs.items() if mac}}
    found = []
    for name, mac in sorted(heard.node_macs.items()):
        if mac is None:
            node = cluster.balancers.get(name) or cluster.workers[name]
            found.append(Finding(
                name, "no-arp-answer",
                f"does not answer ARP from {where}: it is down, or not on this L2 segment "
                "(another switch, bridge or VLAN), and direct routing reaches only that",
                f"who-has {node.address} on {ifname}: no answer in {REPLY_WAIT:g} s",
                f"connect {name} to the balancers' switch and VLAN, and check it is up"))
    # In mode ecmp the router sends the VIPs to the balancers by BGP: no host
    # should answer ARP for one, a balancer included (it holds them on lo).
    routed = cluster.mode == Mode.ECMP
    for vip, macs in sorted(heard.vip_macs.items()):
        who = ", ".join(f"{owner.get(m, 'unknown host')} ({m})" for m in macs) or "nobody"
        evidence = f"who-has {vip} on {ifname} answered by {who}"
        services = ", ".join(s.name for s in cluster.services.values() if s.vip == vip)
        for mac in macs:
            name = owner.get(mac)
            if routed and name in cluster.balancers:
                found.append(Finding(
                    name, "arp-flux",
                    f"answers ARP for VIP {vip} ({services}), which in mode ecmp the router "
                    "sends to the balancers by BGP: LAN hosts that ask send their requests "
                    "to this balancer alone",
                    evidence,
                    f"`sudo lbctl apply {file_hint}` on {name} (it sets arp_ignore=1 and "
                    "arp_announce=2, and holds the VIPs on lo); take any VIP off its LAN "
                    "interface"))
            elif name in cluster.workers:
                found.append(Finding(
                    name, "arp-flux",
                    f"answers ARP for VIP {vip} ({services}), so clients that ask it send "
                    "their requests straight to it, bypassing the balancer",
                    evidence,
                    f"on {name}: sudo sysctl -w net.ipv4.conf.all.arp_ignore=1 "
                    "net.ipv4.conf.all.arp_announce=2; an interface's own arp_ignore above 2 "
                    f"must go to 1 too; `sudo lbctl apply {file_hint}` there keeps `all` so "
                    f"across reboots; if {name} holds the VIP on its LAN interface, no sysctl "
                    f"helps: `sudo lbctl doctor {file_hint}` there names it"))
            elif name is None:
                found.append(Finding(
                    f"unknown host {mac}", "vip-conflict",
                    f"answers ARP for VIP {vip} ({services}): another host uses the VIP",
                    evidence, f"take {vip} off that host, or give the services another VIP"))
        if routed:
            continue  # every balancer holds the VIP, and none answers ARP for it
        balancers = sorted({owner[m] for m in macs if owner.get(m) in cluster.balancers})
        if len(balancers) > 1:
            found.append(Finding(
                ", ".join(balancers), "vip-held-twice",
                f"both balancers hold VIP {vip}, so each is VRRP master: their adverts do not "
                "reach each other, and the LAN sends requests to either",
                evidence, "let VRRP through between the balancers (IP protocol 112, or the "
                "unicast peer addresses the file gives), check both run the same file with "
                f"`lbctl status {file_hint} --all`, then `sudo lbctl apply {file_hint}` on both"))
        if not macs:
            found.append(Finding(
                ", ".join(sorted(cluster.balancers)), "vip-unanswered",
                f"nobody answers ARP for VIP {vip} ({services}): no balancer holds it",
                evidence, f"`sudo lbctl apply {file_hint}` on the balancers; `lbctl status` "
                "there shows keepalived's state"))
    for service, (error, mac) in sorted(heard.client.items()):
        svc = cluster.services[service]
        target = f"{svc.vip}:{svc.port} ({service})"
        if error is not None:
            found.append(Finding(
                ", ".join(sorted(cluster.balancers)), "vip-not-serving",
                f"a client here cannot connect to {target}: {error}",
                f"a TCP connection from {where} to {target} failed: {error}",
                f"run `lbctl doctor {file_hint} --all` to check every node"))
        elif owner.get(mac) in cluster.balancers:
            found.append(Finding(
                owner[mac], "replies-through-balancer",
                f"answers {target} itself: the replies do not come from the workers, so this "
                "is not direct routing (a proxy, or NAT, on the balancer)",
                f"the SYN-ACK of a connection from {where} came from {owner[mac]}'s MAC {mac}",
                f"stop what listens on {svc.vip}:{svc.port} on {owner[mac]}, and `sudo lbctl "
                f"apply {file_hint}` there"))
    for name, (small, full) in sorted(heard.pings.items()):
        if small and not full:
            found.append(Finding(
                name, "mtu-mismatch",
                f"drops full-size frames from {where}: its MTU is below {heard.mtu}, so "
                "large requests forwarded to it are lost",
                f"a {heard.mtu}-byte ping that may not be fragmented got no answer, a 64-byte "
                "one did",
                f"give every host on the segment one MTU: {name}'s LAN interface {heard.mtu} "
                f"as {where} has (sudo ip link set dev IFACE mtu {heard.mtu}, and the same "
                f"in its network configuration), or lower {where} to {name}'s if {name}'s "
                "NIC cannot take more"))
    for (service, worker), result in sorted(heard.syn.items()):
        svc = cluster.services[service]
        if result == SYN_ACK:
            continue
        sent = f"a SYN to {svc.vip}:{svc.port} sent to {worker}'s MAC from {where}"
        if result == RESET:
            found.append(Finding(
                worker, "not-listening-on-vip",
                f"refuses {svc.vip}:{svc.port} ({service}): its server does not listen on "
                "the VIP, or a firewall rejects the port with a reset",
                f"{sent} was answered with a reset",
                f"make the server on {worker} listen on every address or on "
                f"{svc.vip}:{svc.port}; `lbctl doctor` there names the socket"))
        elif result.startswith("ICMP"):
            found.append(Finding(
                worker, "direct-route-refused",
                f"refuses {svc.vip}:{svc.port} ({service}) sent to it by MAC: a firewall "
                "rejects it, or the worker forwards it on (ip_forward=1) because it lacks "
                "the VIP",
                f"{sent} was answered with {result}",
                f"run `sudo lbctl doctor {file_hint}` on {worker}; let the VIP's port through "
                "its firewall"))
        else:
            found.append(Finding(
                worker, "direct-route-dropped",
                f"does not answer {svc.vip}:{svc.port} ({service}) sent to it by MAC, as the "
                "balancer forwards requests",
                f"{sent} got no answer in {REPLY_WAIT:g} s",
                f"run `sudo lbctl doctor {file_hint}` on {worker}: the VIP must be on its lo, "
                "and no firewall or rp_filter may drop the request"))
    return found
