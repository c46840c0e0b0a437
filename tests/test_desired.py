"""From the cluster to one node's desired state."""

from ipaddress import IPv4Address
from pathlib import Path

import pytest

from helpers import cluster_from
from lbctl.engine.desired import desired_state, find_node
from lbctl.errors import NodeError
from lbctl.layout import Layout
from lbctl.render.systemd import exec_start_lines
from lbctl.state import Address, DestSpec, ServiceSpec

VIP = IPv4Address("192.168.100.10")
DNS_VIP = IPv4Address("192.168.100.11")


def test_find_node_by_local_address():
    cluster = cluster_from()
    assert find_node(cluster, {IPv4Address("127.0.0.1"), IPv4Address("192.168.100.4")}) == "pi2"


def test_find_node_fails_clearly_without_a_match_or_with_several():
    cluster = cluster_from()
    with pytest.raises(NodeError, match="run on a node of the cluster"):
        find_node(cluster, {IPv4Address("10.0.0.1")})
    with pytest.raises(NodeError, match="several nodes"):
        find_node(cluster, {IPv4Address("192.168.100.3"), IPv4Address("192.168.100.4")})
    with pytest.raises(NodeError, match="not in"):
        find_node(cluster, set(), requested="pi9")
    assert find_node(cluster, {IPv4Address("192.168.100.2"), IPv4Address("192.168.100.3")},
                     requested="lb1") == "lb1"
    # A name is never enough: the host must hold the node's address.
    with pytest.raises(NodeError, match="node lb1 has address 192.168.100.2, which this host"):
        find_node(cluster, {IPv4Address("192.168.100.3")}, requested="lb1")


def test_balancer_holds_vips_on_its_lan_and_programs_every_real_server():
    state = desired_state(cluster_from(), "lb1", "eth0")
    assert state.role == "balancer"
    assert state.addresses == {Address(VIP, "eth0"), Address(DNS_VIP, "eth0")}
    assert len(state.services) == 2
    assert set(state.services.values()) == {ServiceSpec("wrr"), ServiceSpec("rr")}
    weights = sorted((str(k), v.weight) for k, v in state.dests.items())
    assert weights == [
        ("tcp 192.168.100.10:80 -> 192.168.100.3:80", 1),
        ("tcp 192.168.100.10:80 -> 192.168.100.4:80", 1),
        ("tcp 192.168.100.10:80 -> 192.168.100.6:80", 2),
        ("udp 192.168.100.11:53 -> 192.168.100.3:53", 1),
        ("udp 192.168.100.11:53 -> 192.168.100.4:53", 1),
    ]
    assert all(v == DestSpec(v.weight) for v in state.dests.values())  # direct routing
    assert not state.files
    # A packet for a deleted real server's connection is scheduled afresh, and a
    # persistence template never pins a client to a drained real server.
    assert state.sysctls == {"net.ipv4.vs.expire_nodest_conn": "1",
                             "net.ipv4.vs.expire_quiescent_template": "1"}


def test_worker_holds_only_the_vips_of_its_services_on_lo_with_arp_settings():
    pi3 = desired_state(cluster_from(), "pi3", "eth0")
    assert pi3.addresses == {Address(VIP, "lo")}
    # Only `all`: the kernel takes the larger of `all` and the interface's own
    # value, and a key naming an interface that appears late would fail at boot.
    assert pi3.sysctls == {"net.ipv4.conf.all.arp_ignore": "1",
                           "net.ipv4.conf.all.arp_announce": "2"}
    pi1 = desired_state(cluster_from(), "pi1", "enp1s0")
    assert pi1.addresses == {Address(VIP, "lo"), Address(DNS_VIP, "lo")}
    assert pi1.sysctls == pi3.sysctls


def test_worker_persists_sysctls_and_a_boot_unit_that_restores_its_vips():
    state = desired_state(cluster_from(), "pi1", "eth0")
    sysctl_file = state.files["/etc/sysctl.d/90-lbctl-pi-web.conf"].content
    assert "net.ipv4.conf.all.arp_ignore = 1" in sysctl_file
    assert "eth0" not in sysctl_file
    unit = state.files["/etc/systemd/system/lbctl-pi-web-vips.service"].content
    # At boot as in apply: the ARP settings first, then the VIPs.
    assert exec_start_lines(unit) == [
        ["/usr/sbin/sysctl", "-q", "-p", "/etc/sysctl.d/90-lbctl-pi-web.conf"],
        ["/usr/sbin/ip", "-4", "address", "replace", "192.168.100.10/32", "dev", "lo"],
        ["/usr/sbin/ip", "-4", "address", "replace", "192.168.100.11/32", "dev", "lo"],
    ]
    assert state.links == {
        "/etc/systemd/system/multi-user.target.wants/lbctl-pi-web-vips.service":
            "/etc/systemd/system/lbctl-pi-web-vips.service"}


def test_every_sysctl_in_the_shipped_file_carries_a_reason():
    state = desired_state(cluster_from(), "pi1", "eth0")
    text = state.files["/etc/sysctl.d/90-lbctl-pi-web.conf"].content
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.startswith("#"):
            above = [l for l in lines[:i] if l.strip()][-1]
            assert above.startswith("#") or "=" in above, f"no reason above {line!r}"


def test_a_balancer_keeps_a_copy_of_the_file_and_a_boot_unit_that_applies_it():
    from lbctl.engine.desired import BootApply, strip_saved_copy_header

    from helpers import PI_SINGLE

    boot = BootApply(PI_SINGLE, "/opt/lbctl/bin/python")
    state = desired_state(cluster_from(), "lb1", "eth0", boot=boot)
    saved = state.files["/etc/lbctl/pi-web.yaml"].content
    # The file as applied, under a line that names the copy's format; the boot
    # unit reads it as the same cluster.
    assert saved.startswith("# lbctl saved-copy format 1: ") and saved.endswith("\n" + PI_SINGLE)
    assert cluster_from(saved).services == cluster_from(PI_SINGLE).services
    # At boot the unit applies the copy itself: the copy it keeps stays the same.
    again = desired_state(cluster_from(saved), "lb1", "eth0",
                          boot=BootApply(strip_saved_copy_header(saved), "/opt/lbctl/bin/python"))
    assert again.files["/etc/lbctl/pi-web.yaml"].content == saved
    unit = state.files["/etc/systemd/system/lbctl-pi-web-balancer.service"].content
    assert "ExecStart=/opt/lbctl/bin/python -I -m lbctl apply /etc/lbctl/pi-web.yaml --node lb1" in unit
    # ip_vs is loaded before apply sets its sysctls and programs the table.
    commands = [line for line in unit.splitlines() if line.startswith("ExecStart")]
    assert commands[0] == "ExecStartPre=/usr/sbin/modprobe ip_vs"
    assert state.links == {
        "/etc/systemd/system/multi-user.target.wants/lbctl-pi-web-balancer.service":
            "/etc/systemd/system/lbctl-pi-web-balancer.service"}


PAIR_FILE = (Path(__file__).parent / "golden" / "pi-pair.yaml").read_text()


@pytest.mark.parametrize("timeouts, refresh", [
    ("", "10"),
    ("ipvs: {timeouts: {tcp: 600, udp: 20}}\n", "10"),
    # A timeout below the period: a new connection would never be sent.
    ("ipvs: {timeouts: {tcp: 4, udp: 20}}\n", "4"),
    ("ipvs: {timeouts: {udp: 7}}\n", "7"),
])
def test_a_pair_syncs_each_connection_as_it_becomes_established(timeouts, refresh):
    """No packet count (sync period 0); a refresh period the file's timeouts
    do not undercut."""
    cluster = cluster_from(timeouts + PAIR_FILE)
    state = desired_state(cluster, "lb1", "eth0", layout=Layout(cluster.name))
    assert state.sysctls["net.ipv4.vs.sync_threshold"] == "3\t0"
    assert state.sysctls["net.ipv4.vs.sync_refresh_period"] == refresh


def test_the_refresh_period_is_set_before_the_threshold_that_hands_over_to_it():
    """"3 0" with no refresh period yet would send a connection only at its
    third packet, the kernel's default that lost a handshake-only client."""
    cluster = cluster_from(PAIR_FILE)
    state = desired_state(cluster, "lb1", "eth0", layout=Layout(cluster.name))
    keys = list(state.sysctls)
    assert keys.index("net.ipv4.vs.sync_refresh_period") < \
        keys.index("net.ipv4.vs.sync_threshold")
