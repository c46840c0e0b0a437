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

import socket
import struct
import sys
import time

ETH_P_ARP = 0x0806
BROADCAST = b"\xff" * 6
# Three rounds, 100 ms apart: one lost frame must not leave a cache stale.
COUNT = 3
SPACING = 0.1


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


def main(argv):
    """`python -m lbctl.adapters.garp IFNAME ADDRESS...`: keepalived's unit
    announces the VIPs it has just put back on the LAN interface at boot."""
    from ipaddress import IPv4Address, AddressValueError

    if len(argv) < 2:
        print("usage: python -m lbctl.adapters.garp IFNAME ADDRESS...", file=sys.stderr)
        return 64
    try:
        ips = [IPv4Address(text) for text in argv[1:]]
        announce(ips, argv[0])
    except (AddressValueError, OSError) as exc:
        print(f"lbctl: could not announce {' '.join(argv[1:])} on {argv[0]}: {exc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
