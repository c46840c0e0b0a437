"""Gratuitous ARP: tell the LAN that this host now holds an address.

A balancer that takes a VIP on (from a pair's backup, or from the balancer it
replaces) has another MAC than the one clients and the router have cached for
the VIP.  Unannounced, they keep sending to the old MAC until their entry
expires: several seconds on Linux, up to hours on many routers.  keepalived
announces the VIPs it holds; this announces the ones lbctl adds itself.

The frame is an ARP Announcement (RFC 5227): a request for the address from
the address, which every Linux host and common router takes to update an
entry it already has, and which creates none where there was none.

Why not scapy: this is one fixed 42-byte frame, and importing scapy costs a
Pi seconds and tens of MB on every apply that adds a VIP.
"""

import os
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


def announcement(mac, ip):
    """The Ethernet frame announcing that `ip` (IPv4Address) is at `mac` (6 bytes)."""
    ethernet = BROADCAST + mac + struct.pack("!H", ETH_P_ARP)
    # Ethernet, IPv4, 6-byte hardware and 4-byte protocol addresses, a request.
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
    return ethernet + arp + mac + ip.packed + b"\0" * 6 + ip.packed


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
    read_state = read_state or _operstate
    deadline = clock() + patience
    while (state := read_state(ifname)) not in ("up", "unknown", "absent") \
            and clock() < deadline:
        sleep(0.1)
    return state


def _operstate(ifname):
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


def main(argv):
    """`python -m lbctl.adapters.garp IFNAME ADDRESS...`: keepalived's unit
    announces the VIPs it has just put back on the LAN interface at boot."""
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
    code = 0
    try:
        announce(ips, argv[0])
    except OSError as exc:
        # A link still down: the second round, later, is the one that counts.
        print(f"lbctl: could not announce {' '.join(argv[1:])} on {argv[0]}: {exc}",
              file=sys.stderr)
        code = 1
    announce_again_later(ips, argv[0])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
