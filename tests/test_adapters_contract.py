"""Fakes and real adapters meet the same Protocols, method by method."""

import inspect
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from fakes import FakeAddresses, FakeFiles, FakeIpvs, FakeDaemon, FakeSysctls
from lbctl.adapters.addrs import AddressIp
from lbctl.adapters.files import FilesRoot
from lbctl.adapters.ipvs import IpvsNetlink
from lbctl.adapters.bird import BirdDaemon
from lbctl.adapters.exporter import ExporterDaemon
from lbctl.adapters.keepalived import KeepalivedDaemon
from lbctl.adapters.protocols import Addresses, Daemon, Files, Ipvs, Sysctls
from lbctl.adapters.sysctl import SysctlProc
from lbctl.config.model import Mode
from lbctl.errors import ApplyError
from lbctl.state import FileSpec

PAIRS = [(Ipvs, IpvsNetlink, FakeIpvs), (Addresses, AddressIp, FakeAddresses),
         (Sysctls, SysctlProc, FakeSysctls), (Files, FilesRoot, FakeFiles),
         (Daemon, KeepalivedDaemon, FakeDaemon), (Daemon, BirdDaemon, FakeDaemon),
         (Daemon, ExporterDaemon, FakeDaemon)]


def _methods(protocol):
    return [name for name, value in vars(protocol).items()
            if (callable(value) or isinstance(value, classmethod)) and not name.startswith("_")]


@pytest.mark.parametrize("protocol,real,fake", PAIRS, ids=lambda p: getattr(p, "__name__", p))
def test_real_and_fake_implement_the_protocol(protocol, real, fake):
    # (issubclass() cannot check a protocol's attributes, such as Daemon.name.)
    for attribute in getattr(protocol, "__annotations__", {}):
        assert isinstance(getattr(real, attribute, None), str), attribute
        assert attribute in inspect.signature(fake).parameters, attribute
    if not getattr(protocol, "__annotations__", {}):
        assert issubclass(real, protocol)
        assert issubclass(fake, protocol)
    for name in _methods(protocol):
        expected = list(inspect.signature(getattr(protocol, name)).parameters)
        assert list(inspect.signature(getattr(real, name)).parameters) == expected, name
        assert list(inspect.signature(getattr(fake, name)).parameters) == expected, name


@pytest.mark.parametrize("mode", [*Mode, None], ids=lambda m: str(m or "apply --remove"))
@pytest.mark.parametrize("systemd_runs", [True, False], ids=["systemd", "no systemd"])
def test_a_balancer_gets_each_registered_daemons_adapter(mode, systemd_runs):
    from types import SimpleNamespace

    from lbctl.adapters.daemons import balancer_daemons
    from lbctl.layout import Layout
    from lbctl.state import DAEMON_ORDER, EXPORTER, KEEPALIVED

    cluster = SimpleNamespace(mode=mode or Mode.SINGLE)
    systemd = SimpleNamespace(runs=systemd_runs)
    daemons = balancer_daemons(cluster, Layout("web"), systemd, remove=mode is None)
    # Every daemon, in the order they start; the exporter only where systemd runs it.
    assert list(daemons) == [n for n in DAEMON_ORDER if systemd_runs or n != EXPORTER]
    for name, daemon in daemons.items():
        assert daemon.name == name and isinstance(daemon, Daemon)
        assert daemon.systemd is systemd
    keepalived = daemons[KEEPALIVED]
    assert (keepalived.takeover, keepalived.announce) == (mode == Mode.FAILOVER,
                                                          mode == Mode.ECMP)


def test_files_root_writes_atomically_with_the_requested_mode(tmp_path):
    files = FilesRoot(str(tmp_path))
    files.write("/etc/sysctl.d/x.conf", "a = 1\n", 0o644)
    assert files.read("/etc/sysctl.d/x.conf") == ("a = 1\n", 0o644, os.geteuid())
    files.write("/etc/sysctl.d/x.conf", "a = 2\n", 0o600)
    assert files.read("/etc/sysctl.d/x.conf") == ("a = 2\n", 0o600, os.geteuid())
    assert sorted(p.name for p in (tmp_path / "etc/sysctl.d").iterdir()) == ["x.conf"]
    files.symlink("/etc/wants/u.service", "/etc/u.service")
    files.symlink("/etc/wants/u.service", "/etc/u.service")
    assert files.readlink("/etc/wants/u.service") == "/etc/u.service"
    files.remove("/etc/wants/u.service")
    assert files.readlink("/etc/wants/u.service") is None


def test_files_root_syncs_the_folder_of_each_rename_and_removal(tmp_path, monkeypatch):
    """A drain record written, or removed by undrain, must outlive a power cut."""
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    files = FilesRoot(str(tmp_path))
    files.write("/var/lib/lbctl/drained/pi-web.json", "{}\n", 0o644)
    folder = str(tmp_path / "var/lib/lbctl/drained")
    assert synced == [False, folder]  # the file's data, then the folder's entry
    synced.clear()
    files.remove("/var/lib/lbctl/drained/pi-web.json")
    assert synced == [folder]
    synced.clear()
    files.remove("/var/lib/lbctl/drained/pi-web.json")  # gone already: nothing to sync
    files.symlink("/etc/systemd/system/multi-user.target.wants/x.service", "/dev/null")
    assert synced == [str(tmp_path / "etc/systemd/system/multi-user.target.wants")]


def test_folders_are_made_0755_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        FilesRoot(str(tmp_path)).write("/etc/lbctl/pi-web/keepalived.conf", "x\n", 0o644)
    finally:
        os.umask(old)
    for folder in ("etc", "etc/lbctl", "etc/lbctl/pi-web"):
        assert stat.S_IMODE((tmp_path / folder).stat().st_mode) == 0o755, folder


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize("owner, mode", [(12345, 0o755), (0, 0o775), (0, 0o757)])
def test_a_folder_another_user_could_change_is_refused(tmp_path, owner, mode):
    (tmp_path / "etc/lbctl").mkdir(parents=True)
    os.chown(tmp_path / "etc/lbctl", owner, 0)
    os.chmod(tmp_path / "etc/lbctl", mode)
    with pytest.raises(ApplyError, match=f"etc/lbctl: it is owned by uid {owner} with mode "
                                         f"{mode:04o}"):
        FilesRoot(str(tmp_path)).write("/etc/lbctl/pi-web.yaml", "x\n", 0o644)
    assert not (tmp_path / "etc/lbctl/pi-web.yaml").exists()
    with pytest.raises(ApplyError, match="it is not a directory"):
        (tmp_path / "run").write_text("")
        FilesRoot(str(tmp_path)).write("/run/lbctl/x", "x\n", 0o644)


def test_lbctl_s_own_folders_made_0700_by_an_older_lbctl_are_put_back_to_0755(tmp_path):
    # An older lbctl made its folders through the umask: under umask 077, 0700,
    # and keepalived's script user could not reach its check scripts.
    for folder in ("etc/lbctl/pi-web", "etc/systemd/system"):
        (tmp_path / folder).mkdir(parents=True)
    for folder in ("etc/lbctl", "etc/lbctl/pi-web", "etc/systemd/system"):
        os.chmod(tmp_path / folder, 0o700)
    files = FilesRoot(str(tmp_path))
    files.write("/etc/lbctl/pi-web/lbctl-check", "#!/bin/bash\n", 0o755)
    files.write("/etc/systemd/system/lbctl-pi-web-keepalived.service", "[Unit]\n", 0o644)
    assert stat.S_IMODE((tmp_path / "etc/lbctl").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "etc/lbctl/pi-web").stat().st_mode) == 0o755
    # A system folder's mode is the administrator's choice: left as it is.
    assert stat.S_IMODE((tmp_path / "etc/systemd/system").stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_folder_that_is_a_link_into_a_user_s_tree_is_refused():
    # Under /run: every folder above is root's alone, unlike pytest's tmp_path in /tmp.
    tmp_path = Path(tempfile.mkdtemp(dir="/run"))
    os.chmod(tmp_path, 0o755)
    user_tree = tmp_path / "home" / "pi"
    (user_tree / "etc").mkdir(parents=True)
    os.chown(user_tree, 1000, 1000)  # root's own folder, inside one the user can swap
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "lbctl").symlink_to(user_tree / "etc")
    try:
        with pytest.raises(ApplyError, match=f"it leads to {user_tree}/etc, and {user_tree} can "
                                             "be changed by a user other than root"):
            FilesRoot(str(root)).write("/etc/lbctl/pi-web.yaml", "x\n", 0o644)
        os.chown(user_tree, 0, 0)
        FilesRoot(str(root)).write("/etc/lbctl/pi-web.yaml", "x\n", 0o644)
        assert (user_tree / "etc" / "pi-web.yaml").read_text() == "x\n"
    finally:
        shutil.rmtree(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_of_the_right_text_but_another_owner_is_drift(tmp_path):
    files = FilesRoot(str(tmp_path))
    files.write("/etc/sysctl.d/90-lbctl-pi-web.conf", "a = 1\n", 0o644)
    os.chown(tmp_path / "etc/sysctl.d/90-lbctl-pi-web.conf", 12345, 0)
    found = FileSpec(*files.read("/etc/sysctl.d/90-lbctl-pi-web.conf"))
    assert found != FileSpec("a = 1\n", 0o644)
    files.write("/etc/sysctl.d/90-lbctl-pi-web.conf", "a = 1\n", 0o644)
    assert FileSpec(*files.read("/etc/sysctl.d/90-lbctl-pi-web.conf")) == FileSpec("a = 1\n", 0o644)


def test_sysctl_proc_maps_dotted_interface_names(tmp_path):
    (tmp_path / "net/ipv4/conf/eth0.100").mkdir(parents=True)
    (tmp_path / "net/ipv4/conf/eth0.100/arp_ignore").write_text("0\n")
    sysctls = SysctlProc(str(tmp_path))
    assert sysctls.read("net.ipv4.conf.eth0/100.arp_ignore") == "0"
    sysctls.write("net.ipv4.conf.eth0/100.arp_ignore", "1")
    assert sysctls.read("net.ipv4.conf.eth0/100.arp_ignore") == "1"
    assert sysctls.read("net.ipv4.conf.nothere.arp_ignore") is None


def test_a_folder_its_filesystem_cannot_sync_does_not_fail_the_write(tmp_path, monkeypatch):
    import errno

    from lbctl.adapters import files as files_module

    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    FilesRoot(str(tmp_path)).write("/etc/lbctl/pi-web.yaml", "x\n", 0o644)
    assert (tmp_path / "etc/lbctl/pi-web.yaml").read_text() == "x\n"

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError):
        files_module.sync_dir(str(tmp_path))
