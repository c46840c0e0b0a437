"""ARP for the VIPs a balancer holds: probe before taking one, announce after.

A balancer that takes a VIP on (from a pair's backup, or from the balancer it
replaces) has another MAC than the one clients and the router have cached for
the VIP.  Unannounced, they keep sending to the old MAC until their entry
expires: several seconds on Linux, up to hours on many routers.  keepalived
announces the VIPs it holds; this announces the ones lbctl adds itself.

The frame is an ARP Announcement (RFC 5227): a request for the address from
the address, which every Linux host and common router takes to update an
entry it already has, and which creates none where there was none.

Before it adds a VIP, lbctl asks whether another host answers for it (an ARP
Probe, RFC 5227: a request from 0.0.0.0, which teaches no cache anything).
A departing balancer still running, or a typo'd address that a printer
holds, would otherwise split the VIP's clients between two MACs.

Why not scapy: these are fixed 42-byte frames, and importing scapy costs a
Pi seconds and tens of MB on every apply that adds a VIP.
"""

import os
import select
import socket
import struct
import sys
import time

ETH_P_ARP = 0x0806
BROADCAST = b"\xff" * 6
# Three rounds, 100 ms apart: one lost frame must not leave a cache stale.
COUNT = 3
SPACING = 0.1
# At boot: how long to wait for the network card's link before announcing
# anyway, and when to announce again, as keepalived's vrrp_garp_master_delay
# does (a switch port that has just come up may drop the first frames).
LINK_WAIT = 5.0
AGAIN_AFTER = 5.0
# Probes: three rounds 0.2 s apart, then 0.4 s for the last answers.  RFC
# 5227 spaces them 1-2 s apart for hosts that may be asleep; a host that
# holds a VIP answers within milliseconds, and apply should not wait seconds.
PROBE_COUNT = 3
PROBE_SPACING = 0.2
PROBE_LISTEN = 0.4


# Ethernet, IPv4, 6-byte hardware and 4-byte protocol addresses; a request
# or a reply.  Every frame here is a request; a reply can be a claim.
ARP_REQUEST = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
ARP_REPLY = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2)


def _who_has(mac, sender_ip, ip):
    """The broadcast ARP request for `ip` (IPv4Address) from `mac` (6 bytes),
    sent from `sender_ip` (4 bytes)."""
    ethernet = BROADCAST + mac + struct.pack("!H", ETH_P_ARP)
    return ethernet + ARP_REQUEST + mac + sender_ip + b"\0" * 6 + ip.packed


def announcement(mac, ip):
    """The Ethernet frame announcing that `ip` (IPv4Address) is at `mac` (6 bytes)."""
    return _who_has(mac, ip.packed, ip)


def probe(mac, ip):
    """The ARP Probe for `ip` from `mac`: "who has ip?", asked from 0.0.0.0."""
    return _who_has(mac, b"\0" * 4, ip)


def claim_in(frame, own_macs, wanted):
    """(ip, "aa:bb:..") when `frame` is another host's ARP saying it has one
    of `wanted` ({packed address: ip}): its reply to a probe, or a request
    sent from that address (its own announcement).  Else None.  `own_macs`:
    this host's, whose answers (another card of ours on the same LAN, for a
    VIP we hold elsewhere) are no other host's."""
    if len(frame) < 42 or frame[12:14] != struct.pack("!H", ETH_P_ARP):
        return None
    if frame[14:22] not in (ARP_REQUEST, ARP_REPLY):
        return None
    sender_mac, sender_ip = frame[22:28], frame[28:32]
    if sender_mac in own_macs or sender_ip not in wanted:
        return None
    return wanted[sender_ip], sender_mac.hex(":")


def holders(ips, ifname, count=PROBE_COUNT, spacing=PROBE_SPACING, listen=PROBE_LISTEN,
            clock=time.monotonic):
    """{ip: MAC} of those of `ips` that another host on `ifname`'s LAN
    answers for, from `count` rounds of probes `spacing` s apart and the
    answers heard until `listen` s after the last.  An interface without an
    Ethernet address has no ARP: {}.  Raises OSError when the frames cannot be
    sent (the interface is down or gone), or when listening failed before
    any answer: a silence cut short says nothing."""
    wanted = {ip.packed: ip for ip in ips}
    found = {}
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((ifname, ETH_P_ARP))
        mac = sock.getsockname()[4]
        if len(mac) != 6:
            return found
        own = {mac} | host_macs()
        frames = [probe(mac, ip) for ip in ips]
        rounds = [clock() + n * spacing for n in range(count)]
        end = rounds[-1] + listen
        while (now := clock()) < end and len(found) < len(wanted):
            if rounds and now >= rounds[0]:
                rounds.pop(0)
                for frame in frames:
                    sock.send(frame)
                continue
            ready, _, _ = select.select([sock], [], [], (rounds[0] if rounds else end) - now)
            if not ready:
                continue
            try:
                frame, address = sock.recvfrom(2048)
            except OSError:
                if not found:
                    raise
                break  # what was heard so far still counts
            if address[2] == socket.PACKET_OUTGOING:
                continue  # a probe of ours
            if claim := claim_in(frame, own, wanted):
                found.setdefault(*claim)
    return found


def host_macs(sys_class_net="/sys/class/net"):
    """The MAC of every interface of this host, as bytes."""
    macs = set()
    for name in os.listdir(sys_class_net):
        try:
            with open(os.path.join(sys_class_net, name, "address")) as f:
                macs.add(bytes.fromhex(f.read().strip().replace(":", "")))
        except (OSError, ValueError):
            continue
    return macs


def announce(ips, ifname, count=COUNT, spacing=SPACING, sleep=time.sleep):
    """Broadcast that each of `ips` is at `ifname`'s MAC, in `count` rounds.

    Raises OSError when the frames cannot be sent (the interface is down or
    gone).  An interface without an Ethernet address (a tunnel) has no ARP
    cache to update: nothing is sent."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((ifname, ETH_P_ARP))
        mac = sock.getsockname()[4]
        if len(mac) != 6:
            return
        frames = [announcement(mac, ip) for ip in ips]
        for n in range(count):
            if n:
                sleep(spacing)
            for frame in frames:
                sock.send(frame)


def wait_for_link(ifname, patience=LINK_WAIT, read_state=None, clock=time.monotonic,
                  sleep=time.sleep):
    """Until `ifname` is up, or `patience` seconds have passed; its last state.
    "unknown" counts as up: interfaces without a carrier (dummy, lo) say so.
    One that is not there is not waited for (the unit put the VIPs on it)."""
    read_state = read_state or link_state
    deadline = clock() + patience
    while (state := read_state(ifname)) not in (*LINK_UP, "absent") \
            and clock() < deadline:
        sleep(0.1)
    return state


# The operstates of a link that passes frames: "unknown" is what interfaces
# without a carrier (dummy, lo) say.
LINK_UP = ("up", "unknown")


def link_state(ifname):
    """The interface's operstate ("up", "down", "lowerlayerdown", ...), or "absent"."""
    try:
        with open(f"/sys/class/net/{ifname}/operstate") as f:
            return f.read().strip()
    except OSError:
        return "absent"  # the announcement then names the error


def held_here(ips):
    """Those of `ips` this host still holds: a VIP apply --remove or a move
    took away meanwhile must not be announced."""
    kept = []
    for ip in ips:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((str(ip), 0))
            except OSError:
                continue  # EADDRNOTAVAIL: no longer an address of this host
            kept.append(ip)
    return kept


def announce_again_later(ips, ifname, after=AGAIN_AFTER):
    """A child that announces once more `after` seconds from now those of
    `ips` still held here; its PID.  A child so that the unit's start, which
    apply waits for, does not wait."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            # Holding no pipe of the caller's open: the first round has
            # already said what fails.
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            time.sleep(after)
            if kept := held_here(ips):
                announce(kept, ifname)
        except OSError:
            code = 1
        finally:
            os._exit(code)
    return pid


def let_go_of_held(ips, ifname, addresses=None):
    """Those of `ips` (held here) that another host on `ifname`'s LAN also
    answers for are taken off `ifname` again, each said on stderr: two MACs
    would split the VIP's clients, and the other host was there first.
    Returns the others.  A link that is not up, or one no probe could go
    out on, is not asked: it keeps them (AddressIp.probe)."""
    from lbctl.adapters.addrs import AddressIp
    from lbctl.state import Address

    addresses = addresses or AddressIp()
    probed = addresses.probe([Address(ip, ifname) for ip in ips], PROBE_LISTEN)
    for address, mac in sorted(probed.held.items(), key=lambda item: item[0].ip):
        print(f"lbctl: another host ({mac}) answers ARP for {address.ip} on {ifname}: taking "
              f"it off {ifname} again, as two holders would split its clients; `lbctl doctor` "
              "names the host, and `lbctl apply` takes the VIP once it has let go",
              file=sys.stderr)
        try:
            addresses.remove(address)
        except OSError as exc:
            print(f"lbctl: could not take {address.ip} off {ifname}: {exc}", file=sys.stderr)
    held = {address.ip for address in probed.held}
    return [ip for ip in ips if ip not in held]


def main(argv):
    """`python -m lbctl.adapters.garp IFNAME ADDRESS...`: keepalived's unit
    announces the VIPs it has just put back on the LAN interface at boot,
    once it has made sure no other host holds them."""
    from ipaddress import IPv4Address, AddressValueError

    if len(argv) < 2:
        print("usage: python -m lbctl.adapters.garp IFNAME ADDRESS...", file=sys.stderr)
        return 64
    try:
        ips = [IPv4Address(text) for text in argv[1:]]
    except AddressValueError as exc:
        print(f"lbctl: could not announce {' '.join(argv[1:])}: {exc}", file=sys.stderr)
        return 64
    wait_for_link(argv[0])
    kept = let_go_of_held(ips, argv[0])
    code = 0 if kept == ips else 1
    ips = kept
    if not ips:
        return code
    try:
        announce(ips, argv[0])
    except OSError as exc:
        # A link still down: the second round, later, is the one that counts.
        print(f"lbctl: could not announce {' '.join(map(str, ips))} on {argv[0]}: {exc}",
              file=sys.stderr)
        code = 1
    announce_again_later(ips, argv[0])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
