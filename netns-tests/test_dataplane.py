"""What a user sees once the base cluster is applied: traffic, ARP, direct return."""

import collections
import json
import re
import subprocess


from clusters import DNS_VIP, WEB_VIP, edited


def test_apply_then_requests_reach_every_worker_in_weight_proportion(lab, base):
    answers = lab.ask_web(40)
    counts = collections.Counter(answers)
    # wrr with weights 1, 1, 2 hands out exactly this many of every 4 requests.
    # Within one: a connection the test did not make (seen once in a full
    # run, the shared lab's earlier tests leave clients behind) takes one turn
    # of the sequence, and the counts shift by one.  Equal weights would
    # give 13, 13 and 14.
    expected = {"served by pi1": 10, "served by pi2": 10, "served by pi3": 20}
    assert sum(counts.values()) == 40 and all(
        abs(counts[worker] - share) <= 1 for worker, share in expected.items()), (
        counts, lab.sh("lb1", ["ipvsadm", "-Ln", "--stats"]).stdout)


def test_arp_for_the_vip_is_answered_only_by_the_balancer(lab, base):
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    macs = lab.vip_macs(WEB_VIP)
    assert macs == {lab.mac("lb1")}
    # The workers hold the VIP on lo, yet none of them claimed it.
    assert not macs & {lab.mac(w) for w in ("pi1", "pi2", "pi3")}


def _capture_response_macs(lab, requests):
    dump = subprocess.Popen(
        ["ip", "netns", "exec", lab.nodes["client"].netns, "tcpdump", "-i", "eth0", "-e", "-n",
         "-l", "-c", "30", "tcp and src port 80"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while "listening on" not in dump.stderr.readline():
            assert dump.poll() is None, "tcpdump stopped before it was listening"
        lab.ask_web(requests)
        out, _ = dump.communicate(timeout=60)
    finally:
        dump.kill()
    return [line.split()[1] for line in out.splitlines() if " > " in line]


def test_a_vip_another_host_answers_for_is_not_taken_and_its_mac_is_named(lab, base):
    # The client was given the new service's VIP by mistake: lb1 must not
    # take it too, or the LAN's ARP caches would split its clients.
    vip = "192.168.100.12"
    spec = edited(services=lambda s: {**s, "admin": {"vip": vip, "port": 80, "scheduler": "rr"}})
    path = lab.write("admin-vip", spec)
    lab.sh("client", ["ip", "address", "add", f"{vip}/24", "dev", "eth0"])
    try:
        results = lab.apply_all(path)
        doctor = lab.lbctl("lb1", "doctor", str(path), "--json")
    finally:
        lab.sh("client", ["ip", "address", "del", f"{vip}/24", "dev", "eth0"])
    refused = results["lb1"]
    assert refused.returncode != 0, refused.stdout
    said = refused.stdout + refused.stderr
    assert f"answers ARP for {vip} (by {lab.mac('client')})" in said, said
    assert "this balancer left it out (the rest is applied)" in said, said
    assert vip not in lab.sh("lb1", ["ip", "-4", "-o", "address", "show"]).stdout
    # The rest is in place: the other services still serve.
    assert all(a.startswith("served by pi") for a in lab.ask_web(6))
    # doctor names the other host as well.
    found = {(f["node"], f["check"]) for f in json.loads(doctor.stdout)["findings"]}
    assert (f"unknown host {lab.mac('client')}", "vip-conflict") in found, doctor.stdout
    # The workers took it on lo, where they answer no ARP, so they are no
    # holder: with the client's copy gone, the next apply takes it.
    assert all(results[w].returncode == 0 for w in ("pi1", "pi2", "pi3")), results
    applied = lab.lbctl("lb1", "apply", str(path))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert lab.vip_macs(vip) == {lab.mac("lb1")}
    assert all(a.startswith("served by pi") for a in lab.ask(f"http://{vip}/", 6)), vip


def test_responses_reach_the_client_from_the_workers_macs(lab, base):
    sources = _capture_response_macs(lab, 12)
    workers = {lab.mac(w) for w in ("pi1", "pi2", "pi3")}
    assert len(sources) >= 12
    assert set(sources) <= workers, (sources, workers)
    assert lab.mac("lb1") not in sources
    # All three workers answered directly.
    assert set(sources) == workers


def test_a_udp_service_balances_too(lab, base):
    answers = lab.udp_ask(DNS_VIP, 53, count=10)
    assert collections.Counter(answers) == {"served by pi1": 5, "served by pi2": 5}, answers


def test_the_balancer_carries_under_five_percent_of_response_bytes(lab, base):
    b_rx0, b_tx0 = lab.iface_bytes("lb1")
    c_rx0, _ = lab.iface_bytes("client")
    for _ in range(6):
        lab.sh("client", ["curl", "-sS", "-o", "/dev/null", f"http://{WEB_VIP}/blob"])
    b_rx1, b_tx1 = lab.iface_bytes("lb1")
    c_rx1, _ = lab.iface_bytes("client")
    delivered = c_rx1 - c_rx0
    through_balancer = (b_rx1 - b_rx0) + (b_tx1 - b_tx0)
    assert delivered > 6 * 1_000_000
    assert through_balancer < 0.05 * delivered, (through_balancer, delivered)


def test_status_shows_services_real_servers_and_connections(lab, base):
    lab.ask_web(4)
    out = lab.lbctl("lb1", "status").stdout
    assert out.splitlines()[0] == "lbctl status: cluster lab, node lb1", out
    assert f"tcp {WEB_VIP}:80 wrr" in out
    # Direct routing: incoming figures only, and a line that says why.
    assert re.search(rf"tcp {re.escape(WEB_VIP)}:80 wrr  connections [1-9]\d* \(\d+/s\)"
                     r"  in [1-9]\d* packets \(\d+/s\)  [1-9]\d* bytes \(\d+ B/s\)", out), out
    assert "replies go from the workers straight to the clients" in out
    assert " out " not in out
    for addr, weight in (("192.168.100.3", 1), ("192.168.100.4", 1), ("192.168.100.6", 2)):
        assert re.search(rf"-> {re.escape(addr)}:80\s+route\s+weight {weight}\s", out), out
    worker = lab.lbctl("pi1", "status").stdout
    assert f"VIPs on lo: {WEB_VIP}, {DNS_VIP}" in worker
    assert re.search(r"eth0\s+arp_ignore=1\s+arp_announce=2", worker), worker


def test_status_json_reports_connection_counts(lab, base):
    import json

    lab.ask_web(6)
    report = json.loads(lab.lbctl("lb1", "status", "--json").stdout)
    web = next(s for s in report["services"] if s["service"] == f"tcp {WEB_VIP}:80")
    assert web["connections"] >= 6
    assert web["in_packets"] >= 6 * 3 and web["in_bytes"] > 0
    assert not [key for key in web if key.startswith("out")], web
    assert sum(d["inactive"] + d["active"] for d in web["real_servers"]) >= 1
