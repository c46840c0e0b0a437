"""The gratuitous ARP a balancer sends for a VIP it adds, read back by scapy."""

import errno
import os
import socket
import subprocess
import sys
from ipaddress import IPv4Address

import pytest
from scapy.layers.l2 import ARP, Ether

from lbctl.adapters.garp import ETH_P_ARP, announce, announcement

VIP = IPv4Address("192.168.100.10")
OTHER = IPv4Address("192.168.100.11")
MAC = bytes.fromhex("020000000102")


def test_the_frame_is_an_arp_announcement_of_the_vip_from_the_mac():
    frame = Ether(announcement(MAC, VIP))
    assert frame.dst == "ff:ff:ff:ff:ff:ff" and frame.src == "02:00:00:00:01:02"
    arp = frame[ARP]
    assert arp.op == 1  # who-has, as RFC 5227's ARP Announcement and keepalived's GARP
    assert (arp.hwsrc, arp.psrc) == ("02:00:00:00:01:02", str(VIP))
    assert (arp.hwdst, arp.pdst) == ("00:00:00:00:00:00", str(VIP))


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_announce_sends_the_frames_on_the_interface():
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP)) as seen:
        seen.bind(("lo", ETH_P_ARP))
        seen.settimeout(2)
        waits = []
        announce([VIP, OTHER], "lo", count=3, spacing=0.25, sleep=waits.append)
        frames = [Ether(seen.recv(2048)) for _ in range(6)]
    assert waits == [0.25, 0.25]  # three rounds, each of both addresses
    assert [f[ARP].psrc for f in frames] == [str(VIP), str(OTHER)] * 3
    assert all(f[ARP].psrc == f[ARP].pdst for f in frames)


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_an_interface_that_is_not_there_raises_oserror():
    with pytest.raises(OSError) as raised:
        announce([VIP], "no-such-if0", sleep=lambda s: None)
    assert raised.value.errno == errno.ENODEV


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_the_units_command_announces_each_address_and_says_what_failed():
    # As keepalived's unit runs it after putting the VIPs back at boot.
    command = [sys.executable, "-I", "-m", "lbctl.adapters.garp"]
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP)) as seen:
        seen.bind(("lo", ETH_P_ARP))
        seen.settimeout(5)
        done = subprocess.run([*command, "lo", str(VIP), str(OTHER)], capture_output=True,
                              text=True, timeout=30)
        assert (done.returncode, done.stderr) == (0, "")
        frames = [Ether(seen.recv(2048)) for _ in range(6)]
    assert sorted(f[ARP].psrc for f in frames) == sorted([str(VIP), str(OTHER)] * 3)
    gone = subprocess.run([*command, "no-such-if0", str(VIP)], capture_output=True, text=True,
                          timeout=30)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"lbctl: could not announce {VIP} on no-such-if0: "), gone.stderr
