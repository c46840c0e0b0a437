"""install --all and uninstall --all (commands/cluster_install.py).

The program each node runs (remote/node_install.py) runs here for real:
python3 with its text, a venv made and filled by pip from the wheels in the
payload the driver builds, under a root of its own per node ($LBCTL_ROOT,
as a lab node has).  Only ssh itself is left out: run_program_on shares its
ssh command line with every --all command, and the netns suite drives
those through real sshd.  It needs the package index once, for `pip
download` of the dependencies' wheels, as tests/test_install.py does.
"""

import io
import re
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import lbctl
from helpers import PI_ECMP, PI_SINGLE, cluster_from
from lbctl.commands import cluster_install
from lbctl.remote.ssh import Outcome, program_argv, Target

PAIR = PI_SINGLE.replace("  lb1: {address: 192.168.100.2, interface: eth0}\n",
                         "  lb1: {address: 192.168.100.2, interface: eth0}\n"
                         "  lb2: {address: 192.168.100.5, interface: eth0}\n")


def test_each_role_gets_the_packages_its_mode_needs():
    single, pair, ecmp = cluster_from(PI_SINGLE), cluster_from(PAIR), cluster_from(PI_ECMP)
    assert cluster_install.packages_for(single, "worker") == ["python3-venv"]
    assert cluster_install.packages_for(single, "balancer") == ["python3-venv", "ipvsadm"]
    assert cluster_install.packages_for(pair, "balancer") == [
        "python3-venv", "ipvsadm", "keepalived", "nftables"]
    assert cluster_install.packages_for(ecmp, "balancer") == [
        "python3-venv", "ipvsadm", "keepalived", "bird2"]
    assert cluster_install.packages_for(ecmp, "worker") == ["python3-venv"]


def test_the_node_program_travels_as_arguments_never_through_a_shell_of_its_own():
    """ssh hands the node one command line: every word of it quoted, the
    program's text included, and sudo only where the file asks for it."""
    import shlex

    cluster = cluster_from(PI_SINGLE)
    target = Target("pi1", "worker", "192.168.100.3", sudo=True)
    argv = program_argv(target, cluster_install.node_program(cluster, target, "install"))
    command = argv[-1]
    assert command.startswith('if [ "$(id -u)" = 0 ]; then exec python3 -I -c ')
    inner = command.split("; then exec ", 1)[1].split("; else exec sudo -n ")[0]
    words = shlex.split(inner)
    assert words[:3] == ["python3", "-I", "-c"]
    assert words[3] == Path(cluster_install.node_install.__file__).read_text()
    assert words[4:] == ["install", "--venv", "/opt/lbctl", "--link", "/usr/local/sbin/lbctl",
                         "--packages", "python3-venv"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """This checkout's wheel, built as install --all builds it, and its
    dependencies' wheels fetched once: an offline node's --wheels."""
    tmp = tmp_path_factory.mktemp("wheels")
    with cluster_install._wheel(None) as built:
        wheel = tmp / os.path.basename(built)
        wheel.write_bytes(Path(built).read_bytes())
    deps = tmp / "deps"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(deps),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (deps / wheel.name).unlink()  # pip download keeps the wheel asked for too
    return wheel, deps


def nodes_here(monkeypatch, tmp_path):
    """Each node's program run on this machine, as root, below its own root."""
    ran = []

    def run_program_on(target, program, payload=b"", ssh_config=None, timeout=600):
        root = tmp_path / target.node
        root.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        # A strict umask, as sudo passes on a login's 077: what install makes
        # must still be every user's to read.
        done = subprocess.run(program, input=payload, capture_output=True, timeout=timeout,
                              env=env | {"LBCTL_ROOT": str(root)},
                              preexec_fn=lambda: os.umask(0o077))
        ran.append((target.node, program[4]))
        return Outcome(target, done.returncode, done.stdout.decode(), done.stderr.decode())
    monkeypatch.setattr(cluster_install, "run_program_on", run_program_on)
    return ran


def fleet(tmp_path, command, **flags):
    path = tmp_path / "cluster.yaml"
    path.write_text(PI_SINGLE.replace("  pi2: {address: 192.168.100.4}\n", "")
                    .replace("  pi3: {address: 192.168.100.6, weight: 2}\n", "")
                    .replace("workers: [pi1, pi2]", "workers: [pi1]"))
    out = io.StringIO()
    args = SimpleNamespace(**({"command": command, "file": str(path), "node": None,
                               "ssh_config": None, "wheel": None, "wheels": None} | flags))
    return cluster_install.run(args, out), out.getvalue()


def files_below(root):
    """Every file and link under a node's root (folders left out)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() or p.is_symlink())


def test_install_twice_then_uninstall_leaves_no_file_of_lbctls(monkeypatch, tmp_path, wheels):
    if os.geteuid() != 0:
        pytest.fail("needs root, as install on a node does (CI and ./dev.sh test run as root)")
    wheel, deps = wheels
    ran = nodes_here(monkeypatch, tmp_path / "nodes")
    (tmp_path / "nodes").mkdir()
    code, text = fleet(tmp_path, "install", wheel=str(wheel), wheels=str(deps))
    assert code == 0, text
    assert "== lb1 (balancer, 192.168.100.2)" in text and ": changed\n" in text, text
    assert "venv /opt/lbctl: created" in text and f"lbctl {lbctl.__version__}: installed" in text
    assert text.endswith("installed on 2 of 2 node(s); changed: lb1, pi1\n"), text
    for node in ("lb1", "pi1"):
        link = tmp_path / "nodes" / node / "usr/local/sbin/lbctl"
        done = subprocess.run([str(link), "--version"], capture_output=True, text=True)
        assert done.stdout == f"lbctl {lbctl.__version__}\n", done.stderr
    # The completion scripts and the man page, from the installed lbctl's
    # parser, where bash-completion, zsh and man look, readable by all.
    assert text.count("completion and man page: written") == 2, text
    help_files = {"usr/local/share/bash-completion/completions/lbctl": ["completion", "bash"],
                  "usr/local/share/zsh/site-functions/_lbctl": ["completion", "zsh"],
                  "usr/local/share/man/man8/lbctl.8": ["manpage"]}
    for path, argv in help_files.items():
        made = tmp_path / "nodes" / "pi1" / path
        expected = subprocess.run([sys.executable, "-m", "lbctl", *argv], capture_output=True,
                                  text=True, check=True).stdout
        assert made.read_text() == expected and made.stat().st_mode & 0o777 == 0o644, path
        assert made.parent.stat().st_mode & 0o777 == 0o755, path
    # Again: the same build is there, and nothing changes.
    code, text = fleet(tmp_path, "install", wheel=str(wheel), wheels=str(deps))
    assert code == 0, text
    assert f"lbctl {lbctl.__version__}: installed already" in text
    assert text.count("completion and man page: in place") == 2, text
    assert text.endswith("installed on 2 of 2 node(s); nothing to change: lb1, pi1\n"), text
    # Compiled ahead, but for scapy, which only root's doctor imports.
    site = next((tmp_path / "nodes" / "pi1" / "opt/lbctl/lib").glob("python3*/site-packages"))
    assert list((site / "lbctl").glob("__pycache__/cli.*.pyc"))
    assert list((site / "yaml").glob("__pycache__/*.pyc"))
    assert not list((site / "scapy").rglob("*.pyc"))
    # No copy of pip in the venv: the system's wheel runs pip for it.
    assert not list((tmp_path / "nodes" / "lb1" / "opt/lbctl").rglob("pip")), \
        "the venv holds a copy of pip"
    # A venv whose Python went with a distribution upgrade is made again.
    # (Meanwhile pi1's bash completion went, and an administrator put a zsh
    # completion of their own where lbctl's was: it stays theirs.)
    python = tmp_path / "nodes" / "pi1" / "opt/lbctl/bin/python"
    python.unlink()
    python.symlink_to("/usr/bin/python3.0")
    (tmp_path / "nodes" / "pi1" / "usr/local/share/bash-completion/completions/lbctl").unlink()
    theirs = tmp_path / "nodes" / "pi1" / "usr/local/share/zsh/site-functions/_lbctl"
    theirs.write_text("#compdef lbctl\n# the administrator's own\n")
    linked = tmp_path / "nodes" / "pi1" / "usr/local/share/man/man8/lbctl.8"
    linked.unlink()
    linked.symlink_to("/nowhere/lbctl.8")  # not a file: followed nowhere, left alone
    code, text = fleet(tmp_path, "install", wheel=str(wheel), wheels=str(deps))
    assert code == 0, text
    assert "venv /opt/lbctl: made again (its Python is gone)" in text, text
    assert ("completion and man page: written; /usr/local/share/zsh/site-functions/_lbctl "
            "is not lbctl's: left as it is; /usr/local/share/man/man8/lbctl.8 is not lbctl's: "
            "left as it is") in text, text
    assert os.readlink(linked) == "/nowhere/lbctl.8"
    assert theirs.read_text() == "#compdef lbctl\n# the administrator's own\n"
    assert (tmp_path / "nodes" / "pi1" / "usr/local/share/bash-completion/completions/lbctl"
            ).read_text().startswith("# bash completion for lbctl")
    assert text.endswith("installed on 2 of 2 node(s); changed: pi1; nothing to change: lb1\n"), \
        text
    # One whose Python was upgraded under it (3.11 to 3.13): it runs, but
    # reads none of the site-packages the old one filled.
    cfg = tmp_path / "nodes" / "lb1" / "opt/lbctl/pyvenv.cfg"
    cfg.write_text(re.sub(r"(?m)^version = .*$", "version = 3.0.1", cfg.read_text()))
    code, text = fleet(tmp_path, "install", wheel=str(wheel), wheels=str(deps))
    assert code == 0, text
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"venv /opt/lbctl: made again (Python 3.0 made it; this is Python {this})" in text, \
        text
    assert "3.0.1" not in cfg.read_text()
    # One without its pyvenv.cfg: its python is the system's, whose pip
    # would install into /usr.
    cfg.unlink()
    code, text = fleet(tmp_path, "install", wheel=str(wheel), wheels=str(deps))
    assert code == 0, text
    assert "venv /opt/lbctl: made again (it has no pyvenv.cfg)" in text, text
    assert cfg.is_file()
    done = subprocess.run([str(tmp_path / "nodes" / "lb1" / "usr/local/sbin/lbctl"),
                           "--version"], capture_output=True, text=True)
    assert done.stdout == f"lbctl {lbctl.__version__}\n", done.stderr
    # Not while lbctl still holds a cluster on the node.
    records = tmp_path / "nodes" / "lb1" / "var/lib/lbctl"
    records.mkdir(parents=True)
    (records / "pi-web.json").write_text("{}\n")
    code, text = fleet(tmp_path, "uninstall")
    assert code == 1
    assert "lbctl still holds cluster pi-web here: run `lbctl apply FILE --remove --all` " \
           "first" in text, text
    assert text.endswith("taken off 1 of 2 node(s); changed: pi1; FAILED: lb1\n"), text
    assert "completion and man page: removed" in text, text
    assert files_below(tmp_path / "nodes" / "pi1") == [  # the administrator's, kept
        "usr/local/share/man/man8/lbctl.8", "usr/local/share/zsh/site-functions/_lbctl"]
    theirs.unlink()
    linked.unlink()
    assert (tmp_path / "nodes" / "lb1" / "opt/lbctl/bin/lbctl").exists()
    (records / "pi-web.json").unlink()
    code, text = fleet(tmp_path, "uninstall")
    assert code == 0, text
    assert "left installed: python3-venv ipvsadm" in text, text
    assert "completion and man page: removed" in text, text
    for node in ("lb1", "pi1"):
        assert files_below(tmp_path / "nodes" / node) == [], node
    code, text = fleet(tmp_path, "uninstall")
    assert code == 0 and "lbctl is not installed here" in text, text
    assert text.endswith("taken off 2 of 2 node(s); nothing to change: lb1, pi1\n"), text
    assert [what for _node, what in ran].count("install") == 10


def test_the_link_is_made_under_a_name_no_one_knows_before(monkeypatch, tmp_path):
    from lbctl.remote import node_install

    folder = tmp_path / "usr/local/sbin"
    folder.mkdir(parents=True)
    link, target = folder / "lbctl", "/opt/lbctl/bin/lbctl"
    made = []
    symlink = os.symlink
    monkeypatch.setattr(node_install.os, "symlink",
                        lambda to, path: (made.append(os.path.basename(path)), symlink(to, path)))
    assert node_install.make_link(target, str(link), "/usr/local/sbin/lbctl")
    link.unlink()
    assert node_install.make_link(target, str(link), "/usr/local/sbin/lbctl")
    assert os.readlink(link) == target
    # A new name each time, hidden by its dot; nothing but the link is left.
    assert len(set(made)) == 2 and all(re.fullmatch(r"\.lbctl-[0-9a-f]{16}", n) for n in made)
    assert os.listdir(folder) == ["lbctl"]


def test_a_payload_entry_with_a_path_of_its_own_is_refused(tmp_path):
    """The node writes only the files it expects, into its private folder."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        data = b"x"
        info = tarfile.TarInfo("../../etc/cron.d/evil")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    program = cluster_install.node_program(cluster_from(PI_SINGLE),
                                           Target("pi1", "worker", "x"), "install")
    done = subprocess.run(program, input=buffer.getvalue(), capture_output=True,
                          env=dict(os.environ, LBCTL_ROOT=str(tmp_path)))
    assert done.returncode == 1
    assert b"unexpected entry in the payload: '../../etc/cron.d/evil'" in done.stderr
    assert files_below(tmp_path) == []


def test_install_and_uninstall_need_all():
    from lbctl.cli import main

    for command in ("install", "uninstall"):
        with pytest.raises(SystemExit) as stopped:
            main([command, "cluster.yaml"])
        assert stopped.value.code == 64  # a usage error, before the file is read


def test_root_s_python_imports_nothing_from_the_login_s_folder(tmp_path):
    """ssh starts the command in the login's home: python3 -c would put it
    first on sys.path, and a stray argparse.py there would run as root."""
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "ran-as-root"
    (home / "argparse.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    program = cluster_install.node_program(cluster_from(PI_SINGLE),
                                           Target("pi1", "worker", "x"), "uninstall")
    done = subprocess.run(program, capture_output=True, cwd=home,
                          env=dict(os.environ, LBCTL_ROOT=str(tmp_path / "root")))
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


def test_apt_is_tried_again_while_its_lock_is_held(tmp_path):
    from lbctl.remote.node_install import Refused, run, run_while_locked

    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    def apt_failing(times, *said):
        """A command that fails `times` times, saying what apt 2.6 says, then succeeds."""
        tries = tmp_path / f"tries-{len(slept)}-{times}"
        script = (f'n=$(cat {tries} 2>/dev/null || echo 0); echo $((n + 1)) > {tries}; '
                  f'[ "$n" -ge {times} ] && exit 0; ' +
                  "".join(f"echo '{line}' >&2; " for line in said) + "exit 100")
        return lambda: run(["sh", "-c", script]), tries

    # What apt-get update says while apt's daily job holds the lists' lock;
    # install says the same of /var/cache/apt/archives/lock.
    locked = ("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 812 "
              "(apt-get)", "E: Unable to lock directory /var/lib/apt/lists/")
    step, tries = apt_failing(3, *locked)
    run_while_locked(step, patience=60, clock=lambda: now[0], sleep=sleep)
    assert tries.read_text() == "4\n" and slept == [5.0] * 3
    # Another failure is said at once; a lock held too long, once patience is out.
    step, tries = apt_failing(1, "E: Failed to fetch http://deb.debian.org/... "
                                 "Temporary failure resolving 'deb.debian.org'")
    with pytest.raises(Refused, match="Temporary failure resolving"):
        run_while_locked(step, patience=60, clock=lambda: now[0], sleep=sleep)
    assert tries.read_text() == "1\n"
    step, tries = apt_failing(100, *locked)
    with pytest.raises(Refused, match="Unable to lock directory"):
        run_while_locked(step, patience=12, clock=lambda: now[0], sleep=sleep)
    assert tries.read_text() == "3\n"  # at 0, 5 and 10 s: a fourth would start past 12 s
