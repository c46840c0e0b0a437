"""lbctl doctor's checks: each direct-routing fault found, named and mended,
and a healthy node left with nothing to report."""

import json
from ipaddress import IPv4Address

import pytest

from helpers import PI_ECMP, PI_SINGLE, cluster_from
from lbctl.doctor.facts import Facts, parse_ss
from lbctl.doctor.local import balancer_findings, worker_findings
from lbctl.doctor.report import Finding, NotRun, format_json, format_text, merge
from lbctl.doctor.wire import RESET, SILENT, SYN_ACK, Heard, wire_findings

WEB_VIP, DNS_VIP = IPv4Address("192.168.100.10"), IPv4Address("192.168.100.11")
PI1 = IPv4Address("192.168.100.3")
MACS = {"lb1": "02:00:00:00:00:02", "pi1": "02:00:00:00:00:03", "pi2": "02:00:00:00:00:04",
        "pi3": "02:00:00:00:00:06"}


def healthy_worker(**changes):
    """pi1 as lbctl leaves it: the VIPs on lo, ARP settings, servers on every address."""
    facts = Facts(
        addresses=[(IPv4Address("127.0.0.1"), 8, "lo"), (WEB_VIP, 32, "lo"), (DNS_VIP, 32, "lo"),
                   (PI1, 24, "eth0")],
        links={"lo": {"mtu": 65536, "mac": "", "up": True},
               "eth0": {"mtu": 1500, "mac": MACS["pi1"], "up": True}},
        conf={("all", "arp_ignore"): 1, ("eth0", "arp_ignore"): 1,
              ("all", "arp_announce"): 2, ("eth0", "arp_announce"): 2,
              ("all", "rp_filter"): 0, ("eth0", "rp_filter"): 0},
        listeners={("tcp", "*", 80), ("udp", "*", 53), ("tcp", "127.0.0.1", 631)},
        routes=[("default", "eth0"), ("192.168.100.0/24", "eth0")])
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def checks(facts, node="pi1"):
    return {(f.node, f.check) for f in worker_findings(cluster_from(), node, "eth0", facts,
                                                        "cluster.yaml")}


def test_a_healthy_worker_has_nothing_to_report():
    assert checks(healthy_worker()) == set()


def test_arp_flux_is_the_larger_of_all_and_the_interface():
    facts = healthy_worker()
    facts.conf[("eth0", "arp_ignore")] = 0  # all=1 still rules: no flux
    assert checks(facts) == set()
    facts.conf[("all", "arp_ignore")] = 0
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert (found.node, found.check) == ("pi1", "arp-flux")
    assert "net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.eth0.arp_ignore=1" in found.fix
    facts.conf[("all", "arp_ignore")] = 3  # 3 still answers for a global address on lo
    assert checks(facts) == {("pi1", "arp-flux")}


def test_arp_ignore_8_answers_nothing_and_an_interface_value_is_kept_elsewhere():
    facts = healthy_worker()
    facts.conf[("eth0", "arp_ignore")] = 8  # not even for its own address
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert (found.check, "not even for its own address" in found.problem) == ("arp-silent", True)
    # lbctl's sysctl.d file sets only `all`: eth0's own 8 must go where it is set.
    assert "net.ipv4.conf.eth0.arp_ignore=1" in found.fix
    assert "eth0's own 8 is set elsewhere" in found.fix and "grep -r arp_ignore" in found.fix
    facts.conf[("eth0", "arp_ignore")] = 0
    facts.conf[("all", "arp_ignore")] = 0
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert "set elsewhere" not in found.fix and "keeps `all` so across reboots" in found.fix


def test_a_vip_on_lo_with_a_wider_prefix_is_named():
    facts = healthy_worker(addresses=[(WEB_VIP, 24, "lo"), (DNS_VIP, 32, "lo"), (PI1, 24, "eth0")])
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert found.check == "vip-prefix-on-lo"
    assert found.fix == ("sudo ip address del 192.168.100.10/24 dev lo; "
                         "sudo ip address add 192.168.100.10/32 dev lo")


def test_a_fault_seen_twice_is_shown_once_with_both_evidences():
    seen = [Finding("pi1", "arp-flux", "p1", "who-has .10", "fix"),
            Finding("pi1", "arp-flux", "p2", "who-has .11", "fix"),
            Finding("pi1", "arp-flux", "p1", "who-has .10", "fix"),
            Finding("pi1", "vip-not-on-lo", "p", "e", "add .10"),
            Finding("pi1", "vip-not-on-lo", "p", "e", "add .11")]
    assert merge(seen) == [Finding("pi1", "arp-flux", "p1", "who-has .10; who-has .11", "fix"),
                           seen[3], seen[4]]


def test_arp_announce_below_two_is_named():
    facts = healthy_worker()
    facts.conf[("all", "arp_announce")] = facts.conf[("eth0", "arp_announce")] = 1
    assert checks(facts) == {("pi1", "arp-announce")}


def test_each_vip_missing_from_lo_is_named_with_the_command_that_puts_it_back():
    facts = healthy_worker(addresses=[(IPv4Address("127.0.0.1"), 8, "lo"), (PI1, 24, "eth0")])
    found = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert [f.check for f in found] == ["vip-not-on-lo", "vip-not-on-lo"]
    assert found[0].fix.startswith("sudo ip address add 192.168.100.10/32 dev lo;")
    assert found[1].fix.startswith("sudo ip address add 192.168.100.11/32 dev lo;")


def test_a_vip_on_the_lan_interface_is_taken_off_it_and_one_on_a_dummy_is_fine():
    facts = healthy_worker(addresses=[(DNS_VIP, 32, "dummy0"), (PI1, 24, "eth0"),
                                      (WEB_VIP, 24, "eth0")])
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert found.check == "vip-on-lan-interface" and "web" in found.problem
    assert found.fix.startswith("sudo ip address del 192.168.100.10/24 dev eth0;")


def test_wifi_on_the_same_lan_is_checked_for_arp_flux_too():
    facts = healthy_worker()
    facts.addresses.append((IPv4Address("192.168.100.33"), 24, "wlan0"))
    facts.conf |= {("wlan0", "arp_ignore"): 0, ("wlan0", "arp_announce"): 2}
    assert checks(facts) == set()  # all=1 covers wlan0
    facts.conf[("all", "arp_ignore")] = 0
    found = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert [(f.check, "wlan0" in f.problem) for f in found] == [("arp-flux", True)]
    assert "net.ipv4.conf.wlan0.arp_ignore=1" in found[0].fix


def test_a_vip_only_other_workers_serve_is_not_asked_of_this_one():
    # dns is served by pi1 and pi2 only.
    facts = healthy_worker(addresses=[(WEB_VIP, 32, "lo"), (IPv4Address("192.168.100.6"), 24,
                                                            "eth0")],
                           listeners={("tcp", "*", 80)})
    assert checks(facts, node="pi3") == set()


def test_a_server_bound_to_its_own_address_only_is_named():
    facts = healthy_worker(listeners={("tcp", str(PI1), 80), ("udp", "*", 53)})
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert (found.check, found.node) == ("not-listening-on-vip", "pi1")
    assert "192.168.100.3:80" in found.evidence and "192.168.100.10:80" in found.problem
    facts.listeners.add(("tcp", str(WEB_VIP), 80))  # bound to the VIP itself: fine
    assert checks(facts) == set()


def test_strict_rp_filter_matters_only_when_clients_route_elsewhere():
    facts = healthy_worker()
    facts.conf[("all", "rp_filter")] = 1
    assert checks(facts) == set()  # the default route leaves by eth0: replies go back there
    facts.routes = [("default", "wlan0"), ("192.168.100.0/24", "eth0")]
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert found.check == "rp-filter" and "default via wlan0" in found.problem
    assert "net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.eth0.rp_filter=2" in found.fix
    facts.conf[("all", "rp_filter")] = 2
    assert checks(facts) == set()
    # A route to some clients by a second NIC counts as much as the default route.
    facts.conf[("all", "rp_filter")] = 1
    facts.routes = [("default", "eth0"), ("10.99.0.0/30", "up0"), ("192.168.100.254", "up0")]
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert "192.168.100.254 via up0" in found.problem


def test_rp_filter_reads_the_routes_the_kernel_takes_not_every_route():
    from lbctl.doctor.facts import Route

    facts = healthy_worker()
    facts.conf[("all", "rp_filter")] = 1
    # A Pi on the LAN by Ethernet and Wi-Fi: dhcpcd gives eth0 the lower metric,
    # and Docker's bridge has a network of its own that no client comes from.
    facts.routes = [Route("default", "eth0", 202), Route("default", "wlan0", 303),
                    Route("192.168.100.0/24", "eth0", 202, True),
                    Route("192.168.100.0/24", "wlan0", 303, True),
                    Route("172.17.0.0/16", "docker0", 0, True)]
    assert checks(facts) == set()
    # Wi-Fi preferred: replies to every client beyond the LAN leave by wlan0.
    facts.routes[1] = Route("default", "wlan0", 100)
    (found,) = worker_findings(cluster_from(), "pi1", "eth0", facts, "cluster.yaml")
    assert found.check == "rp-filter" and "default via wlan0" in found.problem
    assert "docker0" not in found.problem


def balancer(**changes):
    facts = Facts(
        addresses=[(IPv4Address("192.168.100.2"), 24, "eth0"), (WEB_VIP, 32, "eth0"),
                   (DNS_VIP, 32, "eth0")],
        links={"eth0": {"mtu": 1500, "mac": MACS["lb1"], "up": True}},
        conf={("all", "rp_filter"): 0, ("eth0", "rp_filter"): 0},
        listeners=set(), ipvs_loaded=True, modules_loaded={"ip_vs", "ip_vs_wrr", "ip_vs_rr"},
        modules_available={"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_wlc", "ip_vs_mh"},
        routes=[("default", "eth0"), ("192.168.100.0/24", "eth0")])
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def balancer_checks(facts, text=PI_SINGLE):
    return [(f.node, f.check, f.problem) for f in
            balancer_findings(cluster_from(text), "lb1", "eth0", facts, "cluster.yaml")]


def test_a_healthy_balancer_has_nothing_to_report():
    assert balancer_checks(balancer()) == []


def test_an_ecmp_balancer_holds_its_vips_on_lo_and_answers_no_arp_for_them():
    routed_web, routed_dns = IPv4Address("10.200.0.10"), IPv4Address("10.200.0.11")
    healthy = dict(addresses=[(IPv4Address("192.168.100.2"), 24, "eth0"),
                              (routed_web, 32, "lo"), (routed_dns, 32, "lo")],
                   conf={("all", "rp_filter"): 0, ("eth0", "rp_filter"): 0,
                         ("all", "arp_ignore"): 1, ("eth0", "arp_ignore"): 0,
                         ("all", "arp_announce"): 2, ("eth0", "arp_announce"): 0})
    assert balancer_checks(balancer(**healthy), PI_ECMP) == []
    # A VIP missing from lo, the other on eth0, and ARP answered for both.
    broken = dict(healthy, addresses=[(IPv4Address("192.168.100.2"), 24, "eth0"),
                                      (routed_dns, 32, "eth0")],
                  conf={**healthy["conf"], ("all", "arp_ignore"): 0})
    found = balancer_checks(balancer(**broken), PI_ECMP)
    assert [(n, c) for n, c, _p in found] == [
        ("lb1", "vip-not-on-lo"), ("lb1", "vip-on-lan-interface"), ("lb1", "arp-flux")]
    assert "drops the requests the router forwards to it" in found[0][2]
    assert "bypassing the router" in found[2][2]
    # Outside mode ecmp a balancer holds the VIPs on its LAN interface.
    assert balancer_checks(balancer()) == []


def test_a_scheduler_this_kernel_lacks_is_named_with_those_it_has():
    text = PI_SINGLE.replace("scheduler: wrr", "scheduler: twos")
    found = balancer_findings(cluster_from(text), "lb1", "eth0", balancer(), "cluster.yaml")
    assert [(f.check, f.node) for f in found] == [("scheduler-missing", "lb1")]
    assert "ip_vs_twos" in found[0].problem and "mh, rr, wlc, wrr" in found[0].fix


def test_a_kernel_without_ipvs_is_said_once():
    facts = balancer(ipvs_loaded=False, modules_loaded=set(), modules_available=set())
    assert [c for _n, c, _p in balancer_checks(facts)] == ["no-ipvs"]


def test_a_single_balancer_without_its_vip_and_a_worker_off_its_lan():
    facts = balancer(addresses=[(IPv4Address("192.168.100.2"), 25, "eth0"),
                                (WEB_VIP, 32, "eth0")])
    found = balancer_checks(facts)
    assert ("lb1", "vip-not-on-balancer") in [(n, c) for n, c, _p in found]
    assert "192.168.100.11" in next(p for _n, c, p in found if c == "vip-not-on-balancer")
    # 192.168.100.0/25 holds every worker but none above .127.
    assert [n for n, c, _p in found if c == "worker-off-lan"] == []
    facts.addresses[0] = (IPv4Address("192.168.100.2"), 30, "eth0")  # .0 to .3: pi1 only
    assert sorted(n for n, c, _p in balancer_checks(facts) if c == "worker-off-lan") == \
        ["pi2", "pi3"]


def heard(**changes):
    h = Heard(node_macs=dict(MACS), vip_macs={WEB_VIP: [MACS["lb1"]], DNS_VIP: [MACS["lb1"]]},
              syn={("web", w): SYN_ACK for w in ("pi1", "pi2", "pi3")})
    for key, value in changes.items():
        getattr(h, key).update(value)
    return h


def wire(h, here="lb1"):
    return [(f.node, f.check) for f in wire_findings(cluster_from(), h, here, "eth0",
                                                     "cluster.yaml")]


def test_a_quiet_lan_has_nothing_to_report():
    assert wire(heard()) == []


def test_a_worker_that_answers_arp_for_the_vip_is_named_by_its_mac():
    h = heard(vip_macs={WEB_VIP: sorted([MACS["lb1"], MACS["pi2"]])})
    (found,) = wire_findings(cluster_from(), h, "lb1", "eth0", "cluster.yaml")
    assert (found.node, found.check) == ("pi2", "arp-flux")
    assert f"pi2 ({MACS['pi2']})" in found.evidence and f"lb1 ({MACS['lb1']})" in found.evidence


def test_two_balancers_or_a_stranger_answering_for_a_vip():
    pair = PI_SINGLE.replace("  lb1: {address: 192.168.100.2, interface: eth0}\n",
                             "  lb1: {address: 192.168.100.2, interface: eth0}\n"
                             "  lb2: {address: 192.168.100.5, interface: eth0}\n")
    h = heard(node_macs={"lb2": "02:00:00:00:00:05"},
              vip_macs={WEB_VIP: [MACS["lb1"], "02:00:00:00:00:05", "02:aa:00:00:00:01"]})
    found = [(f.node, f.check) for f in wire_findings(cluster_from(pair), h, "lb1", "eth0", "f")]
    assert found == [("unknown host 02:aa:00:00:00:01", "vip-conflict"),
                     ("lb1, lb2", "vip-held-twice")]


def test_a_vip_nobody_answers_for_and_a_worker_off_the_segment():
    h = heard(vip_macs={DNS_VIP: []}, node_macs={"pi3": None})
    h.syn.pop(("web", "pi3"))  # no MAC, no probe
    assert wire(h) == [("pi3", "no-arp-answer"), ("lb1", "vip-unanswered")]


def test_in_mode_ecmp_a_vip_nobody_answers_arp_for_is_how_it_should_be():
    cluster = cluster_from(PI_ECMP)
    routed = [IPv4Address("10.200.0.10"), IPv4Address("10.200.0.11")]
    macs = {"lb1": "02:00:00:00:00:02", "lb2": "02:00:00:00:00:05", "lb3": "02:00:00:00:00:07",
            "pi1": "02:00:00:00:00:03", "pi2": "02:00:00:00:00:04"}

    def found(vip_macs):
        h = Heard(node_macs=dict(macs), vip_macs=vip_macs,
                  syn={("web", w): SYN_ACK for w in ("pi1", "pi2")})
        return [(f.node, f.check) for f in wire_findings(cluster, h, "lb1", "eth0", "f")]
    assert found({vip: [] for vip in routed}) == []
    # Whoever answers ARP for a routed VIP takes requests the router should
    # spread: a balancer, a worker, or a stranger.
    assert found({routed[0]: sorted([macs["lb2"], macs["lb3"]]), routed[1]: []}) == [
        ("lb2", "arp-flux"), ("lb3", "arp-flux")]
    assert found({routed[0]: [macs["pi1"], "02:aa:00:00:00:01"], routed[1]: []}) == [
        ("pi1", "arp-flux"), ("unknown host 02:aa:00:00:00:01", "vip-conflict")]


def test_a_reset_means_no_listener_silence_a_dropped_request_and_icmp_a_refusal():
    h = heard(syn={("web", "pi1"): RESET, ("web", "pi2"): SILENT,
                   ("web", "pi3"): "ICMP 3/13 from 192.168.100.6"})
    assert wire(h) == [("pi1", "not-listening-on-vip"), ("pi2", "direct-route-dropped"),
                       ("pi3", "direct-route-refused")]
    refused = wire_findings(cluster_from(), h, "lb1", "eth0", "f")[-1]
    assert "ICMP 3/13 from 192.168.100.6" in refused.evidence


def test_a_balancer_answering_from_its_second_mac_is_still_itself():
    wifi = "02:00:00:00:01:02"
    h = heard(vip_macs={WEB_VIP: sorted([MACS["lb1"], wifi])})
    h.owners = {wifi: "lb1"}
    assert wire(h) == []


def test_a_node_that_answers_only_small_pings_has_a_smaller_mtu():
    h = heard(pings={"pi1": (True, True), "pi2": (True, False), "pi3": (False, False)})
    assert wire(h) == [("pi2", "mtu-mismatch")]  # pi3 answers no ping at all: ICMP is filtered
    (found,) = wire_findings(cluster_from(), h, "lb1", "eth0", "f")
    assert "1500-byte ping" in found.evidence and "mtu 1500" in found.fix


def test_listeners_are_read_as_ss_shows_them():
    tcp = ("LISTEN 0 511 192.168.100.3:80 0.0.0.0:* ino:1 sk:1 <->\n"
           "LISTEN 0 128 127.0.0.1:631 0.0.0.0:* ino:2 sk:2 <->\n"
           "LISTEN 0 511 [::]:80 [::]:* ino:3 sk:3 v6only:1 <->\n"   # nginx's listen [::]:80
           "LISTEN 0 511 *:8080 *:* ino:4 sk:4 v6only:0 <->\n"
           "LISTEN 0 511 [::ffff:192.168.100.10]:443 [::]:* ino:5 sk:5 v6only:0 <->\n")
    assert parse_ss(tcp, "tcp") == {("tcp", "192.168.100.3", 80), ("tcp", "127.0.0.1", 631),
                                    ("tcp", "*", 8080), ("tcp", "192.168.100.10", 443)}
    udp = "UNCONN 0 0 0.0.0.0%eth0:53 0.0.0.0:* ino:6 sk:6 <->\n"
    assert parse_ss(udp, "udp") == {("udp", "*", 53)}


def test_a_worker_listening_on_ipv6_only_does_not_take_the_vip():
    facts = healthy_worker(listeners=parse_ss("LISTEN 0 511 [::]:80 [::]:* v6only:1\n", "tcp")
                           | {("udp", "*", 53)})
    assert checks(facts) == {("pi1", "not-listening-on-vip")}


def test_the_report_says_what_it_could_not_check_and_why():
    text = format_text("pi-web", "worker pi1", [], [NotRun("wire", "needs root")])
    assert text.splitlines()[-2:] == ["not run: wire: needs root", "no problems found"]
    found = wire_findings(cluster_from(), heard(syn={("web", "pi1"): RESET}), "lb1", "eth0", "f")
    data = json.loads(format_json("pi-web", "balancer lb1", found, []))
    assert [f["check"] for f in data["findings"]] == ["not-listening-on-vip"]
    assert set(data["findings"][0]) == {"node", "check", "problem", "evidence", "fix"}


@pytest.mark.parametrize("raw_frames", [False, True])
def test_without_root_the_wire_checks_are_not_run_and_say_why(raw_frames):
    from lbctl.commands.doctor import _why_no_wire

    why = _why_no_wire(healthy_worker(raw_frames=raw_frames), {"mac": MACS["pi1"]})
    assert (why is not None) == (not raw_frames)
    if why:
        assert "root (CAP_NET_RAW)" in why


def test_as_a_client_replies_must_come_from_a_worker_not_the_balancer():
    assert wire(heard(client={"web": (None, MACS["pi2"])}), here=None) == []
    assert wire(heard(client={"web": (None, MACS["lb1"])}), here=None) == [
        ("lb1", "replies-through-balancer")]
    assert wire(heard(client={"web": (None, "02:99:00:00:00:01")}), here=None) == []  # a router
    found = wire_findings(cluster_from(), heard(client={"web": ("Connection refused", None)}),
                          None, "eth0", "cluster.yaml")
    assert [(f.node, f.check) for f in found] == [("lb1", "vip-not-serving")]
    assert "Connection refused" in found[0].problem and "this host's eth0" in found[0].evidence


def test_a_balancer_whose_file_names_an_interface_it_lacks_is_told_its_real_one():
    from lbctl.commands.doctor import _interface_missing

    facts = balancer()
    facts.links = {"lo": {}, "end0": {}}
    addresses = [(IPv4Address("192.168.100.2"), 24, "end0")]
    found = _interface_missing(cluster_from(), "lb1", "eth0", facts, addresses)
    assert (found.node, found.check) == ("lb1", "interface-missing")
    assert "lo, end0" not in found.evidence and "end0, lo" in found.evidence
    assert found.fix.startswith("set `interface: end0` for lb1 in the file")
