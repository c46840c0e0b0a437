"""Fakes and real adapters meet the same Protocols, method by method."""

import inspect
import os
import stat

import pytest

from fakes import FakeAddresses, FakeFiles, FakeIpvs, FakeKeepalived, FakeSysctls
from lbctl.adapters.addrs import AddressIp
from lbctl.adapters.files import FilesRoot
from lbctl.adapters.ipvs import IpvsNetlink
from lbctl.adapters.keepalived import KeepalivedProcess
from lbctl.adapters.protocols import Addresses, Files, Ipvs, Keepalived, Sysctls
from lbctl.adapters.sysctl import SysctlProc
from lbctl.errors import ApplyError
from lbctl.state import FileSpec

PAIRS = [(Ipvs, IpvsNetlink, FakeIpvs), (Addresses, AddressIp, FakeAddresses),
         (Sysctls, SysctlProc, FakeSysctls), (Files, FilesRoot, FakeFiles),
         (Keepalived, KeepalivedProcess, FakeKeepalived)]


def _methods(protocol):
    return [name for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_")]


@pytest.mark.parametrize("protocol,real,fake", PAIRS, ids=lambda p: getattr(p, "__name__", p))
def test_real_and_fake_implement_the_protocol(protocol, real, fake):
    assert issubclass(real, protocol)
    assert issubclass(fake, protocol)
    for name in _methods(protocol):
        expected = list(inspect.signature(getattr(protocol, name)).parameters)
        assert list(inspect.signature(getattr(real, name)).parameters) == expected, name
        assert list(inspect.signature(getattr(fake, name)).parameters) == expected, name


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
