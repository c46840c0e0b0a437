"""The lab as a pytest fixture: real IPVS, real servers, real clients.

This suite needs a kernel with IPVS.  `python -m lbctl.lab.vm -- pytest
netns-tests` provides one (here, or in a VM where the host kernel lacks it);
run directly on a kernel without IPVS, every test fails rather than skips.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clusters import BASE, TOPOLOGY, write_cluster  # noqa: E402
from lbctl.config import load_cluster  # noqa: E402
from lbctl.lab.topology import Lab  # noqa: E402


def pytest_sessionstart(session):
    subprocess.run(["modprobe", "-q", "ip_vs"], check=False)
    if not os.path.exists("/proc/net/ip_vs"):
        raise pytest.UsageError(
            "netns-tests need a kernel with IPVS; run them as "
            "`python -m lbctl.lab.vm -- python -m pytest netns-tests`")
    if os.geteuid() != 0:
        raise pytest.UsageError("netns-tests need root to create network namespaces")


MEASUREMENTS = []  # what the tests measured, printed at the end of every run


def measured(title, **figures):
    line = f"[{title}] " + "  ".join(f"{k}={v}" for k, v in figures.items())
    MEASUREMENTS.append(line)
    print("\n" + line)


def pytest_terminal_summary(terminalreporter):
    if MEASUREMENTS:
        terminalreporter.section("measured in the lab")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


class ClusterLab(Lab):
    """The lab plus the helpers the tests share."""

    def __init__(self, topology_file, workdir):
        super().__init__(load_cluster(topology_file), topology_file)
        self.files = workdir

    def write(self, name, spec):
        return write_cluster(self.files / f"{name}.yaml", spec)

    def reset(self, spec=BASE, name="base"):
        """Back to a known cluster on every node, draining nothing."""
        path = self.write(name, spec)
        # A balancer the file leaves out stops its keepalived, which takes the
        # VIPs and services with it; lbctl does not manage nodes outside the file.
        for node in set(self.cluster.balancers) - set(spec["balancers"]):
            self.kill_keepalived(node, signal.SIGTERM)
        for node, result in self.apply_all(path, extra=("--force",)).items():
            assert result.returncode == 0, f"{node}: {result.stdout}{result.stderr}"
        return path

    def ipvs_rules(self, node="lb1"):
        out = self.sh(node, ["ipvsadm-save", "-n"]).stdout
        return sorted(line for line in out.splitlines() if line.strip())

    def ask_web(self, count, vip="192.168.100.10"):
        return [self.curl(f"http://{vip}/").stdout.strip() or "failed" for _ in range(count)]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("clusters")
    topology = write_cluster(workdir / "topology.yaml", TOPOLOGY)
    the_lab = ClusterLab(topology, workdir)
    the_lab.build()
    try:
        yield the_lab
    finally:
        the_lab.teardown()


@pytest.fixture
def base(lab):
    """The base cluster applied everywhere; returns its file."""
    return lab.reset()
