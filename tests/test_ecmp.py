"""Mode ecmp: several active balancers announcing the VIPs over BGP.

The file's `mode:` and `bgp:` sections, the BIRD config a balancer gets
(checked by BIRD's own parser), and what this version does with the nodes.
Bad files are in tests/cases/bad/ecmp-*.yaml (test_bad_input.py).
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest

from lbctl.config import load_cluster
from pathlib import Path

from helpers import PI_ECMP, install_hook, keepalived_findings, routed
from lbctl.status.bgp import bgp_report, format_bgp
from lbctl.config.model import Bfd, Bgp
from lbctl.engine.desired import desired_state
from lbctl.render.bird import render_announce_map, render_bird_conf
from lbctl.layout import Layout
from lbctl.render.systemd import exec_start_lines
from lbctl.status.collect import bgp_status

BIRD = shutil.which("bird") or "/usr/sbin/bird"
BIRDC = shutil.which("birdc") or "/usr/sbin/birdc"

ECMP = PI_ECMP


def load(tmp_path, text=ECMP):
    path = tmp_path / "ecmp.yaml"
    path.write_text(text)
    return load_cluster(str(path))


def test_three_active_balancers_with_bgp_defaults(tmp_path):
    cluster = load(tmp_path)
    assert cluster.mode == "ecmp"
    assert list(cluster.balancers) == ["lb1", "lb2", "lb3"]
    # No VRRP, so no priorities.
    assert {b.priority for b in cluster.balancers.values()} == {None}
    assert cluster.vrrp is None
    # BGP's usual timers: hold 9 s, a keepalive every third of it; no BFD.
    assert cluster.bgp == Bgp(65001, cluster.bgp.router, 65000, 9, 3, None)
    assert str(cluster.bgp.router) == "192.168.100.1"


def test_timers_and_bfd_as_the_file_gives_them(tmp_path):
    text = ECMP.replace("  as: 65001\n", "  as: 4200000001\n  hold: 6s\n  bfd: {interval: 50ms}\n")
    cluster = load(tmp_path, text)
    assert (cluster.bgp.local_as, cluster.bgp.hold, cluster.bgp.keepalive) == (4200000001, 6, 2)
    # The multiplier left out is BIRD's own default, 5: 3 withdraws healthy
    # balancers whose link or CPU is busy.
    assert cluster.bgp.bfd == Bfd(0.05, 5)
    assert load(tmp_path, ECMP.replace("  as: 65001\n", "  as: 65001\n  bfd: true\n")).bgp.bfd \
        == Bfd(0.1, 5)


def test_the_other_modes_are_told_by_the_balancers(tmp_path):
    single = routed(ECMP).replace("mode: ecmp\n", "").replace(
        "bgp:\n  as: 65001\n  router: {address: 192.168.100.1, as: 65000}\n", "")
    single = single.replace("  lb2: {address: 192.168.100.5, interface: eth0}\n", "")
    single = single.replace("  lb3: {address: 192.168.100.7, interface: eth0}\n", "")
    assert load(tmp_path, single).mode == "single"
    pair = single.replace("balancers:\n", "balancers:\n  lb2: {address: 192.168.100.5}\n")
    assert load(tmp_path, pair).mode == "failover"
    assert load(tmp_path, "mode: failover\n" + pair).mode == "failover"


def layout_in(tmp_path, cluster):
    layout = Layout(cluster.name, str(tmp_path / "root"))
    (tmp_path / "root" / layout.announce_dir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return layout


def test_a_balancer_offers_the_router_the_vips_its_hook_puts_in_the_folder(tmp_path):
    cluster = load(tmp_path)
    layout = layout_in(tmp_path, cluster)
    text = render_bird_conf(cluster, "lb2", "eth0", layout)
    assert "router id 192.168.100.5;" in text
    assert "local 192.168.100.5 as 65001;" in text
    assert "neighbor 192.168.100.1 as 65000;" in text
    assert "hold time 9;" in text and "keepalive time 3;" in text
    assert f'    include "{layout.real(layout.announce_dir)}/*.conf";' in text
    assert 'export where proto = "lbctl_vips";' in text
    # Nothing from the router comes in, nothing reaches the kernel's table,
    # and a balancer that goes away is withdrawn, not kept as stale.
    assert "import none;" in text
    assert "protocol kernel" not in text
    assert "graceful restart off;" in text
    assert "bfd" not in text.split("protocol bgp")[1]


def test_the_announce_map_lists_every_service_of_each_vip(tmp_path):
    text = ECMP.replace("  dns: {vip: 10.200.0.11,", "  ssh: {vip: 10.200.0.10, port: 22, "
                        "scheduler: mh}\n  dns: {vip: 10.200.0.11,")
    # Each service as keepalived knows it, by protocol, VIP and port: a
    # renamed service keeps its record, and no name is taken for an action.
    assert render_announce_map(load(tmp_path, text)) == \
        "10.200.0.10 tcp-10.200.0.10-22 tcp-10.200.0.10-80\n10.200.0.11 udp-10.200.0.11-53\n"


@pytest.mark.parametrize("bfd", ["", "  bfd: {interval: 100ms, multiplier: 5}\n"])
@pytest.mark.parametrize("offered", [0, 2])
def test_bird_itself_accepts_the_config(tmp_path, bfd, offered):
    """BIRD's parser (`bird -p`) is the judge of its syntax, not a golden file;
    with routes in the folder as the hook writes them, and with none."""
    cluster = load(tmp_path, ECMP.replace("  as: 65001\n", "  as: 65001\n" + bfd))
    layout = layout_in(tmp_path, cluster)
    for vip in cluster.vips[:offered]:
        Path(layout.real(layout.announce_dir), f"{vip}.conf").write_text(
            f"route {vip}/32 blackhole;\n")
    conf = tmp_path / "bird.conf"
    conf.write_text(render_bird_conf(cluster, "lb1", "eth0", layout))
    if bfd:
        assert 'interface "eth0" {\n        interval 100 ms;\n        multiplier 5;' \
            in conf.read_text()
        assert "    bfd on;\n" in conf.read_text()
    done = subprocess.run([BIRD, "-p", "-c", str(conf)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr + conf.read_text()


def test_bird_rejects_what_the_template_must_never_write(tmp_path):
    """The judge above can fail: a config BIRD cannot parse exits non-zero."""
    conf = tmp_path / "bird.conf"
    cluster = load(tmp_path)
    conf.write_text(render_bird_conf(cluster, "lb1", "eth0", layout_in(tmp_path, cluster))
                    .replace("blackhole", "blackhol").replace("lbctl_vips {", "lbctl_vips {{"))
    done = subprocess.run([BIRD, "-p", "-c", str(conf)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0


def test_a_worker_behind_ecmp_balancers_is_configured_as_any_other(tmp_path):
    worker = desired_state(load(tmp_path), "pi1", None)
    assert {(str(a.ip), a.ifname) for a in worker.addresses} == {("10.200.0.10", "lo"),
                                                                  ("10.200.0.11", "lo")}


def balancer_state(tmp_path, node="lb1", text=ECMP):
    cluster = load(tmp_path, text)
    layout = Layout(cluster.name, str(tmp_path / "root"))
    return cluster, layout, desired_state(cluster, node, "eth0", layout=layout)


def test_a_balancer_holds_the_vips_on_lo_and_never_answers_arp_for_them(tmp_path):
    _cluster, layout, state = balancer_state(tmp_path)
    assert {(str(a.ip), a.ifname) for a in state.addresses} == {("10.200.0.10", "lo"),
                                                                 ("10.200.0.11", "lo")}
    assert state.external >= {svc for svc in state.start_services}  # keepalived's table
    assert state.sysctls["net.ipv4.conf.all.arp_ignore"] == "1"
    assert state.sysctls["net.ipv4.conf.all.arp_announce"] == "2"
    # A flow the router moves to this balancer mid-stream is scheduled, by mh.
    assert state.sysctls["net.ipv4.vs.sloppy_tcp"] == "1"
    assert {s.scheduler for s in state.start_services.values()} == {"mh"}
    # No pair: no sync daemon thresholds, no takeover grace.
    assert "net.ipv4.vs.sync_threshold" not in state.sysctls
    assert layout.takeover not in state.files and layout.takeover_rules not in state.files
    # At boot the unit sets the ARP sysctls before it puts the VIPs back.
    unit = state.files[f"/etc/systemd/system/{layout.unit}"].content
    starts = exec_start_lines(unit, "ExecStartPre")
    arp = starts.index(["/usr/sbin/sysctl", "-q", "-w", '"net.ipv4.conf.all.arp_ignore=1"'])
    vip = starts.index(["/usr/sbin/ip", "-4", "address", "replace", "10.200.0.10/32", "dev",
                        "lo"])
    assert arp < vip


def test_a_balancer_runs_bird_with_keepalived(tmp_path):
    _cluster, layout, state = balancer_state(tmp_path, "lb2")
    assert "router id 192.168.100.5;" in state.files[layout.bird_conf].content
    assert state.files[layout.announce_map].content == \
        "10.200.0.10 tcp-10.200.0.10-80\n10.200.0.11 udp-10.200.0.11-53\n"
    assert state.files[layout.announce].mode == 0o755
    bird = state.files[f"/etc/systemd/system/{layout.bird_unit}"].content
    # BIRD stops (the router withdraws the VIPs) when keepalived stops or dies.
    assert f"BindsTo={layout.unit}\n" in bird and f"After={layout.unit}\n" in bird
    assert state.links[f"/etc/systemd/system/multi-user.target.wants/{layout.bird_unit}"]
    keepalived = state.files[f"/etc/systemd/system/{layout.unit}"].content
    assert f"Wants={layout.bird_unit}\n" in keepalived
    # A reload syncs the offered VIPs with the file's services; a start
    # offers nothing until the checks pass.
    assert exec_start_lines(keepalived, "ExecReload")[-1] == layout.announce_argv("sync")
    assert exec_start_lines(keepalived, "ExecStartPre")[-1] == layout.announce_argv("reset")
    # However keepalived ends (a crash before systemd restarts it included:
    # BindsTo does not stop BIRD then), BIRD offers nothing.
    assert exec_start_lines(keepalived, "ExecStopPost") == [layout.announce_argv("reset")]
    # A changed map reloads keepalived (whose hook has BIRD offer what it
    # says); a changed bird.conf reloads BIRD alone.
    assert layout.announce_map in state.daemons["keepalived"].files
    assert state.daemons["bird"].files == {layout.bird_conf}


def test_keepalived_runs_checks_and_quorum_hooks_but_no_vrrp(tmp_path):
    _cluster, layout, state = balancer_state(tmp_path)
    conf = state.files[layout.conf].content
    assert "vrrp_instance" not in conf and "lvs_sync_daemon" not in conf
    hook = " ".join(layout.announce_argv())
    assert f'quorum_up "{hook} event tcp-10.200.0.10-80 up" root' in conf
    assert f'quorum_down "{hook} event udp-10.200.0.11-53 down" root' in conf
    # A worker whose weight fell to 0 keeps its slots in mh's table: without
    # mh-fallback, new flows hashed to it would be dropped.
    assert conf.count("    mh-fallback\n") == 2
    assert conf.count("    omega\n") == 2 and conf.count("    quorum 1\n") == 2
    # Each start of keepalived's checker process runs the hook too.
    assert f"    lvs_notify_fifo {layout.real(layout.checker_fifo)} root\n" in conf
    assert f'    lvs_notify_fifo_script "{hook} started" root\n' in conf


def test_the_announce_hook_has_each_drained_worker_with_the_weight_its_mh_slots_had(tmp_path):
    # keepalived adds a drained server at weight 0, and mh fills its table
    # by the last weight above 0: the hook gives back what the other
    # balancers filled theirs by, as the drain record kept it.
    from lbctl.adapters.protocols import IpvsDest, IpvsService
    from lbctl.records.drains import slot_weights, table_weights, with_drain

    text = ECMP.replace("  pi2: {address: 192.168.100.4}\n",
                        "  pi2: {address: 192.168.100.4}\n  pi3: {address: 192.168.100.6}\n")
    cluster = load(tmp_path, text)
    web, dns = cluster.services["web"], cluster.services["dns"]
    # keepalived had pi2 at weight 3 on web (the file's weight changed
    # since, or its dynamic weight); on dns it failed its checks (0).
    table = [IpvsService(web.key, "tcp", "mh", 0, tuple(
                 IpvsDest(rs.address, 80, 3 if rs.worker == "pi2" else 1, 3)
                 for rs in web.real_servers)),
             IpvsService(dns.key, "udp", "mh", 0, tuple(IpvsDest(rs.address, 53, 0, 3)
                                                        for rs in dns.real_servers))]
    drains = {}
    for worker in ("pi2", "pi3"):
        drains = with_drain(drains, worker, None, 1.0,
                            table_weights(cluster, worker, None, table, drains))
    # The file's weight changes while pi2 is drained: its slots stay as filled.
    cluster = load(tmp_path, text.replace("pi2: {address: 192.168.100.4}",
                                          "pi2: {address: 192.168.100.4, weight: 5}"))
    layout = Layout(cluster.name, str(tmp_path / "root"))
    state = desired_state(cluster, "lb1", "eth0", layout=layout,
                          slots=slot_weights(cluster, drains))
    slots = state.files[layout.announce_slots]
    lines = [line for line in slots.content.splitlines() if not line.startswith("#")]
    assert lines == ["tcp-10.200.0.10-80 192.168.100.4:80:3",
                     "tcp-10.200.0.10-80 192.168.100.6:80:1",
                     "udp-10.200.0.11-53 192.168.100.4:53:1",  # the file's: it had it before
                     "udp-10.200.0.11-53 192.168.100.6:53:1"]
    # Written under the lock the hook holds as it acts on it, where it looks.
    assert slots.lock == layout.announce_slots_lock
    assert layout.announce_slots == layout.announce_map.removesuffix(".map") + ".slots"
    assert layout.announce_slots_lock == f"{layout.announce_dir}/slots.lock"
    # keepalived's config passes nothing of it: a line holds 1,023 characters.
    ups = [line for line in state.files[layout.conf].content.splitlines() if "quorum_up" in line]
    assert len(ups) == 2 and all(line.endswith(' up" root') for line in ups), ups


def _weights(cluster, web=None, dns=None):
    """An IPVS dump with pi2 (pi1 at 1) at `web` and `dns` (None: pi2 not
    there; "absent": the service not there)."""
    from lbctl.adapters.protocols import IpvsDest, IpvsService

    table = []
    for svc, weight in ((cluster.services["web"], web), (cluster.services["dns"], dns)):
        if weight == "absent":
            continue
        dests = [IpvsDest(rs.address, svc.port, 1, 3) for rs in svc.real_servers
                 if rs.worker == "pi1"]
        if weight is not None:
            dests.append(IpvsDest(cluster.workers["pi2"].address, svc.port, weight, 3))
        table.append(IpvsService(svc.key, str(svc.key), "mh", 0, tuple(dests)))
    return table


def _slots(cluster, drains):
    from lbctl.records.drains import slot_weights

    return {key.service.protocol: weight for key, weight in slot_weights(cluster, drains).items()}


def test_a_drain_records_the_weight_each_mh_table_was_filled_by(tmp_path):
    from lbctl.records.drains import Drain, table_weights, with_drain, without_drain

    cluster = load(tmp_path)

    def drained(table, drains=None, service=None):
        drains = drains or {}
        return with_drain(drains, "pi2", service, 1.0,
                          table_weights(cluster, "pi2", service, table, drains))

    # Taking connections: that weight.  Failed its checks (0): the file's,
    # the one it had before.  A service this balancer's table lacks
    # (keepalived stopped): the file's too.
    assert _slots(cluster, drained(_weights(cluster, web=4, dns=0))) == {"tcp": 4, "udp": 1}
    assert _slots(cluster, drained(_weights(cluster, web=4, dns="absent"))) == \
        {"tcp": 4, "udp": 1}
    # A server the table's service lacks is added drained, at 0, everywhere.
    assert _slots(cluster, drained(_weights(cluster, web=4, dns=None))) == {"tcp": 4}
    # Drained again, with the table at 0: what the first drain saw.
    first = drained(_weights(cluster, web=4, dns=None))
    assert _slots(cluster, drained(_weights(cluster, web=0, dns=0), first)) == {"tcp": 4}
    # ... so a worker that joined dns while drained (at 0 on every balancer)
    # gets no slots there.  One service undrained keeps the others' weights,
    # and a drain of it again reads the table afresh.
    both = drained(_weights(cluster, web=4, dns=2))
    web_only = without_drain(both, cluster, "pi2", "dns")
    assert _slots(cluster, web_only) == {"tcp": 4}
    assert list(web_only["pi2"].weights) == [k for k in both["pi2"].weights if "tcp" in k]
    assert _slots(cluster, drained(_weights(cluster, web=0, dns=None), web_only)) == {"tcp": 4}
    # A record of an older lbctl has no weights: the file's.
    assert _slots(cluster, {"pi2": Drain("pi2", None, 1.0)}) == {"tcp": 1, "udp": 1}


def test_keepalived_accepts_the_ecmp_config(tmp_path):
    text = ECMP.replace("scheduler_flags: [mh-port]}", "scheduler_flags: [mh-port],\n"
                        "       health: {http: {path: /}}}")
    conf, findings = keepalived_findings(tmp_path, text)
    assert "quorum_up" in conf and "HTTP_GET" in conf and "lvs_notify_fifo_script" in conf
    assert findings == []


# -- keepalived's announce hook, with a real BIRD -----------------------------

HOOK_MAP = "10.200.0.10 ssh web\n10.200.0.11 dns\n"


@pytest.fixture
def bird(tmp_path):
    """A BIRD whose static routes are the hook's folder, as a balancer's are;
    (hook, offered, folder): run the hook, the VIPs BIRD holds now, the folder."""
    short = Path(tempfile.mkdtemp(prefix="lbctl-bird-"))  # a socket path is at most 107 bytes
    folder, socket, pid = short / "announce", short / "bird.ctl", short / "bird.pid"
    folder.mkdir()
    conf = short / "bird.conf"
    # As a balancer's, with a session to a router that is not there.
    conf.write_text(f'router id 192.0.2.1;\ntimeformat protocol iso long;\n'
                    f'timeformat route iso long;\nprotocol static lbctl_vips {{\n    ipv4;\n'
                    f'    include "{folder}/*.conf";\n}}\n'
                    'protocol bgp lbctl_router {\n    local 127.0.0.1 as 65001;\n'
                    '    neighbor 127.0.0.2 as 65000;\n    ipv4 { import none; '
                    'export where proto = "lbctl_vips"; next hop self; };\n}\n')
    (tmp_path / "announce.map").write_text(HOOK_MAP)
    script = install_hook(tmp_path, "lbctl-announce")
    proc = subprocess.Popen([BIRD, "-f", "-c", str(conf), "-s", str(socket), "-P", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def hook(*args, stays=False, argv_only=False):
        argv = [str(script), str(folder), str(socket), str(tmp_path / "announce.map"),
                str(tmp_path / "drained"), *args]
        if argv_only:
            return argv
        if stays:  # in a process group of its own, as keepalived starts its scripts
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, process_group=0)
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    def offered():
        shown = subprocess.run([BIRDC, "-s", str(socket), "show", "route"],
                               capture_output=True, text=True, timeout=30).stdout
        return sorted(line.split("/")[0] for line in shown.splitlines()
                      if "/32" in line and "blackhole" in line)

    deadline = time.monotonic() + 10
    while not socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield hook, offered, folder, str(socket)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(short)


def test_a_vip_is_offered_only_while_every_service_on_it_is_up(bird):
    hook, offered, _folder, _socket = bird
    assert hook("sync").returncode == 0 and offered() == []
    assert hook("event", "web", "up").returncode == 0
    assert offered() == []  # ssh, on the same VIP, has no healthy worker yet
    hook("event", "ssh", "up")
    hook("event", "dns", "up")
    assert offered() == ["10.200.0.10", "10.200.0.11"]
    hook("event", "ssh", "down")  # its last worker failed, or keepalived stops (omega)
    assert offered() == ["10.200.0.11"]


def test_apply_forgets_the_weight_of_a_drained_server_gone_from_file_and_config(tmp_path):
    # The file drops pi2 from dns while pi2 is drained: once keepalived's
    # config no longer keeps it for its connections, keepalived deletes it,
    # and the file adding it back has it added at 0, with no slots; while
    # kept, it stays in the table, and keeps them.
    from lbctl.adapters.files import FilesRoot
    from lbctl.commands.apply import forget_weights_of_the_gone
    from lbctl.config.model import DestKey
    from lbctl.records.drains import read_drains, table_weights, with_drain, write_drains

    cluster = load(tmp_path)
    drains = with_drain({}, "pi2", None, 1.0, table_weights(
        cluster, "pi2", None, _weights(cluster, web=4, dns=2), {}))
    dns = cluster.services["dns"]
    pi2_dns = DestKey(dns.key, cluster.workers["pi2"].address, dns.port)
    without_dns = load(tmp_path, ECMP.replace("scheduler: mh}", "scheduler: mh, "
                                              "workers: [pi1]}"))
    files = FilesRoot(str(tmp_path))
    write_drains(files, cluster.name, drains)

    def applied(draining):
        ctx = SimpleNamespace(drains=read_drains(files, cluster.name), cluster=without_dns,
                              desired=SimpleNamespace(draining=draining),
                              adapters=SimpleNamespace(files=files))
        forget_weights_of_the_gone(ctx)
        return _slots(cluster, read_drains(files, cluster.name))

    assert applied({pi2_dns}) == {"tcp": 4, "udp": 2}
    assert applied(set()) == {"tcp": 4}


FAKE_IPVSADM = """\
#!/bin/sh
# What the hook asks of ipvsadm, one line of arguments and the lines it reads.
log=${0%/*}/ipvsadm.log
echo "ipvsadm $*" >> "$log"
[ "$1" != -R ] || cat >> "$log"
[ ! -e "${0%/*}/ipvsadm.fails" ] || [ "$1" != -R ]
"""
WEB, DNS = "tcp-10.200.0.10-80", "udp-10.200.0.10-53"
PI2_SLOTS_BACK = ["ipvsadm -R", "-e -t 10.200.0.10:80 -r 192.168.100.4:80 -g -w 3",
                  "-e -t 10.200.0.10:80 -r 192.168.100.4:80 -g -w 0",
                  "ipvsadm -R", "-e -u 10.200.0.10:53 -r 192.168.100.4:53 -g -w 1",
                  "-e -u 10.200.0.10:53 -r 192.168.100.4:53 -g -w 0"]


@pytest.fixture
def ipvsadm(tmp_path, monkeypatch):
    """A stand-in for ipvsadm in the hook (the host has no IPVS), and one VIP
    with two services, pi2 drained on both: the lines ipvsadm was given,
    as a function."""
    folder = tmp_path / "fake"
    folder.mkdir()
    fake = folder / "ipvsadm"
    fake.write_text(FAKE_IPVSADM)
    fake.chmod(0o755)
    monkeypatch.setenv("LBCTL_IPVSADM", str(fake))
    (tmp_path / "announce.map").write_text(f"10.200.0.10 {WEB} {DNS}\n")
    (tmp_path / "announce.slots").write_text(f"{WEB} 192.168.100.4:80:3\n"
                                             f"{DNS} 192.168.100.4:53:1\n"
                                             f"{WEB}-not 192.168.100.9:80:1\n"
                                             f"{WEB} 192.168.100.9:80\n"
                                             f"{WEB} 192.168.100.9:80:\n"
                                             f"{WEB} 192.168.100.9:80:1;reboot\n")
    log = folder / "ipvsadm.log"
    return lambda: log.read_text().splitlines() if log.exists() else []


def test_a_vip_about_to_be_offered_gives_its_drained_workers_slots_back_under_the_lock(
        bird, ipvsadm):
    # The hook reads the slots and acts on them under the lock apply and
    # drain hold as they write them: an undrain's write comes before it or
    # after, never while the hook is about to set a weight from the old file.
    from lbctl.adapters.files import FilesRoot

    hook, offered, folder, _socket = bird
    assert hook("event", WEB, "up").returncode == 0
    assert ipvsadm() == [] and offered() == []  # (DNS, on the same VIP, is not up)
    with FilesRoot("/").locked(str(folder / "slots.lock")):
        waiting = hook("event", DNS, "up", stays=True)
        time.sleep(1.5)
        assert waiting.poll() is None and ipvsadm() == [] and offered() == []
        # The route waits for the slots: no flow comes before they are back.
        assert not (folder / "10.200.0.10.conf").exists()
    assert waiting.wait(timeout=30) == 0, waiting.stderr.read()
    # Every service's drained servers on that VIP, each its weight then 0 in
    # one run, before the route is written.
    assert ipvsadm() == PI2_SLOTS_BACK
    assert offered() == ["10.200.0.10"]
    # With the VIP on offer, flows come here: the weights are left alone,
    # and the slots' lock is not waited for.
    with FilesRoot("/").locked(str(folder / "slots.lock")):
        again = hook("event", WEB, "up", stays=True)
        assert again.wait(timeout=5) == 0  # (the hook waits up to 10 s for the lock)
    assert len(ipvsadm()) == 6


def test_whichever_run_offers_the_vip_gives_the_slots_back(bird, ipvsadm):
    # The services' own runs recorded them up and ended before they offered
    # anything (a run that could not have the folder in time): apply's sync
    # offers the VIP, and gives the slots back first.
    hook, offered, folder, _socket = bird
    for service in (WEB, DNS):
        (folder / f"{service}.state").write_text(f"up 1 1 {os.getpid()}\n")
    assert hook("sync").returncode == 0
    assert ipvsadm() == PI2_SLOTS_BACK and offered() == ["10.200.0.10"]


def test_a_failed_ipvsadm_leaves_no_drained_worker_at_its_weight(bird, ipvsadm, tmp_path):
    hook, offered, folder, _socket = bird
    (tmp_path / "fake" / "ipvsadm.fails").touch()
    (folder / f"{DNS}.state").write_text(f"up 1 1 {os.getpid()}\n")
    assert hook("event", WEB, "up").returncode == 0
    assert ipvsadm() == [*PI2_SLOTS_BACK[:3],
                         "ipvsadm -e -t 10.200.0.10:80 -r 192.168.100.4:80 -g -w 0",
                         *PI2_SLOTS_BACK[3:],
                         "ipvsadm -e -u 10.200.0.10:53 -r 192.168.100.4:53 -g -w 0"]
    assert offered() == ["10.200.0.10"]


def test_a_hook_forked_before_the_one_on_record_changes_nothing(bird):
    hook, offered, folder, _socket = bird
    hook("event", "dns", "up")
    record = folder / "dns.state"
    state, ticks, pid, checker = record.read_text().split()
    assert state == "up" and int(ticks) > 0
    assert int(checker) == os.getpid()  # the process that ran the hook: keepalived's checker
    # The record as a hook forked far later would leave it: an older down
    # (keepalived forked it first, it ran last) is ignored.
    record.write_text(f"up {int(ticks) + 10**9} {pid} {checker}\n")
    hook("event", "dns", "down")
    assert offered() == ["10.200.0.11"]


def test_a_hook_killed_while_it_waits_for_the_folder_has_left_its_record(bird):
    # keepalived's reload kills the hooks still running (SIGTERM to each
    # one's process group); one waiting for another run's lock must have
    # recorded its event already, for apply's sync after the reload.
    import fcntl

    hook, offered, folder, _socket = bird
    held = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run of the hook, busy
        waiting = hook("event", "dns", "up", stays=True)
        _until(lambda: (folder / "dns.state").exists(), "dns's record")
        time.sleep(0.2)
        assert waiting.poll() is None  # still waiting for the folder
        os.killpg(waiting.pid, signal.SIGTERM)
        waiting.wait(timeout=10)
    finally:
        os.close(held)
    assert (folder / "dns.state").read_text().startswith("up ")
    assert offered() == []  # the killed run offered nothing ...
    assert hook("sync").returncode == 0
    assert offered() == ["10.200.0.11"]  # ... the next sync does


def test_a_record_of_a_checker_that_is_gone_counts_as_down(bird):
    # keepalived restarts a checker that died; the new one starts with quorum
    # down and reports nothing until it finds a worker.
    hook, offered, folder, _socket = bird
    hook("event", "dns", "up")
    dead = _dead_pid()
    state, ticks, pid, _checker = (folder / "dns.state").read_text().split()
    (folder / "dns.state").write_text(f"{state} {ticks} {pid} {dead}\n")
    assert hook("sync").returncode == 0
    assert offered() == []
    # One that has ended but that keepalived has not reaped yet: its hook
    # runs as it dies.
    hook("event", "dns", "up")
    assert offered() == ["10.200.0.11"]
    unreaped = subprocess.Popen(["true"])
    try:
        _until(lambda: open(f"/proc/{unreaped.pid}/stat").read().split(") ")[1][0] == "Z",
               "zombie")
        (folder / "dns.state").write_text(f"{state} {ticks} {pid} {unreaped.pid}\n")
        assert hook("sync").returncode == 0
        assert offered() == []
    finally:
        unreaped.wait()


# keepalived's checker, as far as the hook sees it: a parent that starts the
# hook in a process group of its own, says its PID, and waits for it.
FAKE_CHECKER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.execv(sys.argv[1], sys.argv[1:])
print(pid, flush=True)
os.waitpid(pid, 0)
"""


def test_a_checker_vouches_from_its_start_to_its_end(bird):
    # keepalived runs the hook with `started` and a FIFO each time its checker
    # process starts, and the hook stays while that checker runs.
    hook, offered, folder, _socket = bird
    for service in ("web", "ssh", "dns"):
        hook("event", service, "up")
    assert offered() == ["10.200.0.10", "10.200.0.11"]
    # A checker restarted after a crash has found no healthy worker yet: the
    # dead one's word is withdrawn as the new one starts.
    _checked_by(folder / "dns.state", _dead_pid())
    fifo = folder.parent / "checker.fifo"
    os.mkfifo(fifo, 0o600)
    argv = hook("started", str(fifo), argv_only=True)
    checker = subprocess.Popen([sys.executable, "-c", FAKE_CHECKER, *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = int(checker.stdout.readline())
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # as keepalived opens it
    try:
        _until(lambda: offered() == ["10.200.0.10"], "10.200.0.11 withdrawn")
        os.write(writer, b"VS [10.200.0.10]:tcp:80 UP\n")
        _checked_by(folder / "web.state", checker.pid)
        time.sleep(0.3)
        assert os.path.exists(f"/proc/{reader}"), "the hook ended while its checker runs"
        # That checker dies: keepalived's SIGTERM reaches the hook
        # (PR_SET_PDEATHSIG) while the FIFO, held open elsewhere, goes on.
        # What the checker reported is withdrawn at once, even before
        # keepalived starts another (up to a minute later).
        checker.kill()
        checker.wait()
        os.kill(reader, signal.SIGTERM)
        _until(lambda: not os.path.exists(f"/proc/{reader}"), "the hook to end")
    finally:
        os.close(writer)
    assert checker.stderr.read() == ""
    assert offered() == []


def test_a_reload_ends_the_checkers_hook_and_withdraws_nothing(bird):
    hook, offered, folder, _socket = bird
    for service in ("web", "ssh", "dns"):
        hook("event", service, "up")
    fifo = folder.parent / "checker.fifo"
    os.mkfifo(fifo, 0o600)
    reader = hook("started", str(fifo), stays=True)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        time.sleep(0.3)
        # keepalived's reload: SIGTERM to the hook's process group, the FIFO
        # left open; the checker, and so every record, stays.
        os.killpg(reader.pid, signal.SIGTERM)
        assert reader.wait(timeout=10) == 0 and reader.communicate() == ("", "")
    finally:
        os.close(writer)
    assert offered() == ["10.200.0.10", "10.200.0.11"]


@pytest.mark.parametrize("args", [[], ["/run/a.fifo", "/run/b.fifo"]])
def test_started_takes_the_fifo_alone(bird, args):
    hook, _offered, _folder, _socket = bird
    refused = hook("started", *args)
    assert (refused.returncode, refused.stderr) == (
        2, "lbctl-announce: started takes the FIFO's name alone\n")


def _checked_by(record, checker):
    state, ticks, pid, _checker = record.read_text().split()
    record.write_text(f"{state} {ticks} {pid} {checker}\n")


def _until(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {timeout}s"
        time.sleep(0.05)


def _dead_pid():
    """The pid of a process that has ended."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_reset_offers_nothing_and_forgets_every_record(bird):
    hook, offered, folder, _socket = bird
    for service in ("web", "ssh", "dns"):
        hook("event", service, "up")
    assert offered() == ["10.200.0.10", "10.200.0.11"]
    assert hook("reset").returncode == 0
    assert offered() == []
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".lock")] == []


def test_a_drained_balancer_offers_nothing_until_undrained(bird, tmp_path):
    hook, offered, _folder, _socket = bird
    for service in ("web", "ssh", "dns"):
        hook("event", service, "up")
    (tmp_path / "drained").write_text("")
    assert hook("sync").returncode == 0 and offered() == []
    hook("event", "dns", "up")  # a check that passes again changes nothing
    assert offered() == []
    (tmp_path / "drained").unlink()
    assert hook("sync").returncode == 0
    assert offered() == ["10.200.0.10", "10.200.0.11"]


def test_a_sync_follows_the_file(bird, tmp_path):
    hook, offered, _folder, _socket = bird
    for service in ("web", "ssh", "dns"):
        hook("event", service, "up")
    # The file dropped ssh (its VIP needs only web now) and the dns VIP.
    (tmp_path / "announce.map").write_text("10.200.0.10 web\n")
    assert hook("sync").returncode == 0
    assert offered() == ["10.200.0.10"]
    assert hook("event", "web", "sideways").returncode == 2


def test_a_sync_without_bird_running_leaves_the_offers_for_its_start(tmp_path):
    """A drain while BIRD is down (stopped by hand, or failed): keepalived has
    taken the weights, and the sync that follows must not turn that into a
    failed drain.  The folder is decided all the same, for BIRD's start."""
    folder = tmp_path / "announce"
    folder.mkdir()
    (tmp_path / "announce.map").write_text(HOOK_MAP)
    script = install_hook(tmp_path, "lbctl-announce")
    (folder / "10.200.0.99.conf").write_text("route 10.200.0.99/32 blackhole;\n")  # stale
    done = subprocess.run([str(script), str(folder), str(tmp_path / "none.ctl"),
                           str(tmp_path / "announce.map"), str(tmp_path / "drained"), "sync"],
                          capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "BIRD is not running; it offers what" in done.stderr
    assert sorted(p.name for p in folder.glob("*.conf")) == []  # nothing is up here


def test_status_reads_the_session_and_the_offered_vips_from_bird(bird):
    hook, _offered, _folder, socket = bird
    hook("event", "dns", "up")
    began = time.time()
    report = bgp_report(socket)
    assert report["error"] is None
    # No router answers: BIRD keeps trying, and says why it is not up.
    assert report["state"] in ("Down", "Idle", "Connect", "Active"), report
    assert [o["vip"] for o in report["offered"]] == ["10.200.0.11"]
    assert began - 5 <= report["offered"][0]["since"] <= began + 1
    now = report["offered"][0]["since"] + 30
    lines = format_bgp(bgp_status({**report, "since": now - 60}, "192.168.100.1"), now)
    assert lines[0] == f"  BGP to the router 192.168.100.1: {report['state']} for 60s"
    if report["last_error"]:
        assert lines[1] == f"    last error: {report['last_error']}"
    assert lines[-1] == "  offering 10.200.0.11 for 30s (but the session is down: the router " \
        "has none)"


def test_status_without_bird_says_so(tmp_path):
    report = bgp_report(str(tmp_path / "bird.ctl"))
    assert report["error"] == "BIRD is not running (no control socket)"
    assert format_bgp(bgp_status(report, "192.168.100.1"), 0) == [
        "  BGP to the router 192.168.100.1: unknown, BIRD is not running (no control socket)"]


def test_systemd_accepts_the_units_of_keepalived_and_bird(tmp_path):
    _cluster, layout, state = balancer_state(tmp_path)
    units = []
    for path, spec in state.files.items():
        # Every file where the units name it, so systemd finds their programs.
        real = Path(layout.real(path)) if not path.endswith(".service") else \
            tmp_path / "units" / Path(path).name
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text(spec.content)
        real.chmod(spec.mode)
        if path.endswith(".service"):
            units.append(str(real))
    assert len(units) == 2
    found = subprocess.run(["systemd-analyze", "verify", "--man=no", *units],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0 and found.stderr == "", found.stderr


@pytest.mark.parametrize("bfd", ["", "  bfd: {interval: 100ms}\n"])
def test_bird_accepts_the_lab_routers_config(tmp_path, bfd):
    from lbctl.lab.routed import render_router_bird

    cluster = load(tmp_path, ECMP.replace("  as: 65001\n", "  as: 65001\n" + bfd))
    conf = tmp_path / "router.conf"
    conf.write_text(render_router_bird(cluster, str(tmp_path / "bird.log")))
    assert "merge paths on limit 3;" in conf.read_text()
    assert conf.read_text().count("protocol bgp") == 3
    done = subprocess.run([BIRD, "-p", "-c", str(conf)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr + conf.read_text()


def test_a_bird_that_never_answers_holds_the_hook_for_a_bounded_time_only(tmp_path):
    """birdc waits for BIRD's greeting for ever; the hook bounds it, and
    birdc never holds the folder's lock, so the next quorum event and apply
    still run."""
    import socket as sockets

    short = Path(tempfile.mkdtemp(prefix="lbctl-mute-"))
    folder, path = short / "announce", short / "bird.ctl"
    folder.mkdir()
    (tmp_path / "announce.map").write_text(HOOK_MAP)
    script = install_hook(tmp_path, "lbctl-announce")
    mute = sockets.socket(sockets.AF_UNIX)
    mute.bind(str(path))
    mute.listen(8)  # accepts, and never says a word
    try:
        began = time.monotonic()
        done = subprocess.run([str(script), str(folder), str(path),
                               str(tmp_path / "announce.map"), str(tmp_path / "drained"), "sync"],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "LBCTL_BIRDC_SECONDS": "1"})
        assert time.monotonic() - began < 15
        assert done.returncode == 1 and "BIRD did not take its config" in done.stderr, done
        free = subprocess.run(["flock", "-n", str(folder), "true"], timeout=10)
        assert free.returncode == 0  # no birdc left holding the hook's lock
    finally:
        mute.close()
        shutil.rmtree(short)


def test_the_bird_adapter_runs_bird_as_its_own_user_and_reloads_and_stops_it():
    """Without systemd (the lab, containers) the adapter starts BIRD itself:
    BIRD drops to its user once its socket is open, writes the pid file made
    for it, reads its config again on reload, and stops."""
    import pwd

    from lbctl.adapters.bird import BirdDaemon
    from lbctl.adapters.systemd import Systemd
    from lbctl.render.bird import BIRD_USER

    root = tempfile.mkdtemp(prefix="lbctl-bird-user-", dir="/run")  # as the lab's: 0755 down
    os.chmod(root, 0o755)
    try:
        cluster = load(Path(root))
        layout = Layout(cluster.name, root)
        conf = Path(layout.real(layout.bird_conf))
        conf.parent.mkdir(parents=True)
        for folder in (conf.parent, conf.parent.parent):
            folder.chmod(0o755)
        conf.write_text(render_bird_conf(cluster, "lb1", "eth0", layout))
        daemon = BirdDaemon(layout, Systemd(runs=False))
        daemon.prepare()  # as apply does before the test: the folder of offers
        assert daemon.test(conf.read_text()) == []
        assert daemon.test("protocol bgp {") != []
        daemon.start()
        try:
            assert daemon.running()
            daemon._wait_answering(timeout=5)  # what a start under systemd waits for
            pid = daemon.process.pid()
            with open(f"/proc/{pid}/status") as fh:
                uid = next(line.split()[1] for line in fh if line.startswith("Uid:"))
            assert int(uid) == pwd.getpwnam(BIRD_USER).pw_uid
            Path(layout.real(layout.announce_dir), "10.200.0.10.conf").write_text(
                "route 10.200.0.10/32 blackhole;\n")
            daemon.reload()  # as BIRD's user, it reads the config and the offers again
            shown = subprocess.run([BIRDC, "-s", layout.real(layout.bird_socket), "show",
                                    "route"], capture_output=True, text=True, timeout=30).stdout
            assert "10.200.0.10/32" in shown, shown
        finally:
            daemon.stop()
        assert not daemon.running()
        assert not os.path.exists(layout.real(layout.announce_dir))
    finally:
        shutil.rmtree(root)


def test_the_hook_writes_routes_bird_can_read_as_its_own_user(bird):
    """keepalived runs its hooks with a umask of its own; BIRD, no longer
    root, must still read the routes the hook writes."""
    import stat

    hook, _offered, folder, _socket = bird
    old = os.umask(0o077)  # as keepalived leaves it
    try:
        hook("event", "dns", "up")
    finally:
        os.umask(old)
    routes = list(folder.glob("*.conf"))
    assert routes, list(folder.iterdir())
    assert all(stat.S_IMODE(r.stat().st_mode) & 0o004 for r in routes)  # others may read
