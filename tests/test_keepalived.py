"""The keepalived engine: which files select it, what apply does with it, and its scripts."""

import errno
import os
import stat
import subprocess
from ipaddress import IPv4Address
from types import SimpleNamespace

import pytest

from fakes import FakeAddresses, FakeFiles, FakeIpvs, FakeDaemon, FakeSysctls
from helpers import PI_SINGLE, cluster_from, install_hook, keepalived_findings, keepalived_test
from lbctl.adapters.keepalived import KeepalivedDaemon
from lbctl.adapters.protocols import Adapters, IpvsDest, IpvsService
from lbctl.adapters.systemd import Systemd
from lbctl.config.model import DestKey, ServiceKey
from lbctl.engine.desired import BootApply, desired_state, leaving_real_servers
from lbctl.errors import ApplyError, ConfigError
from lbctl.engine.execute import execute
from lbctl.status.health import Reported, ipvs_drift
from lbctl.engine.observe import observe
from lbctl.records.ownership import read_ownership
from lbctl.engine.plan import format_plan, make_plan
from lbctl.render.systemd import exec_start_lines
from lbctl.render.keepalived import (
    SCRIPT_USER, render_keepalived_conf, script_text,
)
from lbctl.layout import Layout

NO_SYSTEMD = Systemd(runs=False)  # as in the lab and in containers

PAIR = PI_SINGLE.replace(
    "  lb1: {address: 192.168.100.2, interface: eth0}\n",
    "  lb1: {address: 192.168.100.2, interface: eth0}\n"
    "  lb2: {address: 192.168.100.5, interface: eth0}\n")
HEALTHY = PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, health: {http: {path: /}}}")
WEB = ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)
CONF = "/etc/lbctl/pi-web/keepalived.conf"


def test_a_second_balancer_or_a_health_check_selects_keepalived():
    assert cluster_from(PI_SINGLE).engine == "netlink"
    assert cluster_from(PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, health: none}")
                        ).engine == "netlink"
    pair = cluster_from(PAIR)
    assert pair.engine == "keepalived"
    # Without priorities in the file the first balancer listed is master.
    assert [b.priority for b in pair.balancers.values()] == [150, 100]
    assert cluster_from(HEALTHY).engine == "keepalived"
    assert cluster_from(HEALTHY).vrrp.router_id == cluster_from(PAIR).vrrp.router_id


def test_health_defaults_survive_one_slow_reply():
    check = cluster_from(HEALTHY).services["web"].health
    assert (check.kind, check.interval, check.timeout, check.retries, check.rise) == \
        ("http", 2.0, 1.0, 2, 2)


def render(text, node="lb1", root="/"):
    cluster = cluster_from(text)
    return render_keepalived_conf(cluster, node, "eth0", Layout(cluster.name, root))


def test_a_returning_master_waits_for_its_checks_within_keepalived_limit(tmp_path):
    checked = PAIR.replace("scheduler: wrr}", "scheduler: wrr, health: {http: {path: /}}}")
    # Two passes 2 s apart, the first a second after start, each with up to
    # a 1 s timeout: within 2 x 2 + 1 + 1 s.
    conf = render(checked + "vrrp: {preempt: true}\n")
    assert "preempt_delay 6\n" in conf and "warmup 0\n" in conf  # no random first delay
    hourly = checked.replace("{http: {path: /}}", "{http: {path: /}, interval: 3600s}")
    conf, findings = keepalived_findings(tmp_path, hourly + "vrrp: {preempt: true}\n")
    assert "preempt_delay 1000\n" in conf and findings == []
    # keepalived 2.2.7 reports nothing of vrrp_instance once a script user
    # other than root is set (its config test ends early), so this is asked
    # with root's: the limit lbctl keeps to is keepalived's own.
    longer = keepalived_test(tmp_path, conf.replace("preempt_delay 1000", "preempt_delay 1001")
                             .replace("script_user nobody", "script_user root"))
    assert any("Preempt_delay not valid" in line for line in longer), longer


def test_the_pair_renders_unicast_vrrp_sync_and_each_others_peer():
    lb1, lb2 = render(PAIR, "lb1"), render(PAIR, "lb2")
    assert "unicast_src_ip 192.168.100.2" in lb1 and "        192.168.100.5\n" in lb1
    assert "unicast_src_ip 192.168.100.5" in lb2 and "        192.168.100.2\n" in lb2
    assert "priority 150" in lb1 and "priority 100" in lb2
    assert "lvs_sync_daemon eth0 id" in lb1
    # By default a returning balancer stays backup, as LVS operators run pairs.
    assert "nopreempt" in lb1 and "preempt_delay" not in lb1
    preempting = render(PAIR + "vrrp: {preempt: true}\n")
    assert "nopreempt" not in preempting and "preempt_delay" in preempting
    multicast = render(PAIR + "vrrp: {unicast: false}\n")
    assert "unicast_peer" not in multicast
    # A single balancer with checks has no peer: no VRRP at all, no sync daemon;
    # it holds the VIPs itself.
    single = render(HEALTHY)
    assert "vrrp_instance" not in single and "lvs_sync_daemon" not in single
    cluster = cluster_from(HEALTHY)
    state = desired_state(cluster, "lb1", "eth0", layout=Layout(cluster.name))
    assert {str(a) for a in state.addresses} == {"192.168.100.10/32 dev eth0",
                                                 "192.168.100.11/32 dev eth0"}
    assert not any(isinstance(e, type(next(iter(state.addresses)))) for e in state.external)


def test_rise_is_that_many_copies_of_the_url_and_retries_count_failures():
    conf = render(HEALTHY.replace("{http: {path: /}}", "{http: {path: /ok}, rise: 3, retries: 2}"))
    server = conf.split("real_server 192.168.100.3 80 {")[1].split("real_server")[0]
    assert server.count("path /ok") == 3
    assert "retry 1\n" in server and "alpha" in conf


def test_exec_checks_pass_each_word_as_it_is_under_the_node_root():
    text = HEALTHY.replace("{http: {path: /}}",
                           "{exec: {command: [/usr/local/bin/probe, --port, '80']}}")
    conf = render(text, root="/srv/lab/lb1")
    assert ('misc_path "/srv/lab/lb1/etc/lbctl/pi-web/lbctl-check '
            '/srv/lab/lb1/run/lbctl/pi-web/state/check.web@pi1 2 2 1.0 exec 192.168.100.3 80 '
            '-- /usr/local/bin/probe --port 80"') in conf


class Balancer:
    def __init__(self, keepalived=None):
        self.keepalived = keepalived or FakeDaemon()
        self.adapters = Adapters(
            ipvs=FakeIpvs(), addresses=FakeAddresses({(IPv4Address("192.168.100.2"), 24, "eth0")}),
            sysctls=FakeSysctls(), files=FakeFiles(), daemons={"keepalived": self.keepalived})

    def context(self, text):
        """What apply works from: the desired and observed states, and the plan."""
        cluster = cluster_from(text)
        leaving = leaving_real_servers(cluster, self.adapters.ipvs.dump())
        desired = desired_state(cluster, "lb1", "eth0", layout=Layout(cluster.name),
                                leaving=leaving)
        owned = read_ownership(self.adapters.files, self.adapters.ownership_dir, cluster.name)
        observed = observe(desired, owned, self.adapters, self.adapters.addresses.list())
        return SimpleNamespace(desired=desired, observed=observed, cluster=cluster,
                               adapters=self.adapters, plan=make_plan(desired, observed, owned))

    def plan(self, text):
        return self.context(text).plan

    def apply(self, text):
        return execute(self.plan(text), self.adapters)


def test_apply_tests_writes_and_starts_then_a_reapply_changes_nothing():
    node = Balancer()
    node.apply(PAIR)
    assert node.keepalived.calls == ["prepare", "test", "start"]
    assert "virtual_server 192.168.100.10 80" in node.adapters.files.read(CONF)[0]
    assert node.adapters.files.read("/etc/lbctl/pi-web/lbctl-check")[1] == 0o755
    again = node.plan(PAIR)
    assert again.empty, format_plan(again)


def test_an_edit_reloads_keepalived_once_its_test_passes():
    node = Balancer()
    node.apply(PAIR)
    node.keepalived.calls.clear()
    plan = node.plan(PAIR.replace("weight: 2", "weight: 3"))
    assert [(c.kind, c.key) for c in plan.changes] == [("file", CONF), ("keepalived", "reload")]
    execute(plan, node.adapters)
    assert node.keepalived.calls == ["prepare", "test", "reload"]


def test_a_config_keepalived_rejects_changes_nothing():
    node = Balancer()
    node.apply(PAIR)
    before = dict(node.adapters.files.files)
    node.keepalived.rejects = ["(keepalived.conf: Line 40) Invalid lvs_scheduler 'x'"]
    with pytest.raises(ApplyError, match="Invalid lvs_scheduler"):
        node.apply(PAIR.replace("weight: 2", "weight: 3"))
    assert node.adapters.files.files == before
    assert "reload" not in node.keepalived.calls


def without_keepalived(root):
    """This cluster's keepalived on a node where the package is not installed."""
    return KeepalivedDaemon(Layout("pi-web", str(root)), systemd=NO_SYSTEMD,
                             binary=str(root / "usr/sbin/keepalived"))


NOT_INSTALLED = ("apply: run keepalived: it is not installed ({}/usr/sbin/keepalived not "
                 "found), and this cluster's balancers need it: install it with `apt install "
                 "keepalived`; nothing on this node was changed")


def test_keepalived_not_installed_is_named_before_it_is_run(tmp_path):
    keepalived = without_keepalived(tmp_path)
    for step in (keepalived.prepare, lambda: keepalived.test("global_defs {}\n"),
                 keepalived.start):
        with pytest.raises(ApplyError) as err:
            step()
        assert str(err.value) == NOT_INSTALLED.format(tmp_path)
        assert err.value.exit_code == 1
    assert list(tmp_path.iterdir()) == []  # no run folder, no state folder


def test_apply_without_keepalived_installed_changes_nothing(tmp_path):
    node = Balancer(without_keepalived(tmp_path))
    addresses = node.adapters.addresses.list()
    with pytest.raises(ApplyError) as err:
        node.apply(PAIR)
    assert str(err.value) == NOT_INSTALLED.format(tmp_path)
    assert node.adapters.files.files == {} and node.adapters.files.links == {}
    assert node.adapters.ipvs.dump() == [] and node.adapters.addresses.list() == addresses
    assert list(tmp_path.iterdir()) == []


def test_a_start_without_keepalived_installed_changes_nothing_either(tmp_path):
    node = Balancer()
    node.apply(PAIR)
    # keepalived was removed since: the next apply must start it, and restore its check script.
    node.adapters.daemons["keepalived"] = without_keepalived(tmp_path)
    del node.adapters.files.files["/etc/lbctl/pi-web/lbctl-check"]
    before = dict(node.adapters.files.files)
    plan = node.plan(PAIR)
    assert {(c.kind, c.key) for c in plan.changes} == {
        ("file", "/etc/lbctl/pi-web/lbctl-check"), ("keepalived", "start")}
    with pytest.raises(ApplyError, match="apt install keepalived"):
        execute(plan, node.adapters)
    assert node.adapters.files.files == before


def test_moving_to_keepalived_hands_over_vips_and_services_without_removing_them():
    node = Balancer()
    node.apply(PI_SINGLE)  # the netlink engine created the VIPs and services
    plan = node.plan(PAIR)
    assert not [c for c in plan.changes if c.action == "remove"], format_plan(plan)
    execute(plan, node.adapters)
    assert (IPv4Address("192.168.100.10"), 32, "eth0") in node.adapters.addresses.list()
    assert WEB in {s.key for s in node.adapters.ipvs.dump()}
    # lbctl no longer records them as its own: they are keepalived's now.
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, "pi-web")
    assert not owned.services and not owned.addresses


def test_keepalived_starts_over_the_table_it_finds_made_to_match_its_config():
    # keepalived adds each service and real server and takes "already exists"
    # as done: what the netlink engine left must be edited first, or the web
    # service keeps scheduler wrr and a checked worker its weight even while
    # its checks fail.
    node = Balancer()
    node.apply(PI_SINGLE.replace("weight: 2", "weight: 5"))
    node.adapters.ipvs.dests[DestKey(WEB, IPv4Address("192.168.100.9"), 80)] = [1, 3, 0]
    text = HEALTHY.replace("scheduler: wrr,", "scheduler: sh, scheduler_flags: [sh-port],")
    plan = node.plan(text)
    shown = format_plan(plan).splitlines()
    start = shown.index("  + keepalived start")
    assert shown[:start][-4:] == [
        f"  ~ service {WEB} scheduler wrr -> scheduler sh flags sh-port",
        f"  ~ real server {WEB} -> 192.168.100.3:80 weight 1 -> 0 "
        "(keepalived brings it in once its checks pass)",
        f"  ~ real server {WEB} -> 192.168.100.4:80 weight 1 -> 0 "
        "(keepalived brings it in once its checks pass)",
        f"  ~ real server {WEB} -> 192.168.100.6:80 weight 5 -> 0 "
        "(keepalived brings it in once its checks pass)"]
    # A real server the file does not list is not in keepalived's config:
    # lbctl takes it out, as it would under its own engine.
    assert f"  - real server {WEB} -> 192.168.100.9:80 (idle: weight 0, then delete)" in shown

    at_start = {}
    node.keepalived.start = lambda: at_start.update(table=node.adapters.ipvs.dump())
    execute(plan, node.adapters)
    (web,) = [s for s in at_start["table"] if s.key == WEB]
    assert (web.scheduler, web.flags) == ("sh", ("sh-port",))
    assert {(str(d.address), d.weight) for d in web.dests} == {
        ("192.168.100.3", 0), ("192.168.100.4", 0), ("192.168.100.6", 0), ("192.168.100.9", 1)}
    # The dns service has no checks: keepalived keeps its real servers in at
    # their weights, as the kernel already has them.
    dns = ServiceKey("udp", IPv4Address("192.168.100.11"), 53)
    (dns_service,) = [s for s in at_start["table"] if s.key == dns]
    assert {d.weight for d in dns_service.dests} == {1}
    assert WEB in {s.key for s in node.adapters.ipvs.dump()}
    assert (DestKey(WEB, IPv4Address("192.168.100.9"), 80)
            not in node.adapters.ipvs.dests)


def test_before_keepalived_starts_the_kernel_gets_back_the_timeouts_lbctl_found():
    # keepalived saves the timeouts it finds when it first sets its own and
    # puts them back when it stops: they must be the kernel's, not lbctl's.
    node = Balancer()
    node.adapters.ipvs.kernel_timeouts["tcp"] = 700  # this host's own, before lbctl
    node.apply("ipvs: {timeouts: {tcp: 600}}\n" + PI_SINGLE)
    assert node.adapters.ipvs.timeouts()["tcp"] == 600
    plan = node.plan("ipvs: {timeouts: {tcp: 500}}\n" + HEALTHY)
    shown = [str(c) for c in plan.changes]
    assert shown.index("~ ipvs timeout tcp = 700s, as before lbctl set it (now 600s)") \
        < shown.index("+ keepalived start")
    execute(plan, node.adapters)
    assert node.adapters.ipvs.timeouts()["tcp"] == 700  # keepalived's lvs_timeouts sets 500
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, "pi-web")
    assert owned.timeouts == {}


def units_of(text, node="lb1"):
    cluster = cluster_from(text)
    state = desired_state(cluster, node, "eth0", layout=Layout(cluster.name),
                          boot=BootApply(text, "/usr/bin/python3"))
    return {path: spec.content for path, spec in state.files.items()
            if path.endswith(".service")}


def test_a_single_balancers_unit_puts_its_vips_back_at_boot_and_a_pairs_does_not():
    (single,) = units_of(HEALTHY).values()
    pre = exec_start_lines(single, "ExecStartPre")
    # Without them a rebooted single balancer has checks and a table but
    # nobody answering ARP for the VIPs until someone runs apply.
    assert pre[-2:] == [
        ["/usr/sbin/ip", "-4", "address", "replace", "192.168.100.10/32", "dev", "eth0"],
        ["/usr/sbin/ip", "-4", "address", "replace", "192.168.100.11/32", "dev", "eth0"]]
    # And tells the LAN, which may cache another MAC for them (a board swap).
    assert exec_start_lines(single, "ExecStartPost") == [
        ["-/usr/bin/timeout", "-k", "5", "20", "/usr/bin/python3", "-I", "-m", "lbctl.adapters.garp",
         "eth0", "192.168.100.10", "192.168.100.11"]]
    (pair,) = units_of(PAIR).values()
    assert not [argv for argv in exec_start_lines(pair, "ExecStartPre") if "address" in argv]
    assert exec_start_lines(pair, "ExecStartPost") == []  # keepalived's VRRP announces them


def test_boot_units_keep_retrying_a_start_that_fails_and_systemd_accepts_them(tmp_path):
    units = {**units_of(HEALTHY), **units_of(PI_SINGLE)}
    assert len(units) == 2
    for path, text in units.items():
        # A late network card, or a switch that boots after the Pi: the start
        # fails until the interface has its address; systemd tries again.
        assert "Restart=on-failure\nRestartSec=5\n" in text
        assert "StartLimitIntervalSec=0\n" in text
        unit = tmp_path / os.path.basename(path)
        unit.write_text(text)
        found = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                               capture_output=True, text=True)
        assert found.returncode == 0 and found.stderr == "", found.stderr


def test_leaving_keepalived_stops_it_first_and_plans_again():
    node = Balancer(FakeDaemon(is_running=True))
    node.apply(PAIR)
    plan = node.plan(PI_SINGLE)
    assert (plan.changes[0].kind, plan.changes[0].key) == ("keepalived", "stop")
    report = execute(plan, node.adapters)
    assert report.replan and node.keepalived.calls[-1] == "stop"
    rest = node.plan(PI_SINGLE)
    assert {c.kind for c in rest.changes} >= {"service", "real server", "address"}
    assert ("remove", "file", CONF) in {(c.action, c.kind, c.key) for c in rest.changes}


def service(dests, scheduler="wrr"):
    return IpvsService(WEB, "tcp 192.168.100.10:80", scheduler, 0,
                       tuple(IpvsDest(IPv4Address(a), 80, w, 3) for a, w in dests))


def test_drift_is_named_and_health_decides_who_belongs():
    cluster = cluster_from(HEALTHY)
    up = {f"health.web@{w}": Reported("up", 1.0) for w in ("pi1", "pi2", "pi3")}
    dns_svc = IpvsService(ServiceKey("udp", IPv4Address("192.168.100.11"), 53), "udp", "rr", 0,
                          tuple(IpvsDest(IPv4Address(a), 53, 1, 3)
                                for a in ("192.168.100.3", "192.168.100.4")))
    table = [service([("192.168.100.3", 1), ("192.168.100.4", 1), ("192.168.100.6", 2)]), dns_svc]
    assert ipvs_drift(cluster, up, table) == ([], [])
    down = dict(up, **{"health.web@pi2": Reported("down", 2.0)})
    problems, _ = ipvs_drift(cluster, down, table)
    assert problems == ["service web: worker pi2 (192.168.100.4:80) is down but still takes "
                        "traffic in IPVS (weight 1)"]
    wrong = [service([("192.168.100.3", 5), ("192.168.100.6", 2), ("192.168.100.9", 1)]), dns_svc]
    problems, unchecked = ipvs_drift(cluster, {"health.web@pi1": Reported("up", 1.0),
                                               "health.web@pi3": Reported("up", 1.0)}, wrong)
    assert problems == ["service web: worker pi1 (192.168.100.3:80) has weight 5, the file says 1",
                        "service web: 192.168.100.9:80 is in IPVS but not in the file"]
    assert unchecked == ["web/pi2"]


def test_drift_names_service_flags_the_kernel_lacks():
    cluster = cluster_from(PI_SINGLE.replace(
        "scheduler: wrr}", "scheduler: sh, scheduler_flags: [sh-port, sh-fallback]}"))
    table = [IpvsService(WEB, str(WEB), "sh", 0, tuple(
        IpvsDest(IPv4Address(a), 80, w, 3) for a, w in
        (("192.168.100.3", 1), ("192.168.100.4", 1), ("192.168.100.6", 2))), flags=("sh-port",))]
    problems, _ = ipvs_drift(cluster, {}, table)
    assert "service web: flags are sh-port, the file says sh-fallback,sh-port" in problems


FLAGS_AND_TIMEOUTS = "ipvs: {timeouts: {tcp: 600, tcp_fin: 60, udp: 20}}\n" + HEALTHY.replace(
    "protocol: udp, scheduler: rr,",
    "protocol: udp, scheduler: mh, scheduler_flags: [mh-port, mh-fallback], one_packet: true,"
).replace("scheduler: wrr,", "scheduler: sh, scheduler_flags: [sh-fallback],")


def test_keepalived_knows_the_rendered_flag_and_timeout_keywords(tmp_path):
    conf, findings = keepalived_findings(tmp_path, FLAGS_AND_TIMEOUTS)
    assert "    lvs_timeouts tcp 600 tcpfin 60 udp 20\n" in conf
    # keepalived reads sh-/mh- flags only after lvs_sched names that scheduler.
    assert "lvs_sched sh\n    sh-fallback\n" in conf
    assert "lvs_sched mh\n    mh-fallback\n    mh-port\n    ops\n" in conf
    assert findings == []
    _, findings = keepalived_findings(tmp_path, FLAGS_AND_TIMEOUTS.replace("tcp_fin: 60, ", ""))
    assert findings == []
    # The same check sees a keyword keepalived does not know.
    bad = conf.replace("    ops\n", "    one-packet\n")
    assert any("Unknown keyword 'one-packet'" in line for line in keepalived_test(tmp_path, bad))


def test_keepalived_reads_every_line_of_the_scripted_checks(tmp_path):
    # The default profile: tcp with rise 2 and exec run through MISC_CHECK.
    text = PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, health: {tcp: {}}}").replace(
        "scheduler: rr,", "scheduler: rr, health: {exec: {command: [/bin/true, '53']}},")
    conf, findings = keepalived_findings(tmp_path, text)
    assert conf.count("MISC_CHECK {") == 5 and findings == []
    found = keepalived_test(tmp_path, conf.replace("misc_timeout", "misc_timeoutx", 1))
    assert len(found) == 1 and "Unknown keyword 'misc_timeoutx'" in found[0]


def run_check(tmp_path, *probe, rise=2, retries=2):
    script = tmp_path / "lbctl-check"
    if not script.exists():
        script.write_text(script_text("lbctl-check"))
        script.chmod(0o755)
    state = tmp_path / "check.web@pi1"
    argv = [str(script), str(state), str(rise), str(retries), "1", "exec", "192.0.2.1", "80",
            "--", *probe]
    return subprocess.run(argv, check=False).returncode, state.read_text().split()


def test_the_check_script_damps_flapping_with_rise_and_retries(tmp_path):
    ok, fail = "/bin/true", "/bin/false"
    assert run_check(tmp_path, ok) == (1, ["down", "1"])  # one pass is not enough
    assert run_check(tmp_path, ok) == (0, ["up", "0"])  # the second brings it up
    assert run_check(tmp_path, fail) == (0, ["up", "1"])  # one failure: still up
    assert run_check(tmp_path, ok) == (0, ["up", "0"])
    assert run_check(tmp_path, fail)[0] == 0
    assert run_check(tmp_path, fail) == (1, ["down", "0"])  # two in a row: down
    assert run_check(tmp_path, ok) == (1, ["down", "1"])
    assert run_check(tmp_path, fail) == (1, ["down", "0"])  # a flap starts the count again


def test_exec_checks_get_the_worker_address_and_no_shell(tmp_path):
    probe = tmp_path / "probe"
    probe.write_text("#!/bin/sh\n[ \"$LBCTL_ADDRESS:$LBCTL_PORT\" = 192.0.2.1:80 ] && "
                     "[ \"$1\" = 'a;b' ]\n")
    probe.chmod(0o755)
    assert run_check(tmp_path, str(probe), "a;b", rise=1)[0] == 0


def test_the_notify_hook_records_state_and_time(tmp_path):
    script = install_hook(tmp_path, "lbctl-notify")
    # keepalived's own umask must not hide the records from the exporter,
    # which runs as a user of its own.
    subprocess.run([str(script), str(tmp_path), "health", "web", "pi1", "down"], check=True,
                   umask=0o077)
    subprocess.run([str(script), str(tmp_path), "vrrp", "INSTANCE", "lbctl_pi-web", "MASTER",
                    "150"], check=True, umask=0o077)
    for name in ("health.web@pi1", "vrrp", "vrrp.transitions"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644, name
    from lbctl.status.health import read_state_dir

    found = read_state_dir(str(tmp_path))
    assert found["health.web@pi1"].state == "down" and found["vrrp"].state == "MASTER"
    assert sorted(os.listdir(tmp_path)) == [
        ".lock.health.web@pi1", ".lock.vrrp", "health.web@pi1", "lbctl-hook-order",
        "lbctl-notify", "vrrp",
        "vrrp.transitions"]
    # Role changes count into and out of MASTER, not the states keepalived
    # passes through as it stops and starts again as backup.
    for state in ("BACKUP", "STOP", "BACKUP", "MASTER"):
        subprocess.run([str(script), str(tmp_path), "vrrp", "INSTANCE", "lbctl_pi-web", state,
                        "150"], check=True)
    assert (tmp_path / "vrrp.transitions").read_text() == "3\n"
    assert read_state_dir(str(tmp_path))["vrrp"].state == "MASTER"


def test_a_hook_started_before_the_one_on_record_changes_nothing(tmp_path):
    # keepalived forks a hook per event without waiting: the MASTER hook of a
    # takeover a second before a BACKUP can run last.  The record keeps when
    # its hook was forked (clock ticks since boot, then PID).
    from lbctl.status.health import read_state_dir

    script = install_hook(tmp_path, "lbctl-notify")

    def hook(*event):
        subprocess.run([str(script), str(tmp_path), *event], check=True)

    hook("vrrp", "INSTANCE", "lbctl_pi-web", "BACKUP", "150")
    hook("health", "web", "pi1", "up")
    state, since, ticks, pid = (tmp_path / "vrrp").read_text().split()
    assert state == "BACKUP" and int(ticks) > 0 and int(pid) > 0
    # A hook forked a second later wrote these records.
    for name in ("vrrp", "health.web@pi1"):
        record = (tmp_path / name).read_text().split()
        (tmp_path / name).write_text(f"{record[0]} {record[1]} {int(ticks) + 100} 1\n")
    hook("vrrp", "INSTANCE", "lbctl_pi-web", "MASTER", "150")
    hook("health", "web", "pi1", "down")
    found = read_state_dir(str(tmp_path))
    assert (found["vrrp"].state, found["health.web@pi1"].state) == ("BACKUP", "up")
    assert (tmp_path / "vrrp.transitions").read_text() == "0\n"
    # A record without its hook's start (as lbctl 0.1 wrote) orders nothing.
    (tmp_path / "vrrp").write_text("BACKUP 1000.5\n")
    hook("vrrp", "INSTANCE", "lbctl_pi-web", "MASTER", "150")
    assert read_state_dir(str(tmp_path))["vrrp"].state == "MASTER"


def test_an_exporter_in_the_file_gets_a_unit_on_each_balancer_that_systemd_accepts(tmp_path):
    with_exporter = PAIR + "exporter: {listen: 'node:9588'}\n"
    for node, address in (("lb1", "192.168.100.2"), ("lb2", "192.168.100.5")):
        units = units_of(with_exporter, node)
        text = units["/etc/systemd/system/lbctl-pi-web-exporter.service"]
        # Each balancer binds its own address; the saved copies name things.
        assert exec_start_lines(text) == [[
            "/usr/bin/python3", "-I", "-m", "lbctl", "exporter", "--listen", f"{address}:9588"]]
        assert "DynamicUser=yes\nAmbientCapabilities=CAP_NET_ADMIN\n" in text
        # Scraped from this host and the LAN only; IPv4, netlink and unix sockets only.
        assert "IPAddressDeny=any\nIPAddressAllow=localhost 192.168.100.0/24\n" in text
        assert "RestrictAddressFamilies=AF_INET AF_NETLINK AF_UNIX\n" in text
        unit = tmp_path / "lbctl-pi-web-exporter.service"
        unit.write_text(text)
        found = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                               capture_output=True, text=True)
        assert found.returncode == 0 and found.stderr == "", found.stderr
    # On a worker there is nothing to export, and without the section no unit at all.
    assert not [p for p in units_of(PAIR) if "exporter" in p]
    cluster = cluster_from(with_exporter)
    worker = desired_state(cluster, "pi1", "eth0")
    assert not [p for p in worker.files if "exporter" in p]


def test_the_exporter_listens_on_this_host_only_unless_told_otherwise():
    assert cluster_from(PAIR + "exporter:\n").exporter == "127.0.0.1:9588"
    assert cluster_from(PAIR).exporter is None
    # One address for a pair cannot be bound by both balancers.
    with pytest.raises(ConfigError, match="each balancer of the pair binds its own: use node:PORT"):
        cluster_from(PAIR + "exporter: {listen: 192.168.100.2:9588}\n")


def test_a_keepalived_too_old_to_reweight_on_reload_is_refused_before_anything_changes(tmp_path):
    from lbctl.adapters.keepalived import KeepalivedDaemon

    binary = tmp_path / "keepalived"
    binary.write_text("#!/bin/sh\necho 'Keepalived v2.1.5 (07/13,2020)' >&2\n")
    binary.chmod(0o755)
    keepalived = KeepalivedDaemon(Layout("pi-web", str(tmp_path / "root")),
                                   systemd=NO_SYSTEMD, binary=str(binary))
    with pytest.raises(ApplyError, match=r"version 2\.1\.5 is too old: lbctl needs 2\.2\.2"):
        keepalived.prepare()
    assert not (tmp_path / "root").exists()
    binary.write_text("#!/bin/sh\necho 'Keepalived v2.2.7 (01/16,2022)' >&2\n")
    from lbctl.adapters.keepalived import _version

    assert _version(str(binary)) == (2, 2, 7)


def test_a_pair_drops_rather_than_resets_unsynced_packets_for_a_moment_after_a_takeover():
    from lbctl.render.keepalived import render_takeover_rules

    lb1 = render(PAIR, "lb1")
    from lbctl.render.keepalived import vrrp_anchor

    anchor = vrrp_anchor(cluster_from(PAIR))
    assert anchor == f"169.254.255.{cluster_from(PAIR).vrrp.router_id}"
    hook = f"/etc/lbctl/pi-web/lbctl-takeover /etc/lbctl/pi-web/takeover.nft lbctl-pi-web {anchor}"
    for state in ("master", "backup", "fault", "stop"):
        assert f'notify_{state} "{hook} {state}" root\n' in lb1
    assert "lbctl-takeover" not in render(HEALTHY)  # one balancer: no peer, no takeover

    cluster = cluster_from(PAIR)  # web on TCP, dns on UDP
    layout = Layout(cluster.name)
    rules = render_takeover_rules(cluster, layout)
    assert "table ip lbctl-pi-web {" in rules
    # After IPVS's input hook (priority 99): only packets IPVS did not take.
    assert "type filter hook input priority 150; policy accept;" in rules
    # Only TCP services: UDP is never reset, IPVS schedules any datagram.
    drop = [line for line in rules.splitlines() if line.startswith("add rule")]
    assert drop == ["add rule ip lbctl-pi-web takeover ip daddr . tcp dport "
                    "{ 192.168.100.10 . 80 } meta l4proto @armed counter drop"], rules
    state = desired_state(cluster, "lb1", "eth0", layout=layout)
    assert state.files[layout.takeover_rules].content == rules
    assert state.files[layout.takeover].mode == 0o755
    assert {layout.takeover, layout.takeover_rules} <= state.keepalived.files  # a change reloads
    single = cluster_from(HEALTHY)
    assert layout.takeover_rules not in desired_state(single, "lb1", "eth0", layout=layout).files


def test_a_pair_advertises_one_fixed_address_whatever_the_vips():
    # keepalived ignores adverts whose addresses differ from its own config:
    # an edit of the VIPs applied to one balancer first must not change them.
    import re

    def advertised(text):
        return re.search(r"virtual_ipaddress \{\n(.*?)\n    \}", render(text), re.S)[1].split("\n")

    from lbctl.render.keepalived import vrrp_anchor

    anchor = f"        {vrrp_anchor(cluster_from(PAIR))}/32 dev lo scope host"
    assert [line for line in advertised(PAIR) if not line.strip().startswith("#")] == [anchor]
    fewer = PAIR.replace("  dns: {vip: 192.168.100.11", "  dns: {vip: 192.168.100.10")
    assert [line for line in advertised(fewer) if not line.strip().startswith("#")] == [anchor]
    excluded = re.search(r"virtual_ipaddress_excluded \{\n(.*?)\n    \}", render(PAIR), re.S)[1]
    assert excluded.split("\n") == ["        192.168.100.10/32 dev eth0",
                                     "        192.168.100.11/32 dev eth0"]


# What each kind of balancer needs beside keepalived: a pair's takeover
# grace needs nft, and mode ecmp's announce hook gives a drained worker its
# mh slots with ipvsadm.
@pytest.mark.parametrize("program,package,kind", [("nft", "nftables", {"takeover": True}),
                                                  ("ipvsadm", "ipvsadm", {"announce": True})])
def test_a_balancer_without_a_program_it_needs_is_refused_before_anything_changes(
        tmp_path, program, package, kind):
    binary = tmp_path / "keepalived"
    binary.write_text("#!/bin/sh\necho 'Keepalived v2.2.7 (01/16,2022)' >&2\n")
    binary.chmod(0o755)
    keepalived = KeepalivedDaemon(Layout("pi-web", str(tmp_path / "root")), systemd=NO_SYSTEMD,
                                  binary=str(binary), **kind, **{program: str(tmp_path / program)})
    with pytest.raises(ApplyError, match=rf"run {program}: it is not installed .*`apt install "
                                         rf"{package}`; nothing on this node was changed"):
        keepalived.prepare()
    assert not (tmp_path / "root").exists()


def test_a_file_a_hook_reads_under_a_lock_is_written_holding_it():
    from lbctl.engine.plan import Change, Plan
    from lbctl.state import FileSpec

    files = FakeFiles()
    seen = []
    write = files.write
    files.write = lambda path, content, mode: (seen.append(list(files.held)),
                                               write(path, content, mode))
    plan = Plan("lb1", "balancer", "pi-web", changes=[
        Change("add", "file", "/etc/lbctl/pi-web/announce.slots",
               FileSpec("x\n", lock="/run/lbctl/pi-web/announce/slots.lock")),
        Change("add", "file", "/etc/lbctl/pi-web/announce.map", FileSpec("y\n"))])
    execute(plan, Adapters(ipvs=FakeIpvs(), addresses=FakeAddresses(), sysctls=FakeSysctls(),
                           files=files))
    assert seen == [["/run/lbctl/pi-web/announce/slots.lock"], []]
    assert files.held == []


def test_an_exec_check_the_script_user_cannot_run_stops_apply_before_any_change():
    class ClosedProgram(FakeDaemon):
        def prepare(self, programs=frozenset()):
            super().prepare(programs)
            if programs:
                raise ApplyError("check", f"exec health check {min(programs)}", "closed")

    exec_check = "health: {exec: {command: [/root/checks/web, --quick]}}}"
    node = Balancer(ClosedProgram())
    addresses = node.adapters.addresses.list()
    with pytest.raises(ApplyError, match="exec health check /root/checks/web"):
        node.apply(PAIR.replace("scheduler: wrr}", f"scheduler: wrr, {exec_check}"))
    assert node.keepalived.prepared_programs == {"/root/checks/web"}
    assert node.keepalived.calls == ["prepare"]
    assert node.adapters.files.files == {} and node.adapters.ipvs.dump() == []
    assert node.adapters.addresses.list() == addresses
    node.apply(PAIR)  # no exec check: nothing for the script user to run
    assert node.keepalived.prepared_programs == frozenset()


def test_a_reload_lost_after_the_files_were_written_is_made_good_by_the_next_apply():
    class ReloadKilled(FakeDaemon):
        def reload(self):
            super().reload()
            raise OSError(errno.EINTR, "killed")  # as a kill -9 of apply between the two

    node = Balancer()
    node.apply(PAIR)
    reweighted = PAIR.replace("pi3: {address: 192.168.100.6, weight: 2}",
                              "pi3: {address: 192.168.100.6, weight: 5}")
    assert reweighted != PAIR
    node.adapters.daemons["keepalived"] = node.keepalived = ReloadKilled(is_running=True)
    with pytest.raises(ApplyError):
        node.apply(reweighted)
    assert "weight 5" in node.adapters.files.read(CONF)[0]  # the files are the new ones
    # The files match the cluster file, yet keepalived runs the old ones: reload.
    node.adapters.daemons["keepalived"] = node.keepalived = FakeDaemon(is_running=True)
    plan = node.plan(reweighted)
    assert [(c.kind, c.key) for c in plan.changes] == [("keepalived", "reload")]
    assert "not known to run the files on disk" in format_plan(plan)
    node.apply(reweighted)
    assert node.keepalived.calls == ["prepare", "reload"]
    assert node.plan(reweighted).empty


def test_a_pair_reloaded_as_one_balancer_knows_keepalived_drops_the_vips_it_must_hold():
    from lbctl.commands.apply import vips_the_reload_drops

    checked_pair = PAIR.replace("scheduler: wrr}", "scheduler: wrr, health: {http: {path: /}}}")
    node = Balancer()
    node.apply(checked_pair)
    for vip in ("192.168.100.10", "192.168.100.11"):  # the master's keepalived holds them
        node.adapters.addresses.entries.add((IPv4Address(vip), 32, "eth0"))

    alone = node.context(HEALTHY)
    assert not [c for c in alone.plan.changes if c.kind == "address"]  # present: none to add
    assert {str(a) for a in vips_the_reload_drops(alone)} == {
        "192.168.100.10/32 dev eth0", "192.168.100.11/32 dev eth0"}
    assert vips_the_reload_drops(node.context(checked_pair.replace("weight: 2", "weight: 3"))) \
        == set()
    execute(alone.plan, node.adapters)
    assert vips_the_reload_drops(node.context(HEALTHY.replace("weight: 2", "weight: 3"))) == set()


CHECKED_PAIR = PAIR.replace("scheduler: wrr}", "scheduler: wrr, health: {http: {path: /}}}")
PAIR_VIPS = [IPv4Address("192.168.100.10"), IPv4Address("192.168.100.11")]


def _master_going_alone():
    """lb1 of the checked pair, its keepalived holding the VIPs, and the
    context of the one-balancer file: (node, context, its plan bridged)."""
    from lbctl.commands.apply import _bridged, vips_the_reload_drops

    from lbctl.render.keepalived import vrrp_anchor

    node = Balancer()
    node.apply(CHECKED_PAIR)
    node.adapters.addresses.entries.update((vip, 32, "eth0") for vip in PAIR_VIPS)
    anchor = IPv4Address(vrrp_anchor(cluster_from(CHECKED_PAIR)))
    node.adapters.addresses.entries.add((anchor, 32, "lo"))
    alone = node.context(HEALTHY)
    return node, alone, _bridged(alone, vips_the_reload_drops(alone))


def _lo_owned(node):
    owned = read_ownership(node.adapters.files, node.adapters.ownership_dir, "pi-web")
    return sorted(str(a) for a in owned.addresses if a.ifname == "lo")


def test_the_vips_keepalived_lets_go_of_wait_on_lo_until_this_balancer_holds_them():
    # Between keepalived's reload and this balancer adding them (after its
    # ARP Probes), the VIPs stay local: no new connection is refused.
    node, _ctx, plan = _master_going_alone()
    entries = node.adapters.addresses.entries
    on_lo = {(vip, 32, "lo") for vip in PAIR_VIPS}
    assert "+ address 192.168.100.10/32 dev lo (until this balancer holds it on its " \
        "interface)" in format_plan(plan)
    assert not on_lo & entries  # nothing before the run, which tests keepalived's config first
    execute(plan, node.adapters)
    assert on_lo <= entries
    # Recorded too: an apply stopped from here leaves them to the next one.
    assert _lo_owned(node) == ["192.168.100.10/32 dev lo", "192.168.100.11/32 dev lo"]
    entries.difference_update((vip, 32, "eth0") for vip in PAIR_VIPS)  # keepalived let them go
    after = node.plan(HEALTHY)
    assert sorted((c.action, str(c.key)) for c in after.changes if c.kind == "address") == [
        ("add", "192.168.100.10/32 dev eth0"), ("add", "192.168.100.11/32 dev eth0"),
        ("remove", "192.168.100.10/32 dev lo"), ("remove", "192.168.100.11/32 dev lo")]
    execute(after, node.adapters)
    assert not on_lo & entries and {(vip, 32, "eth0") for vip in PAIR_VIPS} <= entries
    assert _lo_owned(node) == []
    assert node.plan(HEALTHY).empty


def test_a_config_keepalived_refuses_leaves_no_vip_on_lo():
    node, _ctx, plan = _master_going_alone()
    node.keepalived.rejects = ["(keepalived.conf: Line 40) Invalid lvs_scheduler 'x'"]
    with pytest.raises(ApplyError, match="Invalid lvs_scheduler"):
        execute(plan, node.adapters)
    assert not {(vip, 32, "lo") for vip in PAIR_VIPS} & node.adapters.addresses.entries
    assert _lo_owned(node) == []


def test_an_apply_run_again_after_one_stopped_keeps_the_vips_on_lo_through_the_reload():
    # The first run added them to lo and was stopped at keepalived's reload.
    class StoppedAtReload(FakeDaemon):
        def reload(self):
            raise OSError(errno.EINTR, "killed")

    node, _ctx, plan = _master_going_alone()
    node.adapters.daemons["keepalived"] = node.keepalived = StoppedAtReload(is_running=True)
    with pytest.raises(ApplyError):
        execute(plan, node.adapters)
    assert _lo_owned(node) == ["192.168.100.10/32 dev lo", "192.168.100.11/32 dev lo"]
    node.adapters.daemons["keepalived"] = node.keepalived = FakeDaemon(is_running=True)
    from lbctl.commands.apply import _bridged, vips_the_reload_drops

    alone = node.context(HEALTHY)
    # Its new config is on disk already: keepalived's anchor says it still
    # runs the pair's instance, whose VIPs its reload will take.
    released = vips_the_reload_drops(alone)
    assert {str(a) for a in released} == {"192.168.100.10/32 dev eth0",
                                          "192.168.100.11/32 dev eth0"}
    again = _bridged(alone, released)
    # Neither added again nor taken away before keepalived has let go.
    assert not [c for c in again.changes if c.kind == "address"], format_plan(again)


def test_a_reload_in_mode_ecmp_lets_no_vip_go():
    # A file of mode ecmp has no VRRP instance, and so no anchor to look for.
    from helpers import PI_ECMP
    from lbctl.commands.apply import vips_the_reload_drops

    cluster = cluster_from(PI_ECMP)
    reload = SimpleNamespace(kind="keepalived", action="change")
    ctx = SimpleNamespace(cluster=cluster, adapters=Balancer().adapters,
                          plan=SimpleNamespace(changes=[reload]),
                          desired=SimpleNamespace(keepalived=SimpleNamespace(config=CONF),
                                                  addresses={"10.200.0.10/32 dev lo"}),
                          observed=SimpleNamespace(addresses=set()))
    assert vips_the_reload_drops(ctx) == set()


def test_a_pair_become_one_stops_the_sync_daemons_keepalived_leaves_running():
    """keepalived's reload into a config without lvs_sync_daemon leaves the
    pair's daemons running; only the cluster's own (interface and syncid) go."""
    from lbctl.adapters.protocols import SyncDaemon

    router_id = cluster_from(PAIR).vrrp.router_id
    ours = SyncDaemon("master", "eth0", router_id, "224.0.0.81", 8848)
    someone_elses = SyncDaemon("backup", "eth0", router_id % 255 + 1, "224.0.0.81", 8848)
    node = Balancer()
    node.apply(PAIR)
    node.adapters.ipvs.daemons = [ours, someone_elses]
    assert node.plan(PAIR).empty  # a pair's keepalived runs them

    alone = node.plan(HEALTHY)
    assert [(c.action, c.kind, c.key) for c in alone.changes][-1:] == [
        ("remove", "sync daemon", "master")]
    assert f"- sync daemon master on eth0 syncid {router_id} " in format_plan(alone)
    node.apply(HEALTHY)
    assert node.adapters.ipvs.daemons == [someone_elses]
    assert node.plan(HEALTHY).empty


def test_vips_keepalived_keeps_past_its_reload_are_an_error_not_a_silent_success():
    from lbctl.commands.apply import _wait_until_released
    from lbctl.state import Address

    vip = Address(IPv4Address("192.168.100.10"), "eth0", 32)
    addresses = FakeAddresses({(vip.ip, 32, "eth0")})
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 1:  # keepalived lets go after a second
            addresses.entries.clear()
    _wait_until_released({vip}, addresses, clock=lambda: now[0], sleep=sleep)
    assert 1 <= now[0] < 2

    addresses.entries.add((vip.ip, 32, "eth0"))
    now[0] = 0.0
    with pytest.raises(ApplyError) as err:
        _wait_until_released({vip}, addresses, clock=lambda: now[0],
                             sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert "192.168.100.10/32 dev eth0" in str(err.value)
    assert "run apply again" in str(err.value)


@pytest.mark.parametrize("systemctl_status, expected", [(0, True), (3, False), (1, True)])
def test_running_asks_systemd_and_reads_the_pid_file_when_systemd_cannot_answer(
        tmp_path, monkeypatch, systemctl_status, expected):
    """The exporter's dynamic user cannot reach systemd without a D-Bus system
    bus (systemctl exits 1); keepalived's pid file still shows it running."""
    import sys
    import time

    import lbctl.adapters.systemd as adapter

    layout = Layout("pi-web", str(tmp_path))
    conf = layout.real(layout.conf)
    pid_file = layout.real(layout.pid_file())
    os.makedirs(os.path.dirname(pid_file), exist_ok=True)
    # A process whose command line names the cluster's config, as keepalived's does.
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", conf])
    try:
        deadline = time.monotonic() + 10
        while conf.encode() not in open(f"/proc/{stand_in.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline, "the stand-in never showed its command line"
            time.sleep(0.05)
        with open(pid_file, "w") as fh:
            fh.write(f"{stand_in.pid}\n")
        monkeypatch.setattr(adapter, "run", lambda argv, **kw: subprocess.CompletedProcess(
            argv, systemctl_status, "", "Failed to connect to bus" if systemctl_status == 1
            else ""))
        assert KeepalivedDaemon(layout, Systemd(runs=True)).running() is expected
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_fresh_start_empties_the_state_folder_whatever_the_script_user_left(tmp_path):
    from lbctl.adapters.keepalived import empty_folder

    state = tmp_path / "state"
    (state / "sub" / "deeper").mkdir(parents=True)
    (state / "sub" / "deeper" / "f").write_text("x")
    (state / "health.web@pi1").write_text("up 1\n")
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (state / "link").symlink_to(outside)
    (state / "sub" / "link").symlink_to(outside)
    empty_folder(str(state))
    assert state.is_dir() and list(state.iterdir()) == []
    assert (outside / "keep").is_dir()  # links were removed, not followed


def test_an_exporter_on_every_address_or_a_vip_must_say_it_is_public():
    everywhere = PAIR + "exporter: {listen: 0.0.0.0:9588, public: true}\n"
    assert cluster_from(everywhere).exporter == "0.0.0.0:9588"
    public = units_of(everywhere, "lb1")["/etc/systemd/system/lbctl-pi-web-exporter.service"]
    assert "IPAddressAllow" not in public and "IPAddressDeny" not in public
    # public on the node's own address: a Prometheus beyond the LAN may scrape it.
    beyond = units_of(PAIR + "exporter: {listen: 'node:9588', public: true}\n", "lb1")[
        "/etc/systemd/system/lbctl-pi-web-exporter.service"]
    assert "IPAddressAllow" not in beyond and "--listen 192.168.100.2:9588" in beyond
    local = units_of(PAIR + "exporter:\n", "lb1")[
        "/etc/systemd/system/lbctl-pi-web-exporter.service"]
    assert "IPAddressDeny=any\nIPAddressAllow=localhost\n" in local
    assert cluster_from(PAIR + "exporter: {listen: 'node:9588'}\n").exporter == "node:9588"
    with pytest.raises(ConfigError, match="serves the metrics on every address"):
        cluster_from(everywhere.replace("public: true", "public: false"))
    with pytest.raises(ConfigError, match="exporter.public: expected true or false"):
        cluster_from(everywhere.replace("public: true", "public: 'yes'"))
