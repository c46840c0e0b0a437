"""lbctl on a balancer without root's powers: what it may read it reports,
what needs root it asks for, and it says the kernel has no IPVS only when
it has no ip_vs module, not because it was not allowed to load it.

The user here is root with every capability dropped (what the kernel checks
for IPVS and modprobe), in a network namespace of its own that holds lb1's
address, on this host, whose kernel has not loaded ip_vs.  The lab's kernel
has, and test_hardening.py asks the same of it there."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lbctl.adapters.ipvs import CAP_SYS_MODULE, holds_capability

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pi-pair.yaml"
NO_CAPABILITIES = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]


@pytest.fixture(scope="module")
def lb1():
    """A network namespace with lb1's address: run(*lbctl_args) runs lbctl there."""
    assert not os.path.exists("/sys/module/ip_vs"), \
        "ip_vs is loaded on this host: these tests need a kernel that has not loaded it"
    netns = f"lbctl-noroot-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        for step in (["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
                     ["link", "set", "eth0", "up"],
                     ["address", "add", "192.168.100.2/24", "dev", "eth0"]):
            subprocess.run(["ip", "-n", netns, *step], check=True)

        def run(*args):
            return subprocess.run(["ip", "netns", "exec", netns, *NO_CAPABILITIES,
                                   sys.executable, "-m", "lbctl", *args],
                                  capture_output=True, text=True, timeout=60)
        yield run
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=True)


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def test_plan_without_root_plans_what_a_node_without_ip_vs_needs(lb1, tmp_path):
    planned = lb1("plan", str(EXAMPLE), "--node", "lb1", "--root", str(tmp_path))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert planned.stdout.startswith("balancer lb1 of cluster pi-web:\n"), planned.stdout
    assert "  + keepalived start\n" in planned.stdout
    assert "IPVS" not in planned.stdout + planned.stderr
    # Reading changed nothing: no module loaded, nothing written.
    assert not os.path.exists("/sys/module/ip_vs")
    assert files_under(tmp_path) == []


def test_apply_without_root_blames_the_kernel_only_when_it_has_no_ip_vs(lb1, tmp_path):
    # This host's kernel has no ip_vs module: sudo would not help.
    assert subprocess.run(["modprobe", "-n", "-q", "ip_vs"]).returncode != 0
    applied = lb1("apply", str(EXAMPLE), "--node", "lb1", "--root", str(tmp_path))
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert applied.stderr.startswith("lbctl: this kernel has no IPVS"), applied.stderr
    assert [f for f in files_under(tmp_path) if not f.startswith("run/lbctl/")] == []


def test_without_the_capability_a_module_there_is_to_load_asks_for_root(monkeypatch):
    from lbctl.adapters import ipvs

    class NotLoaded:
        def family(self, name):
            raise FileNotFoundError(name)

    ran = []

    def modprobe(argv, **_kwargs):
        ran.append(argv)
        dry_run = "-n" in argv  # modprobe -n finds the module without loading it
        return subprocess.CompletedProcess(argv, 0 if dry_run else 1, "", "")
    monkeypatch.setattr(ipvs, "run", modprobe)
    monkeypatch.setattr(ipvs, "holds_capability", lambda number: False)
    with pytest.raises(ipvs.KernelError, match="the ip_vs module is not loaded, and loading "
                                               "it needs root: run it with sudo"):
        ipvs._ipvs_family(NotLoaded())
    assert ran == [[ipvs.MODPROBE, "-q", "ip_vs"], [ipvs.MODPROBE, "-n", "-q", "ip_vs"]]
    # With the capability, a failed load is the kernel's.
    monkeypatch.setattr(ipvs, "holds_capability", lambda number: True)
    with pytest.raises(ipvs.KernelError, match="this kernel has no IPVS"):
        ipvs._ipvs_family(NotLoaded())


def test_a_capability_is_read_from_the_process_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nCapEff:\t0000000000010000\n")
    assert holds_capability(CAP_SYS_MODULE, str(status))
    status.write_text("Name:\tpython3\nCapEff:\t000001ffffffefff\n")
    assert not holds_capability(12, str(status))
