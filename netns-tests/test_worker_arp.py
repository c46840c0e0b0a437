"""A worker never claims the VIP on the LAN: not while it is applied, not when
an apply fails half-way, and not at boot when its network card shows up late."""

import os
import re
import subprocess
import time

from clusters import WEB_VIP, edited
from lbctl.lab.shell import run
from lbctl.render.systemd import exec_start_lines

PI4 = {"address": "192.168.100.7"}


def _arp_claims(tcpdump_output, vip):
    """MACs that told the LAN they hold `vip`: replies for it, and requests sent from it."""
    claims = set()
    for line in tcpdump_output.splitlines():
        source = line.split()[1] if len(line.split()) > 1 else ""
        reply = re.search(rf"Reply {re.escape(vip)} is-at ([0-9a-f:]{{17}})", line)
        if reply:
            claims.add(reply[1])
        elif re.search(rf"tell {re.escape(vip)},", line):
            claims.add(source)
    return claims


class ArpWatch:
    """tcpdump on the client's LAN port, with the client asking who has the VIP
    every 20 ms, so any moment a worker answers for it is on the record."""

    def __init__(self, lab, vip):
        self.lab, self.vip = lab, vip

    def __enter__(self):
        netns = self.lab.nodes["client"].netns
        self.dump = subprocess.Popen(["ip", "netns", "exec", netns, "tcpdump", "-i", "eth0",
                                      "-e", "-n", "-l", "arp"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while "listening on" not in self.dump.stderr.readline():
            assert self.dump.poll() is None, "tcpdump stopped before it was listening"
        self.asker = subprocess.Popen(["ip", "netns", "exec", netns, "arping", "-q", "-i", "eth0",
                                       "-W", "0.02", "-c", "100000", self.vip],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)
        self.asker.terminate()
        self.asker.wait()
        self.dump.terminate()
        out, _ = self.dump.communicate(timeout=30)
        self.claims = _arp_claims(out, self.vip)


def _fresh_worker(lab, node):
    """As a newly installed Pi: no VIP on lo, kernel ARP defaults, nothing lbctl wrote."""
    lab.sh(node, ["ip", "address", "flush", "dev", "lo", "scope", "global"])
    for key in ("arp_ignore", "arp_announce"):
        for scope in ("all", "eth0"):
            lab.sh(node, ["sysctl", "-q", "-w", f"net.ipv4.conf.{scope}.{key}=0"])
    root = lab.nodes[node].root
    for entry in os.listdir(root):
        run(["rm", "-rf", os.path.join(root, entry)])


def test_a_fresh_worker_never_answers_arp_for_the_vip_while_applied(lab, base):
    path = lab.write("with-pi4", edited(workers=lambda w: dict(w, pi4=PI4)))
    _fresh_worker(lab, "pi4")

    # An apply that fails half-way (here: /proc/sys read-only) must not leave
    # the VIP on a worker that still answers ARP for it.
    failing = lab.sh("pi4", ["unshare", "-m", "--", "sh", "-c",
                             'mount --bind /proc/sys /proc/sys && '
                             'mount -o remount,bind,ro /proc/sys && exec "$@"', "sh",
                             *lab.lbctl_argv("apply", str(path), node="pi4")], check=False)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "sysctl net.ipv4.conf.all.arp_ignore" in failing.stderr
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(WEB_VIP) == {lab.mac("lb1")}

    # A whole apply on a fresh worker, watched on the wire from start to end.
    _fresh_worker(lab, "pi4")
    with ArpWatch(lab, WEB_VIP) as watch:
        result = lab.lbctl("pi4", "apply", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert WEB_VIP in lab.sh("pi4", ["ip", "-4", "-o", "address", "show", "dev", "lo"]).stdout
    # The balancer answered throughout (the watch saw ARP), and nobody else did.
    assert watch.claims == {lab.mac("lb1")}


def test_a_worker_whose_network_card_appears_late_still_boots_with_its_vip(lab, base):
    """The boot unit runs before a slow USB NIC exists; the VIP must still come up,
    and the NIC, once it appears, must not answer ARP for it."""
    root = lab.nodes["pi1"].root
    with open(os.path.join(root, "etc/systemd/system/lbctl-lab-vips.service")) as fh:
        commands = exec_start_lines(fh.read())
    sysctl_dir = os.path.join(root, "etc/sysctl.d")
    late = "lab-late-nic"
    run(["ip", "netns", "add", late])
    try:
        run(["ip", "-n", late, "link", "set", "lo", "up"])
        for key in ("arp_ignore", "arp_announce"):
            run(["ip", "netns", "exec", late, "sysctl", "-q", "-w", f"net.ipv4.conf.all.{key}=0"])
        # Boot: only lo exists.  Each command as systemd runs it, with this node's /etc.
        for argv in commands:
            booted = run(["ip", "netns", "exec", late, "unshare", "-m", "--", "sh", "-c",
                          'mount --bind "$0" /etc/sysctl.d && exec "$@"', sysctl_dir, *argv],
                         check=False)
            assert booted.returncode == 0, f"{argv}: {booted.stderr}"
        assert WEB_VIP in run(["ip", "-n", late, "-4", "-o", "address", "show", "dev", "lo"]).stdout

        # The NIC appears, joins the LAN, and the VIP is still only the balancer's.
        run(["ip", "link", "add", "eth0", "netns", late, "type", "veth",
             "peer", "name", "plate", "netns", lab.lan])
        run(["ip", "-n", lab.lan, "link", "set", "plate", "master", "br0", "up"])
        run(["ip", "-n", late, "address", "add", "192.168.100.30/24", "dev", "eth0"])
        run(["ip", "-n", late, "link", "set", "eth0", "up"])
        late_mac = run(["ip", "-n", late, "-br", "link", "show", "eth0"]).stdout.split()[2]
        lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
        macs = lab.vip_macs(WEB_VIP)
        assert late_mac not in macs
        assert macs == {lab.mac("lb1")}
    finally:
        run(["ip", "netns", "del", late], check=False)
