"""The lab as a pytest fixture: real IPVS, real servers, real clients.

This suite needs a kernel with IPVS.  `python -m lbctl.lab.vm -- pytest
netns-tests` provides one (here, or in a VM where the host kernel lacks it);
run directly on a kernel without IPVS, every test fails rather than skips.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clusters import BASE, TOPOLOGY, WEB_VIP, write_cluster  # noqa: E402
from lbctl.config import load_cluster  # noqa: E402
from lbctl.lab.topology import Lab  # noqa: E402
from lbctl.layout import DRAIN_DIR  # noqa: E402


def pytest_sessionstart(session):
    subprocess.run(["modprobe", "-q", "ip_vs"], check=False)
    if not os.path.exists("/proc/net/ip_vs"):
        raise pytest.UsageError(
            "netns-tests need a kernel with IPVS; run them as "
            "`python -m lbctl.lab.vm -- python -m pytest netns-tests`")
    if os.geteuid() != 0:
        raise pytest.UsageError("netns-tests need root to create network namespaces")
    CPU_AT_START.extend(_cpu_ticks())


CPU_AT_START = []  # (busy, total) jiffies of every CPU when the run began


def _cpu_ticks():
    """(busy, total) jiffies summed over every CPU, from /proc/stat."""
    with open("/proc/stat") as fh:
        # user nice system idle iowait irq softirq steal; guest and guest_nice
        # after them are counted in user and nice already.
        fields = [int(v) for v in fh.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle and iowait
    return [sum(fields) - idle, sum(fields)]


# Under pytest-xdist the controller reports; a worker's stderr reaches the
# same terminal, so workers print nothing of their own.
ON_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
MEASUREMENTS = []  # what the tests measured, printed at the end of every run
# Steady loads and captures started by tests; one a failed test left running is stopped.
LOADS = []


@pytest.fixture(autouse=True)
def no_stray_load():
    """A test that fails before it stops its load must not leave it running into
    the next test's traffic counts and connection tables."""
    yield
    for load in LOADS:
        if load.poll() is None:
            load.kill()
            load.wait()
    LOADS.clear()


def measured(title, **figures):
    line = f"[{title}] " + "  ".join(f"{k}={v}" for k, v in figures.items())
    MEASUREMENTS.append(line)
    print("\n" + line)


_MODULES_STARTED = set()


def pytest_runtest_logstart(nodeid, location):
    """Before each module's first test, the memory left: in the lab VM
    everything the suite writes lives in RAM, and a VM short of it crawls
    without failing.  (Printed here, before setup, whose output is captured.)"""
    module = nodeid.split("::")[0]
    if module in _MODULES_STARTED or ON_WORKER:
        return
    _MODULES_STARTED.add(module)
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        left = int(info["MemAvailable"].split()[0]) // 1024
        shmem = int(info["Shmem"].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        return
    sys.stderr.write(f"\n[{module}] memory available {left} MB, in tmpfs {shmem} MB\n")
    sys.stderr.flush()


# The slowest modules, slowest first ("seconds per module" at the end of a
# run).  The suite runs on three pytest-xdist workers, each taking the next
# module when it is almost done with one: started first, the long modules
# do not leave one worker running alone at the end.
SLOWEST_FIRST = ["test_fleet_matrix.py", "test_cluster_ssh.py", "test_bench.py",
                 "test_keepalived.py", "test_systemd_boot.py", "test_operations.py",
                 "test_ecmp.py", "test_doctor.py", "test_convergence.py"]


def pytest_collection_modifyitems(items):
    """Modules in SLOWEST_FIRST order, then the rest by name; tests keep their
    order inside a module (several modules build on the test before)."""
    def rank(item):
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)
    items.sort(key=rank)  # stable: the rest keep collection order


def pytest_sessionfinish(session):
    """On an xdist worker: hand what the tests measured to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["measurements"] = list(MEASUREMENTS)


def pytest_testnodedown(node, error):
    """On the xdist controller: a worker's measurements, printed with the rest."""
    MEASUREMENTS.extend(getattr(node, "workeroutput", {}).get("measurements", ()))


MODULE_SECONDS = {}  # module: seconds in its tests' setup, call and teardown


def pytest_runtest_logreport(report):
    """A failure's traceback at once, not only in the summary at the end: a run
    stopped by CI's time limit never reaches that summary."""
    module = report.nodeid.split("::")[0]
    MODULE_SECONDS[module] = MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.failed and not ON_WORKER:
        tail = "\n".join(report.longreprtext.splitlines()[-60:])
        sys.stderr.write(f"\n--- {report.nodeid} ({report.when}) failed:\n{tail}\n---\n")
        sys.stderr.flush()


def pytest_terminal_summary(terminalreporter):
    """What the tests measured, then each module's time: the suite has a time
    budget, and the next slow module should show."""
    if MODULE_SECONDS:
        terminalreporter.section("seconds per module")
        for module, seconds in sorted(MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:7.1f}  {module}")
        terminalreporter.write_line(f"{sum(MODULE_SECONDS.values()):7.1f}  in all")
    if CPU_AT_START and not ON_WORKER:
        # How much of the CPUs the run used: the room left for more workers.
        busy, total = (now - then for now, then in zip(_cpu_ticks(), CPU_AT_START))
        terminalreporter.write_line(f"CPUs busy {100 * busy / max(total, 1):.0f}% of the run "
                                    f"({os.cpu_count()} CPUs)")
    if MEASUREMENTS:
        terminalreporter.section("measured in the lab")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


class ClusterLab(Lab):
    """The lab plus the helpers the tests share."""

    def __init__(self, topology_file, workdir, prefix="lab"):
        super().__init__(load_cluster(topology_file), topology_file, prefix)
        self.files = workdir

    def write(self, name, spec):
        return write_cluster(self.files / f"{name}.yaml", spec)

    def reset(self, spec=BASE, name="base"):
        """Back to a known cluster on every node, draining nothing."""
        path = self.write(name, spec)
        # No worker stays drained from an earlier test (lbctl drain's record).
        for node in self.nodes.values():
            drained = Path(node.root, DRAIN_DIR.lstrip("/"))
            for record in drained.glob("*.json") if drained.is_dir() else ():
                record.unlink()
        # A balancer the file leaves out stops its keepalived, which takes the
        # VIPs and services with it; lbctl does not manage nodes outside the file.
        for node in set(self.cluster.balancers) - set(spec["balancers"]):
            self.kill_keepalived(node, signal.SIGTERM)
        for node, result in self.apply_all(path, extra=("--force",)).items():
            assert result.returncode == 0, f"{node}: {result.stdout}{result.stderr}"
        return path

    def start_load(self, interval=0.05, timeout=5, vip=WEB_VIP):
        """A request every `interval` until stop_load(), each given `timeout` s."""
        load = self.traffic("load", vip, "--seconds", 900, "--interval", interval,
                            "--timeout", timeout)
        LOADS.append(load)
        time.sleep(1)
        return load

    def start_capture(self):
        """tcpdump on the LAN bridge: the client's web traffic, ARP and VRRP, so a
        failed request can be told apart (a reset, and from whose MAC)."""
        path = os.path.join(self.workdir, "capture.txt")
        out = open(path, "w")
        proc = subprocess.Popen(["ip", "netns", "exec", self.lan, "tcpdump", "-i", "br0", "-n",
                                 "-e", "-tt", "-l", "-s", "128",
                                 f"arp or ip proto 112 or (tcp port 80 and host "
                                 f"{self.nodes['client'].address})"],
                                stdout=out, stderr=subprocess.DEVNULL)
        out.close()
        LOADS.append(proc)  # a test that fails first leaves it to no_stray_load
        time.sleep(1)
        return proc, path

    @staticmethod
    def stop_capture(capture, failed, before=8.0, after=2.0):
        """Stop the capture; its ARP, VRRP and reset lines near each failed load
        record, and every packet within 50 ms of one."""
        proc, path = capture
        proc.terminate()
        proc.wait()
        lines = []
        with open(path) as fh:
            for line in fh:
                try:
                    when = float(line.split()[0])
                except (ValueError, IndexError):
                    continue
                for start, end, *_ in failed:
                    near = start - 0.05 < when < end + 0.05
                    if near or (start - before < when < end + after and
                                ("VRRP" in line or "ARP" in line or "[R" in line)):
                        lines.append(line.rstrip())
                        break
        return "\n".join(lines[-200:])

    def split_by_a_move(self, capture, failed, balancers=("lb1", "lb2")):
        """The `failed` load records whose handshake the VIP's move between
        `balancers` cut in two, by the capture (lbctl.lab.capture)."""
        from lbctl.lab.capture import split_by_a_move

        with open(capture[1]) as fh:
            return split_by_a_move(fh, failed, self.nodes["client"].address,
                                   {self.mac(node) for node in balancers})

    def stop_load(self, load):
        """The load's records, (start, end, ok, body) each, once it has covered the test."""
        time.sleep(1)
        assert load.poll() is None, "the load must cover the whole test"
        load.send_signal(signal.SIGINT)
        return self.finish(load)

    def ipvs_rules(self, node="lb1"):
        out = self.sh(node, ["ipvsadm", "-S", "-n"]).stdout
        return sorted(line for line in out.splitlines() if line.strip())

    def ask_web(self, count, vip="192.168.100.10"):
        return self.ask(f"http://{vip}/", count)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("clusters")
    topology = write_cluster(workdir / "topology.yaml", TOPOLOGY)
    # Under pytest-xdist each worker has a session lab of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    the_lab = ClusterLab(topology, workdir, prefix=f"lab{worker}")
    the_lab.build()
    try:
        yield the_lab
    finally:
        the_lab.teardown()


@pytest.fixture
def base(lab):
    """The base cluster applied everywhere; returns its file."""
    return lab.reset()
