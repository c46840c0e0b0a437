"""lbctl doctor against a working lab cluster: each direct-routing fault is
put in by hand, one at a time, and doctor must name it, point at the node at
fault, and give a fix that, once carried out, leaves doctor with nothing to say.
"""

import json
import re
import subprocess

import pytest

from clusters import BASE, WEB_VIP, edited
from lbctl.lab.shell import run

DNS_VIP = BASE["services"]["dns"]["vip"]


def doctor(lab, node, path, *extra, prefix=()):
    """(exit status, report) of `lbctl doctor --json` run on a node; with
    `prefix`, under that command (a new lbctl process, not the lab's warm one)."""
    args = ("doctor", str(path), "--json", *extra)
    done = (lab.sh(node, [*prefix, *lab.lbctl_argv(*args, node=node)], check=False) if prefix
            else lab.lbctl(node, *args))
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


def found(report):
    """(node, check) of each finding; a check may find the same on several VIPs."""
    return sorted({(f["node"], f["check"]) for f in report["findings"]})


def fix_command(finding, pattern):
    """The command the finding's fix gives, as the user would type it."""
    match = re.search(pattern, finding["fix"])
    assert match, finding["fix"]
    return match[1].split()


def only(report, node, check):
    return next(f for f in report["findings"] if (f["node"], f["check"]) == (node, check))


def bind_web_server(lab, worker, address):
    """Restart a worker's web server listening on `address` only."""
    node = lab.nodes[worker]
    old = lab.web_server(worker)
    old.terminate()
    old.wait()
    node.processes[0] = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, "busybox", "httpd", "-f", "-p", f"{address}:80",
         "-h", f"{lab.workdir}/{worker}-www"], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    lab.wait_for(lambda: lab.sh(worker, ["ss", "-Hltn", "sport = :80"]).stdout.strip(),
                 timeout=30, what=f"{worker}'s web server on {address}")


@pytest.fixture(autouse=True)
def faults_undone(lab):
    """Whatever a failed test left of its faults goes: the lab serves the modules after."""
    yield
    lab.sh("pi3", ["ip", "link", "set", "dev", "eth0", "mtu", "1500"])
    run(["ip", "-n", lab.lan, "link", "set", f"p{list(lab.nodes).index('pi2')}", "master", "br0"])
    run(["ip", "-n", lab.lan, "link", "del", "br1"], check=False)
    lab.sh("pi1", ["ip", "link", "del", "up0"], check=False)
    lab.sh("pi1", ["sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0"])
    if "0.0.0.0:80" not in lab.sh("pi3", ["ss", "-Hltn", "sport = :80"]).stdout:
        lab.web_server("pi3").terminate()
        lab.web_server("pi3").wait()
        lab.ensure_web_server("pi3")


def test_doctor_finds_each_fault_by_name_and_its_fix_clears_it(lab, base):
    # A working cluster: nothing to report, from the balancer or from a worker.
    assert doctor(lab, "lb1", base) == (0, {"cluster": "lab", "run_on": "balancer lb1",
                                            "findings": [], "not_run": []})
    status, report = doctor(lab, "pi1", base)
    assert (status, found(report), report["not_run"]) == (0, [], [])
    # From the client, a host that is no node: its connection through the VIP
    # is answered from a worker's MAC, as direct routing answers.
    status, report = doctor(lab, "client", base)
    assert (status, found(report), report["run_on"]) == (
        0, [], "a host that is no node of the file (eth0)"), report

    # 1. ARP flux: pi2 answers ARP for the VIPs it holds on lo.
    for scope in ("all", "eth0"):
        lab.sh("pi2", ["sysctl", "-q", "-w", f"net.ipv4.conf.{scope}.arp_ignore=0"])
    status, report = doctor(lab, "lb1", base)
    assert (status, found(report)) == (1, [("pi2", "arp-flux")])
    lab.sh("pi2", fix_command(only(report, "pi2", "arp-flux"), r"sudo (sysctl -w [^;]+);"))

    # 2. The VIP gone from pi1's lo: the balancer sees its SYN dropped, and
    # doctor on pi1 names the address and the command that puts it back.
    lab.sh("pi1", ["ip", "address", "del", f"{WEB_VIP}/32", "dev", "lo"])
    status, report = doctor(lab, "lb1", base)
    assert (status, found(report)) == (1, [("pi1", "direct-route-dropped")])
    status, report = doctor(lab, "pi1", base)
    assert (status, found(report)) == (1, [("pi1", "vip-not-on-lo")])
    lab.sh("pi1", fix_command(only(report, "pi1", "vip-not-on-lo"), r"sudo ([^;]+);"))

    # 4. pi3's web server bound to its own address: a direct-routed SYN is reset.
    bind_web_server(lab, "pi3", lab.nodes["pi3"].address)
    status, report = doctor(lab, "lb1", base)
    assert (status, found(report)) == (1, [("pi3", "not-listening-on-vip")])
    status, report = doctor(lab, "pi3", base)
    assert found(report) == [("pi3", "not-listening-on-vip")]
    assert f"{lab.nodes['pi3'].address}:80" in report["findings"][0]["evidence"]
    lab.web_server("pi3").terminate()  # the fix: listen on every address again
    lab.web_server("pi3").wait()
    lab.ensure_web_server("pi3")

    # 3. Strict rp_filter on pi1, whose route back to the client leaves by a
    # second link (up0, straight to the client): pi1 drops the client's requests.
    client = lab.nodes["client"]
    run(["ip", "link", "add", "up0", "netns", lab.nodes["pi1"].netns, "type", "veth", "peer",
         "name", "up0", "netns", client.netns])
    try:
        for node, address in (("client", "10.99.0.1/30"), ("pi1", "10.99.0.2/30")):
            lab.sh(node, ["ip", "address", "add", address, "dev", "up0"])
            lab.sh(node, ["ip", "link", "set", "up0", "up"])
        for scope in ("all", "up0"):  # the client takes replies from the VIP on up0
            lab.sh("client", ["sysctl", "-q", "-w", f"net.ipv4.conf.{scope}.rp_filter=0"])
        lab.sh("pi1", ["ip", "route", "add", f"{client.address}/32", "via", "10.99.0.1"])
        lab.sh("pi1", ["sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=1"])
        assert "failed" in lab.ask(f"http://{WEB_VIP}/", 4, timeout=2)  # pi1 has one turn in four
        status, report = doctor(lab, "pi1", base)
        assert (status, found(report)) == (1, [("pi1", "rp-filter")])
        lab.sh("pi1", fix_command(only(report, "pi1", "rp-filter"), r"sudo (sysctl -w .*) \(loose"))
        # Loose filtering takes the requests; the replies go back by up0.
        assert lab.ask_web(4).count("failed") == 0
    finally:
        lab.sh("pi1", ["ip", "link", "del", "up0"], check=False)

    # 5. pi2 moved to another bridge: the balancer's frames no longer reach it.
    port = f"p{list(lab.nodes).index('pi2')}"
    run(["ip", "-n", lab.lan, "link", "add", "br1", "type", "bridge"])
    try:
        run(["ip", "-n", lab.lan, "link", "set", "br1", "up"])
        run(["ip", "-n", lab.lan, "link", "set", port, "master", "br1"])
        status, report = doctor(lab, "lb1", base)
        assert (status, found(report)) == (1, [("pi2", "no-arp-answer")])
        run(["ip", "-n", lab.lan, "link", "set", port, "master", "br0"])  # the fix: back on the LAN
    finally:
        run(["ip", "-n", lab.lan, "link", "del", "br1"], check=False)

    # 6. pi3's MTU below the balancer's: full-size frames to it are lost.
    lab.sh("pi3", ["ip", "link", "set", "dev", "eth0", "mtu", "1400"])
    status, report = doctor(lab, "lb1", base)
    assert (status, found(report)) == (1, [("pi3", "mtu-mismatch")])
    # From the balancer doctor cannot know pi3's interface name: the fix names IFACE.
    assert "sudo ip link set dev IFACE mtu 1500" in only(report, "pi3", "mtu-mismatch")["fix"]
    lab.sh("pi3", ["ip", "link", "set", "dev", "eth0", "mtu", "1500"])

    # 7. A scheduler this kernel has no module for (twos came in Linux 6.7).
    twos = lab.write("twos", edited(services=lambda s: {
        **s, "web": {**s["web"], "scheduler": "twos"}}))
    status, report = doctor(lab, "lb1", twos)
    assert (status, found(report)) == (1, [("lb1", "scheduler-missing")])
    assert "ip_vs_twos" in report["findings"][0]["problem"]

    # Every fix carried out: nothing left to report, from either side.
    assert doctor(lab, "lb1", base)[0] == 0
    assert doctor(lab, "pi1", base)[0] == 0
    assert lab.ask_web(6).count("failed") == 0


def test_doctor_without_raw_sockets_says_what_it_could_not_check(lab, base):
    # Root without CAP_NET_RAW, as an unprivileged user is: the local checks run.
    no_raw = ["setpriv", "--inh-caps=-net_raw", "--bounding-set=-net_raw", "--"]
    status, report = doctor(lab, "pi1", base, prefix=no_raw)
    assert status == 0 and report["findings"] == []
    (not_run,) = report["not_run"]
    assert not_run["check"] == "wire" and "CAP_NET_RAW" in not_run["why"]
