"""The real boot path: nodes that boot with systemd as PID 1 (systemd-nspawn
containers in the lab's namespaces), lbctl installed in /opt/lbctl as the
README says, and power cycles that leave the nodes' kernels empty.

The tests run in order on one small cluster and share its state.
"""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusters import write_cluster
from conftest import measured
from lbctl.config import load_cluster
from lbctl.errors import LabError
from lbctl.lab.systemd import BootedNodes
from lbctl.lab.topology import Lab

REPO = Path(__file__).resolve().parent.parent
VIP = "192.168.100.10"
BOOT = {
    "cluster": "boot",
    "balancers": {"lb1": {"address": "192.168.100.2", "interface": "eth0"}},
    "workers": {"pi1": {"address": "192.168.100.3"}, "pi2": {"address": "192.168.100.4"}},
    "services": {"web": {"vip": VIP, "port": 80, "scheduler": "rr",
                         "health": {"http": {"path": "/index.html"}, "interval": "1s",
                                    "timeout": "500ms", "retries": 1, "rise": 1}}},
}
KEEPALIVED_UNIT = "lbctl-boot-keepalived.service"
BOOTED = ("lb1", "pi1")
LBCTL = "/opt/lbctl/bin/lbctl"


def spec(top=None, **services_web):
    web = {k: v for k, v in {**BOOT["services"]["web"], **services_web}.items() if v is not None}
    return {**BOOT, **(top or {}), "services": {"web": web}}


@pytest.fixture(scope="module")
def booted(tmp_path_factory):
    files = tmp_path_factory.mktemp("boot")
    path = write_cluster(files / "boot.yaml", BOOT)
    lab = Lab(load_cluster(path), path, prefix="sd")
    # lb1 and pi1 boot with systemd; pi2, the worker that stays up, is a plain
    # lab node: a third emulated boot would cost a minute and show nothing new.
    lab.build(servers=["pi2"])
    nodes = None
    try:
        started = time.monotonic()
        nodes = BootedNodes(lab, BOOTED).setup()
        measured("systemd lab: two nodes booted", seconds=f"{time.monotonic() - started:.1f}")
        nodes.files = files
        # The balancer runs lbctl from /opt/lbctl, as installed by the README; its
        # boot units name that Python.  The workers' units run only ip and sysctl.
        install_lbctl(nodes, "lb1")
        yield nodes
    finally:
        if nodes is not None:
            nodes.shutdown()
        lab.teardown()


def install_lbctl(nodes, name, version=None):
    """The README's install, offline: a venv in /opt/lbctl, the wheel of this
    checkout (as `./dev.sh wheel` builds it) installed into it, and its
    libraries copied in from the checkout's venv, as pip would fetch them
    (lbctl refuses a boot unit whose Python imports from a folder another user
    could change, such as a checkout under /tmp).  `version` builds the wheel
    from a copy of the source under that version number: an upgrade."""
    node_root = Path(nodes.root_of(name))
    source = REPO
    if version is not None:
        source = node_root / "opt" / f"lbctl-src-{version}"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "*.egg-info", "__pycache__", "dist"))
        init = source / "lbctl" / "__init__.py"
        init.write_text(re.sub(r'__version__ = ".*"', f'__version__ = "{version}"',
                               init.read_text()))
    # Inside the node's own root: the node sees nothing of this machine's /run.
    wheels = node_root / "opt" / "lbctl-wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                            "--no-build-isolation", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("lbctl-*.whl")
    if version is None:
        for argv in (["/usr/bin/python3", "-m", "venv", "--without-pip", "/opt/lbctl"],
                     ["ln", "-sf", LBCTL, "/usr/local/sbin/lbctl"]):
            done = nodes.run(name, argv)
            assert done.returncode == 0, f"{name}: {argv}: {done.stdout}{done.stderr}"
        copy_libraries(Path(nodes.root_of(name)) / "opt/lbctl/lib" /
                       f"python3.{sys.version_info.minor}/site-packages")
    argv = [sys.executable, "-m", "pip", "--python", "/opt/lbctl/bin/python", "install", "-q",
            "--no-deps", "--no-index", "--upgrade", f"/opt/lbctl-wheels/{wheel.name}"]
    done = nodes.run(name, argv)
    assert done.returncode == 0, f"{name}: {argv}: {done.stdout}{done.stderr}"


def copy_libraries(site_packages):
    """lbctl's libraries, file by file from this venv, into another's site-packages."""
    from importlib.metadata import distribution

    for name in ("PyYAML", "Jinja2", "MarkupSafe", "prometheus_client"):
        dist = distribution(name)
        for relative in dist.files:
            if ".." in relative.parts:
                continue  # a script outside site-packages
            source = Path(dist.locate_file(relative))
            target = site_packages / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def lbctl(name):
    return [LBCTL] if name == "lb1" else [sys.executable, "-m", "lbctl"]


def apply(nodes, name, data, *extra):
    text = write_cluster(nodes.files / "current.yaml", data).read_text()
    if name not in BOOTED:
        return nodes.lab.sh(name, nodes.lab.lbctl_argv("apply", "-", *extra, node=name),
                            check=False, input=text)
    return nodes.run(name, [*lbctl(name), "apply", "-", *extra], input=text)


def plan_is_empty(nodes, name, data):
    text = (nodes.files / "current.yaml").read_text() if data is None else \
        write_cluster(nodes.files / "current.yaml", data).read_text()
    done = nodes.run(name, [*lbctl(name), "plan", "-", "--detailed-exitcode"], input=text)
    assert done.returncode in (0, 2), done.stdout + done.stderr
    return done.returncode == 0, done.stdout


def served(nodes, count=6):
    return [nodes.lab.curl(f"http://{VIP}/", timeout=3).stdout.strip() or "failed"
            for _ in range(count)]


def test_keepalived_is_started_reloaded_and_restarted_by_systemd(booted):
    for name in ("pi1", "pi2", "lb1"):
        done = apply(booted, name, BOOT)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
    assert booted.is_active("lb1", KEEPALIVED_UNIT) == "active"
    booted.lab.wait_for(lambda: set(served(booted)) == {"served by pi1", "served by pi2"},
             timeout=60, what="both workers serving")
    first = booted.main_pid("lb1", KEEPALIVED_UNIT)

    # A crash: systemd starts keepalived again (Restart=on-failure).
    booted.run("lb1", ["kill", "-9", str(first)])
    booted.lab.wait_for(lambda: booted.main_pid("lb1", KEEPALIVED_UNIT) not in (0, first)
             and booted.is_active("lb1", KEEPALIVED_UNIT) == "active", timeout=30,
             what="systemd to restart keepalived")
    second = booted.main_pid("lb1", KEEPALIVED_UNIT)
    booted.lab.wait_for(lambda: set(served(booted)) == {"served by pi1", "served by pi2"},
             timeout=60,
                        what="both workers serving after the restart")

    # An edit is a reload: the same keepalived process, the new table.
    done = apply(booted, "lb1", spec(scheduler="wrr"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "~ keepalived reload" in done.stdout
    assert booted.main_pid("lb1", KEEPALIVED_UNIT) == second
    table = booted.run("lb1", ["ipvsadm", "-Ln"]).stdout
    assert re.search(rf"TCP\s+{VIP}:80 wrr", table), table

    # A daemon-reload lost to an apply cut short: systemd has not loaded the
    # unit as it stands on disk.  The next apply, with nothing else to change,
    # tells systemd.
    def needs_daemon_reload():
        return booted.run("lb1", ["systemctl", "show", "--property=NeedDaemonReload", "--value",
                                  KEEPALIVED_UNIT]).stdout.strip()
    booted.run("lb1", ["touch", f"/etc/systemd/system/{KEEPALIVED_UNIT}"])
    assert needs_daemon_reload() == "yes"
    done = apply(booted, "lb1", spec(scheduler="wrr"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert needs_daemon_reload() == "no"


def test_a_worker_power_cycle_comes_back_from_its_boot_unit_alone(booted):
    started = time.monotonic()
    booted.power_cycle("pi1")
    measured("systemd lab: worker power cycle", seconds=f"{time.monotonic() - started:.1f}")
    lo = booted.run("pi1", ["ip", "-4", "-o", "address", "show", "dev", "lo"]).stdout
    assert f"inet {VIP}/32" in lo
    arp = booted.run("pi1", ["sysctl", "-n", "net.ipv4.conf.all.arp_ignore",
                             "net.ipv4.conf.all.arp_announce"]).stdout.split()
    assert arp == ["1", "2"]
    assert booted.is_active("pi1", "lbctl-boot-vips.service") == "active"
    assert booted.failed_units("pi1") == []
    assert plan_is_empty(booted, "pi1", None) == (True, "worker pi1 of cluster boot: no changes\n")
    # Back before it answers ARP for the VIP: the LAN still finds only the balancer.
    booted.lab.sh("client", ["ip", "neigh", "flush", "dev", "eth0"])
    assert booted.lab.vip_macs(VIP) == {booted.lab.mac("lb1")}
    # The balancer's check brings it back (rise 1), and it serves through the VIP.
    booted.lab.wait_for(lambda: "served by pi1" in served(booted), timeout=60,
                        what="pi1 serving again")


def test_a_balancer_upgraded_then_power_cycled_comes_back_from_its_units(booted):
    install_lbctl(booted, "lb1", version="0.2.0+lab")
    assert booted.run("lb1", [LBCTL, "--version"]).stdout.strip() == "lbctl 0.2.0+lab"
    started = time.monotonic()
    booted.power_off("lb1")
    # The client caches another MAC for the VIP, as after a board swap, and
    # keeps it however long the boot takes: the kernel forgets an entry
    # unused for gc_stale_time (a minute) once the host's caches hold
    # gc_thresh1 entries, and a client that has forgotten asks anyway.
    booted.lab.sh("client", ["sysctl", "-q", "-w", "net.ipv4.neigh.eth0.gc_stale_time=3600"])
    booted.lab.sh("client", ["ip", "neigh", "del", VIP, "dev", "eth0"], check=False)
    booted.lab.sh("client", ["ip", "neigh", "add", VIP, "lladdr", "02:00:00:00:00:99",
                             "dev", "eth0", "nud", "stale"])
    capture = booted.files / "lan-arp.txt"
    with open(capture, "w") as out:
        tcpdump = subprocess.Popen(["ip", "netns", "exec", booted.lab.lan, "tcpdump", "-i", "br0",
                                    "-n", "-e", "-l", "-tt", "arp"], stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        booted.lab.wire("lb1")
        booted.boot("lb1")
        measured("systemd lab: balancer power cycle", seconds=f"{time.monotonic() - started:.1f}")
        # keepalived's unit announced the VIP it put back: the client's cache
        # moved to lb1 before the client sent it anything.  Within 30 s: the
        # unit's start may come after the boot finished (a restart 5 s after
        # a failed one), and its announcement runs a Python of its own, which
        # the suite's other modules can slow to seconds on the emulated CPUs.
        booted.lab.wait_for(lambda: booted.lab.cached_mac(VIP) == booted.lab.mac("lb1"),
                            timeout=30, what="the client to learn the VIP's MAC from lb1's "
                            "announcement")
    except LabError as exc:
        journal = booted.run("lb1", ["journalctl", "-b", "-u", KEEPALIVED_UNIT, "--no-pager",
                                     "-o", "short-monotonic"]).stdout
        neighbours = booted.lab.sh("client", ["ip", "neigh", "show"]).stdout
        with open("/proc/net/stat/arp_cache") as stats:
            entries = int(stats.read().splitlines()[1].split()[0], 16)
        raise AssertionError(
            f"{exc}\n--- lb1 is {booted.lab.mac('lb1')}; the client's cache "
            f"(the host's ARP caches hold {entries} entries):\n{neighbours}"
            f"--- ARP on the LAN:\n{capture.read_text()}"
            f"--- lb1's {KEEPALIVED_UNIT} this boot:\n"
            + "\n".join(journal.splitlines()[-40:])) from None
    finally:
        tcpdump.terminate()
        tcpdump.wait()
    # It was lb1's announcement that moved it: a request for the VIP from the VIP.
    lb1 = booted.lab.mac("lb1")
    assert re.search(rf"^\S+ {lb1} > ff:ff:ff:ff:ff:ff, .*Request who-has {re.escape(VIP)} "
                     rf"tell {re.escape(VIP)},", capture.read_text(), re.M), capture.read_text()
    assert booted.is_active("lb1", KEEPALIVED_UNIT) == "active"
    assert booted.failed_units("lb1") == []
    eth0 = booted.run("lb1", ["ip", "-4", "-o", "address", "show", "dev", "eth0"]).stdout
    assert f"inet {VIP}/32" in eth0
    booted.lab.wait_for(lambda: set(served(booted)) == {"served by pi1", "served by pi2"},
             timeout=60,
                        what="both workers serving after the balancer's reboot")
    empty, shown = plan_is_empty(booted, "lb1", None)
    assert empty, shown


def test_a_single_balancer_run_by_lbctl_reapplies_its_saved_copy_at_boot(booted):
    # Without health checks lbctl programs IPVS itself; its boot unit runs
    # the upgraded lbctl on the copy of the file it saved.
    done = apply(booted, "lb1", spec(health=None))
    assert done.returncode == 0, done.stdout + done.stderr
    assert booted.is_active("lb1", KEEPALIVED_UNIT) in ("inactive", "unknown")
    unit = booted.run("lb1", ["systemctl", "cat", "lbctl-boot-balancer.service"]).stdout
    assert "ExecStart=/opt/lbctl/bin/python -I -m lbctl apply /etc/lbctl/boot.yaml --node lb1" in unit
    booted.power_cycle("lb1")
    assert booted.is_active("lb1", "lbctl-boot-balancer.service") == "active"
    assert booted.failed_units("lb1") == []
    table = booted.run("lb1", ["ipvsadm", "-Ln"]).stdout
    assert re.search(rf"TCP\s+{VIP}:80 rr", table), table
    booted.lab.wait_for(lambda: set(served(booted)) == {"served by pi1", "served by pi2"},
             timeout=60,
                        what="both workers serving from the netlink table")
    empty, shown = plan_is_empty(booted, "lb1", None)
    assert empty, shown


def test_the_exporter_unit_serves_metrics_and_goes_with_its_key(booted):
    # The unit runs the installed lbctl as a systemd dynamic user with only
    # CAP_NET_ADMIN: it must still read IPVS and lbctl's saved copy.
    unit = "lbctl-boot-exporter.service"
    done = apply(booted, "lb1", spec(top={"exporter": {"listen": "127.0.0.1:9588"}}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert booted.is_active("lb1", unit) == "active"

    def scraped():
        from prometheus_client.parser import text_string_to_metric_families

        got = booted.run("lb1", ["curl", "-sS", "--max-time", "10",
                                 "http://127.0.0.1:9588/metrics"])
        if got.returncode != 0:
            return None
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(got.stdout) for s in family.samples}

    def weights(samples):
        return {worker: samples.get(("lbctl_worker_weight_kernel", frozenset(
            {"cluster": "boot", "service": "web", "worker": worker}.items())))
            for worker in ("pi1", "pi2")}

    booted.lab.wait_for(lambda: (got := scraped()) is not None
                        and weights(got) == {"pi1": 1, "pi2": 1},
                        timeout=60, what="the exporter serving both workers' weights")
    samples = scraped()
    drift = samples.get(("lbctl_drift_changes", frozenset({("cluster", "boot")})))
    if drift != 0:  # what the exporter's user sees that root does not
        as_exporter = booted.run("lb1", [
            "systemd-run", "--wait", "--pipe", "--quiet", "-p", "DynamicUser=yes",
            "-p", "AmbientCapabilities=CAP_NET_ADMIN", "-p", "CapabilityBoundingSet=CAP_NET_ADMIN",
            "/opt/lbctl/bin/python", "-I", "-m", "lbctl", "plan", "/etc/lbctl/boot.yaml",
            "--node", "lb1"])
        pytest.fail(f"drift {drift} as the exporter sees it:\n{as_exporter.stdout}"
                    f"{as_exporter.stderr}")
    assert samples.get(("lbctl_last_apply_success", frozenset({("cluster", "boot")}))) == 1
    owner = booted.run("lb1", ["ps", "-o", "user=", "-p",
                               str(booted.main_pid("lb1", unit))]).stdout.strip()
    assert owner not in ("", "root"), owner

    done = apply(booted, "lb1", spec())
    assert done.returncode == 0, done.stdout + done.stderr
    assert booted.is_active("lb1", unit) in ("inactive", "unknown")
    assert not (Path(booted.root_of("lb1")) / "etc/systemd/system" / unit).exists()
