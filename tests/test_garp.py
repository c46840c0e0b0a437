"""The ARP a balancer sends for a VIP: the probe before it adds one, the
announcement after; read back by scapy."""

import errno
import os
import socket
import subprocess
import sys
import threading
from ipaddress import IPv4Address

import pytest
from scapy.layers.l2 import ARP, Ether

from fakes import FakeAddresses
from lbctl.adapters.garp import (
    ETH_P_ARP, announce, announce_again_later, announcement, claim_in, held_here, holders, probe,
    wait_for_link)

VIP = IPv4Address("192.168.100.10")
OTHER = IPv4Address("192.168.100.11")
LATER = IPv4Address("127.0.0.9")  # held here: lo holds 127.0.0.0/8
MAC = bytes.fromhex("020000000102")


def arp_socket_on_lo(timeout):
    """A packet socket that hears every ARP frame sent on lo."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    sock.bind(("lo", ETH_P_ARP))
    sock.settimeout(timeout)
    return sock


def test_the_frame_is_an_arp_announcement_of_the_vip_from_the_mac():
    frame = Ether(announcement(MAC, VIP))
    assert frame.dst == "ff:ff:ff:ff:ff:ff" and frame.src == "02:00:00:00:01:02"
    arp = frame[ARP]
    assert arp.op == 1  # who-has, as RFC 5227's ARP Announcement and keepalived's GARP
    assert (arp.hwsrc, arp.psrc) == ("02:00:00:00:01:02", str(VIP))
    assert (arp.hwdst, arp.pdst) == ("00:00:00:00:00:00", str(VIP))


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_announce_sends_the_frames_on_the_interface():
    with arp_socket_on_lo(2) as seen:
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
    with arp_socket_on_lo(5) as seen:
        done = subprocess.run([*command, "lo", str(VIP), str(OTHER)], capture_output=True,
                              text=True, timeout=30)
        assert (done.returncode, done.stderr) == (0, "")
        # First it asks whether another host holds them (probes, from
        # 0.0.0.0), then, as none answered, announces them.
        frames = [Ether(seen.recv(2048))[ARP] for _ in range(12)]
    probes = [f.pdst for f in frames if f.psrc == "0.0.0.0"]
    announced = [f.psrc for f in frames if f.psrc != "0.0.0.0"]
    assert sorted(probes) == sorted(announced) == sorted([str(VIP), str(OTHER)] * 3)
    assert frames.index(next(f for f in frames if f.psrc != "0.0.0.0")) == 6
    gone = subprocess.run([*command, "no-such-if0", str(VIP)], capture_output=True, text=True,
                          timeout=30)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"lbctl: could not announce {VIP} on no-such-if0: "), gone.stderr


def test_at_boot_the_announcement_waits_a_bounded_time_for_the_link():
    now = [0.0]
    states = iter(["down", "lowerlayerdown", "up"])
    assert wait_for_link("eth0", read_state=lambda _: next(states), clock=lambda: now[0],
                         sleep=lambda s: now.__setitem__(0, now[0] + s)) == "up"
    assert now[0] == pytest.approx(0.2)
    # A card whose link never comes: announced anyway (a failure is reported
    # there), after the bound.
    now[0] = 0.0
    assert wait_for_link("eth0", patience=5, read_state=lambda _: "down", clock=lambda: now[0],
                         sleep=lambda s: now.__setitem__(0, now[0] + s)) == "down"
    assert 5.0 <= now[0] < 5.2
    assert wait_for_link("lo") == "unknown"  # no carrier to wait for
    assert wait_for_link("no-such-if0") == "absent"


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_the_second_announcement_comes_later_from_a_child():
    # A switch port that has just come up may drop the first rounds.
    import time

    with arp_socket_on_lo(5) as seen:
        started = time.monotonic()
        # An address of its own: another test's second round may be on lo.
        child = announce_again_later([LATER], "lo", after=0.5)
        frames = []
        while len(frames) < 3:
            if (frame := Ether(seen.recv(2048)))[ARP].psrc == str(LATER):
                frames.append(frame)
        arrived = time.monotonic() - started
    assert os.waitpid(child, 0)[1] == 0
    assert arrived >= 0.5


def test_the_second_round_leaves_out_what_this_host_no_longer_holds():
    # apply --remove, or the VIP moved, within the 5 s.
    assert held_here([IPv4Address("127.0.0.1"), VIP]) == [IPv4Address("127.0.0.1")]


HOLDER = "02:00:00:00:09:09"


def test_the_probe_asks_for_the_vip_from_no_address():
    arp = Ether(probe(MAC, VIP))[ARP]
    assert arp.op == 1
    assert (arp.hwsrc, arp.psrc) == ("02:00:00:00:01:02", "0.0.0.0")  # RFC 5227: no cache learns
    assert (arp.hwdst, arp.pdst) == ("00:00:00:00:00:00", str(VIP))


def test_a_claim_is_another_macs_reply_or_announcement_for_a_probed_vip():
    wanted = {VIP.packed: VIP}
    reply = Ether(src=HOLDER, dst="02:00:00:00:01:02") / ARP(
        op=2, hwsrc=HOLDER, psrc=str(VIP), hwdst="02:00:00:00:01:02", pdst="0.0.0.0")
    assert claim_in(bytes(reply), {MAC}, wanted) == (VIP, HOLDER)
    announced = Ether(src=HOLDER, dst="ff:ff:ff:ff:ff:ff") / ARP(
        op=1, hwsrc=HOLDER, psrc=str(VIP), pdst=str(VIP))
    assert claim_in(bytes(announced), {MAC}, wanted) == (VIP, HOLDER)
    # Not a claim: our own frame, another host's probe for it (it wants the
    # VIP too, holds nothing), a reply for another address, an IPv4 packet.
    # (A MAC of this host's, another card on the same LAN, is ours too.)
    assert claim_in(bytes(reply), {MAC, bytes.fromhex(HOLDER.replace(":", ""))}, wanted) is None
    assert claim_in(bytes(Ether(src=HOLDER) / ARP(hwsrc=HOLDER, psrc="0.0.0.0", pdst=str(VIP))),
                    {MAC}, wanted) is None
    other = Ether(src=HOLDER) / ARP(op=2, hwsrc=HOLDER, psrc=str(OTHER))
    assert claim_in(bytes(other), {MAC}, wanted) is None
    assert claim_in(bytes(Ether(src=HOLDER, type=0x0800) / bytes(40)), {MAC}, wanted) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_holders_names_the_mac_that_answers_a_probe_and_no_other():
    # A host on lo that answers each probe for VIP, and ignores OTHER's.
    with arp_socket_on_lo(0.2) as host:
        stop = threading.Event()

        def answer():
            while not stop.is_set():
                try:
                    asked = Ether(host.recv(2048))[ARP]
                except socket.timeout:
                    continue
                if asked.op == 1 and asked.psrc == "0.0.0.0" and asked.pdst == str(VIP):
                    host.send(bytes(Ether(src=HOLDER, dst=asked.hwsrc) / ARP(
                        op=2, hwsrc=HOLDER, psrc=str(VIP), hwdst=asked.hwsrc, pdst="0.0.0.0")))

        answering = threading.Thread(target=answer)
        answering.start()
        try:
            found = holders([VIP, OTHER], "lo", count=2, spacing=0.1, listen=0.5)
        finally:
            stop.set()
            answering.join()
    assert found == {VIP: HOLDER}


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")
def test_probing_an_interface_that_is_not_there_raises_oserror():
    with pytest.raises(OSError):
        holders([VIP], "no-such-if0")


def test_an_interface_that_cannot_probe_is_named_not_waited_for(monkeypatch):
    import lbctl.adapters.garp as garp
    from lbctl.adapters.addrs import AddressIp
    from lbctl.state import Address

    gone = AddressIp().probe([Address(VIP, "no-such-if0")], listen=0.1)
    assert (gone.held, gone.unasked) == ({}, {"no-such-if0": "its link is absent"})

    def refused(ips, ifname, listen):
        raise OSError(errno.ENOBUFS, "No buffer space available")
    monkeypatch.setattr(garp, "holders", refused)
    full = AddressIp().probe([Address(VIP, "lo")], listen=0.1)  # lo's state: "unknown"
    assert (full.held, full.unasked) == ({}, {"lo": "No buffer space available"})


def test_at_boot_a_vip_another_host_answers_for_is_taken_off_again(capsys):
    from lbctl.adapters.garp import let_go_of_held

    addresses = FakeAddresses({(VIP, 32, "lo"), (OTHER, 32, "lo")}, elsewhere={VIP: HOLDER})
    kept = let_go_of_held([VIP, OTHER], "lo", addresses)
    assert kept == [OTHER] and addresses.list() == [(OTHER, 32, "lo")]
    said = capsys.readouterr().err
    assert said.startswith(f"lbctl: another host ({HOLDER}) answers ARP for {VIP} on lo: "
                           "taking it off lo again"), said
    # A card no probe could go out on (its link not up) is not asked: it
    # keeps what it put there.
    late = FakeAddresses({(VIP, 32, "eth0")}, elsewhere={VIP: HOLDER})
    late.unasked = {"eth0": "its link is down"}
    assert let_go_of_held([VIP], "eth0", late) == [VIP]
    assert late.list() == [(VIP, 32, "eth0")]
