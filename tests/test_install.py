"""The README's install as a node runs it: the wheel into a fresh venv, its
libraries fetched from the package index, and lbctl working from there with
no checkout in sight.

What this catches: a dependency the code imports but pyproject.toml does not
declare, a template or unit the wheel leaves out, and a README whose install
line names another version's wheel.  It needs the package index (as the
README's line does) and root, for the worker's apply in a namespace of its own.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import lbctl

REPO = Path(__file__).resolve().parent.parent
WORKER = "192.168.100.3"  # pi1 in examples/pi-single.yaml
VIP = "192.168.100.10"


def readme_install_steps():
    """The commands of the README's one-line install, split at `&&`."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Install on a node"):]
    line = re.search(r"^```sh\n(sudo apt install .*)\n```", section, re.M)[1]
    return [shlex.split(step) for step in line.split(" && ")]


def run(argv, **kw):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv made and filled by the README's own commands, /opt/lbctl moved
    under a temporary folder; apt's step is left to the machine."""
    tmp = tmp_path_factory.mktemp("install")
    # Built from a copy: setuptools builds in the source tree and would pack
    # whatever an earlier build left in build/, hiding a file the wheel now lacks.
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp), str(source)])
    (wheel,) = tmp.glob("lbctl-*.whl")
    steps = readme_install_steps()
    assert steps[0][:3] == ["sudo", "apt", "install"], steps[0]
    pip_install = next(s for s in steps if s[1:3] == ["/opt/lbctl/bin/pip", "install"])
    assert pip_install[-1] == f"./{wheel.name}", \
        f"the README installs {pip_install[-1]}, but this checkout builds {wheel.name}"
    venv = tmp / "opt" / "lbctl"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for step in steps[1:]:
        if step[0] == "sudo":
            step = step[1:]
        if step[0] == "ln":
            continue  # the PATH link: /usr/local/sbin is the machine's, not the test's
        run([a.replace("/opt/lbctl", str(venv)) for a in step], cwd=tmp, env=env)
    return venv, env, tmp


def lbctl_cli(installed, *args, netns=None, check=True):
    venv, env, tmp = installed
    argv = [str(venv / "bin" / "lbctl"), *args]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp, env=env)
    if check:
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done


def test_the_installed_lbctl_runs_from_its_venv_not_the_checkout(installed):
    venv, env, tmp = installed
    assert lbctl_cli(installed, "--version").stdout.strip() == f"lbctl {lbctl.__version__}"
    where = run([str(venv / "bin" / "python"), "-c", "import lbctl; print(lbctl.__file__)"],
                cwd=tmp, env=env).stdout.strip()
    assert where.startswith(str(venv)), where
    # Every declared dependency is there and consistent, doctor's scapy included.
    run([str(venv / "bin" / "python"), "-m", "pip", "check"], env=env)
    run([str(venv / "bin" / "python"), "-c", "import lbctl.doctor.wire, scapy.all"], env=env)


def test_the_installed_lbctl_validates_and_applies_a_worker(installed, tmp_path):
    """A worker's whole apply, in a namespace of its own: its VIP on lo, the ARP
    sysctls, and the files that bring them back at boot, all from the wheel's
    templates; then plan finds nothing left to do."""
    if os.geteuid() != 0:
        pytest.fail("needs root, for a network namespace (CI and ./dev.sh test run as root)")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text((REPO / "examples" / "pi-single.yaml").read_text())
    root = tmp_path / "root"
    root.mkdir()
    assert ": valid: cluster pi-web" in lbctl_cli(installed, "validate", str(cluster)).stdout
    netns = f"lbctl-install-{uuid.uuid4().hex[:8]}"
    run(["ip", "netns", "add", netns])
    try:
        for argv in (["link", "set", "lo", "up"],
                     ["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
                     ["address", "add", f"{WORKER}/24", "dev", "eth0"],
                     ["link", "set", "eth0", "up"]):
            run(["ip", "-n", netns, *argv])
        applied = lbctl_cli(installed, "apply", str(cluster), "--root", str(root),
                            netns=netns)
        assert "pi1" in applied.stdout, applied.stdout
        lo = run(["ip", "-n", netns, "-4", "-o", "address", "show", "dev", "lo"]).stdout
        assert f"{VIP}/32" in lo, lo
        for key, value in (("arp_ignore", "1"), ("arp_announce", "2")):
            got = run(["ip", "netns", "exec", netns, "sysctl", "-n",
                       f"net.ipv4.conf.all.{key}"]).stdout.strip()
            assert got == value, f"{key} = {got}"
        assert list((root / "etc" / "sysctl.d").glob("*lbctl*.conf"))
        assert list((root / "etc" / "systemd" / "system").glob("lbctl*.service"))
        plan = lbctl_cli(installed, "plan", str(cluster), "--root", str(root),
                         "--detailed-exitcode", netns=netns, check=False)
        assert plan.returncode == 0, plan.stdout + plan.stderr
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
