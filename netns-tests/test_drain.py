"""Taking a worker out drains it, whatever holds its connections: keepalived's
reload, a client's persistence template, or UDP flows IPVS counts as inactive."""

import sys
from ipaddress import IPv4Address

from clusters import DNS_VIP, WEB_VIP, edited, steady_pair
from conftest import measured as report
import ipvs_table
from lbctl.errors import LabError
from test_keepalived import _blob_hashes, ipvs_web_dests, ipvs_web_weights, pair  # noqa: F401

PI3 = "192.168.100.6"


def _connections(lab, node, vip, port, protocol, real_server):
    """(active, inactive) of a real server ("ADDRESS:PORT") in a balancer's table."""
    rows = ipvs_table.service(ipvs_table.on(lab, node), vip, port, protocol) or {}
    row = rows.get(real_server)
    return (row.active, row.inactive) if row else (0, 0)


def _web_active(lab, real_server, node="lb1"):
    return _connections(lab, node, WEB_VIP, 80, "tcp", f"{real_server}:80")[0]


def _apply(lab, path, nodes, *extra):
    """Apply on each node in turn; returns what they printed."""
    printed = ""
    for node in nodes:
        result = lab.lbctl(node, "apply", str(path), *extra)
        assert result.returncode == 0, f"{node}: {result.stdout}{result.stderr}"
        printed += f"{node}: {result.stdout}"
    return printed


def test_a_worker_removed_under_keepalived_finishes_its_downloads_first(lab, pair):  # noqa: F811
    # The pair with 1 s adverts first: a flap during the reloads below would
    # send the downloads' ends through lb2, and lb1 would count them for minutes.
    _apply(lab, lab.write("pair-steady", steady_pair()), ("lb2", "lb1"))
    lab.wait_for_roles(timeout=60)
    without_pi3 = lab.write("pair-no-pi3", steady_pair(
        services=lambda s: {**s, "web": {**s["web"], "workers": ["pi1", "pi2"]}}))
    # 30 downloads of 1 MiB at 4 KiB/s, a third or more on pi3: they would take
    # over 4 minutes, far longer than two applies on a slow, emulated VM; they
    # are hurried once pi3 is drained.
    downloads = lab.traffic("downloads", WEB_VIP, "--count", 30, "--rate", 4 * 1024,
                            "--timeout", 600)
    lab.wait_for(lambda: _web_active(lab, PI3) >= 5, what="downloads running on pi3")
    # The balancers only: the worker keeps its VIP until its own apply, after the drain.
    applied = _apply(lab, without_pi3, ("lb2", "lb1"))
    assert ipvs_web_weights(lab, "lb1")[f"{PI3}:80"] == 0
    plan = lab.lbctl("lb1", "plan", str(without_pi3), "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert f"~ real server tcp {WEB_VIP}:80 -> {PI3}:80 draining" in plan.stdout, \
        plan.stdout + applied + lab.sh("lb1", ["ipvsadm", "-Ln", "-t", f"{WEB_VIP}:80"]).stdout
    assert "served by pi3" not in lab.ask_web(6)
    assert _web_active(lab, PI3) >= 5, "the downloads on pi3 outlast the drain"

    lab.hurry(downloads)
    results = lab.finish(downloads)
    exact = [r for r in results if r["ok"] and r["sha256"] in _blob_hashes(lab)]
    report("keepalived drain", complete_and_byte_exact=f"{len(exact)}/{len(results)}",
           errors=sorted({r["error"] for r in results if r["error"]}))
    assert len(exact) == len(results)

    # Idle now: the next apply lets keepalived delete it, on both balancers.
    forced = ()
    try:
        lab.wait_for(lambda: _web_active(lab, PI3) == _web_active(lab, PI3, "lb2") == 0,
                     what="pi3 idle on both balancers")
    except LabError as exc:
        pi3 = f"{int(IPv4Address(PI3)):08X}"
        entries = {node: [" ".join(f) for f in lab.connection_entries(node) if f[5] == pi3]
                   for node in ("lb1", "lb2")}
        held = lab.sh("client", ["ss", "-Htn", "state", "established", "dst",
                                 f"{WEB_VIP}:80"]).stdout.strip()
        left = [e for e in entries["lb1"] if " ESTABLISHED " in e]
        if held or not left:
            raise LabError(f"{exc}: active on lb1 {_web_active(lab, PI3)}, on lb2 "
                           f"{_web_active(lab, PI3, 'lb2')}; entries for pi3: {entries}; the "
                           f"client's connections to the VIP: {held!r}") from None
        # Every download ended and the client holds no connection, yet lb1
        # lists one as established: an entry whose close lb1 never saw,
        # counted for IPVS's 15 minutes.  What an operator does then: --force.
        report("keepalived drain: an entry left behind", entries=left)
        forced = ("--force",)
    _apply(lab, without_pi3, ("lb2", "lb1"), *forced)
    lab.wait_for(lambda: PI3 not in ipvs_web_dests(lab, "lb1") | ipvs_web_dests(lab, "lb2"),
                 timeout=15, what="pi3 to leave both tables")
    assert lab.lbctl("lb1", "plan", str(without_pi3), "--detailed-exitcode").returncode == 0


def test_a_drained_worker_gets_no_client_its_persistence_template_pointed_at_it(lab, base):
    sticky = edited(services=lambda s: {**s, "web": {**s["web"], "persistence": 300}})
    path = lab.write("sticky", sticky)
    _apply(lab, path, ("lb1",))
    (first,) = lab.ask_web(1)
    assert first.startswith("served by "), first
    chosen = first.removeprefix("served by ")
    # The client keeps a connection to its worker open while that worker is taken out.
    holder = lab.hold_connections(WEB_VIP, 80, count=1, seconds=120)
    try:
        address = lab.cluster.workers[chosen].address
        lab.wait_for(lambda: _web_active(lab, str(address)) > 0, what="the held connection")
        path = lab.write("sticky-without", {**sticky, "services": {**sticky["services"], "web": {
            **sticky["services"]["web"],
            "workers": [w for w in ("pi1", "pi2", "pi3") if w != chosen]}}})
        _apply(lab, path, ("lb1",))
        assert lab.lbctl("lb1", "plan", str(path), "--detailed-exitcode").returncode == 2
        # Its template still names the drained worker; new connections go elsewhere.
        answers = lab.ask_web(4)
        assert f"served by {chosen}" not in answers and "failed" not in answers, answers
    finally:
        holder.kill()
        holder.wait()
        lab.reset()  # the drained worker back at its weight before keepalived adopts the table


# One UDP "flow" as IPVS sees it: the same client address and port each time.
ASK_FROM_ONE_PORT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", int(sys.argv[3])))
s.settimeout(2)
s.sendto(b"who", (sys.argv[1], int(sys.argv[2])))
try:
    print(s.recv(2048).decode().strip())
except OSError:
    print("timeout")
"""


def test_a_udp_worker_taken_out_keeps_its_running_flows(lab, base):
    def ask(port):
        return lab.sh("client", [sys.executable, "-c", ASK_FROM_ONE_PORT, DNS_VIP, "53",
                                 str(port)]).stdout.strip()

    # A flow per client port; rr spreads them over pi1 and pi2.
    flows = {port: ask(port) for port in (40001, 40002)}
    assert set(flows.values()) == {"served by pi1", "served by pi2"}, flows
    port_on_pi2 = next(p for p, who in flows.items() if who == "served by pi2")
    pi2 = str(lab.cluster.workers["pi2"].address)
    # IPVS counts a UDP flow as inactive, never as active.
    active, inactive = _connections(lab, "lb1", DNS_VIP, 53, "udp", f"{pi2}:53")
    assert active == 0 and inactive >= 1

    path = lab.write("dns-without-pi2", edited(
        services=lambda s: {**s, "dns": {**s["dns"], "workers": ["pi1"]}}))
    result = lab.lbctl("lb1", "apply", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "draining" in result.stdout
    assert f"-a -u {DNS_VIP}:53 -r {pi2}:53 -g -w 0" in lab.ipvs_rules()
    try:
        # The running flow stays with its worker; a new one goes to pi1 only.
        assert ask(port_on_pi2) == "served by pi2"
        assert ask(40003) == "served by pi1"
        assert lab.lbctl("lb1", "plan", str(path), "--detailed-exitcode").returncode == 2
    finally:
        lab.reset()  # the drained worker back at its weight before keepalived adopts the table
