"""Fakes and real adapters meet the same Protocols, method by method."""

import inspect

import pytest

from fakes import FakeAddresses, FakeFiles, FakeIpvs, FakeKeepalived, FakeSysctls
from lbctl.adapters.addrs import AddressIp
from lbctl.adapters.files import FilesRoot
from lbctl.adapters.ipvs import IpvsNetlink
from lbctl.adapters.keepalived import KeepalivedProcess
from lbctl.adapters.protocols import Addresses, Files, Ipvs, Keepalived, Sysctls
from lbctl.adapters.sysctl import SysctlProc

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
    assert files.read("/etc/sysctl.d/x.conf") == ("a = 1\n", 0o644)
    files.write("/etc/sysctl.d/x.conf", "a = 2\n", 0o600)
    assert files.read("/etc/sysctl.d/x.conf") == ("a = 2\n", 0o600)
    assert sorted(p.name for p in (tmp_path / "etc/sysctl.d").iterdir()) == ["x.conf"]
    files.symlink("/etc/wants/u.service", "/etc/u.service")
    files.symlink("/etc/wants/u.service", "/etc/u.service")
    assert files.readlink("/etc/wants/u.service") == "/etc/u.service"
    files.remove("/etc/wants/u.service")
    assert files.readlink("/etc/wants/u.service") is None


def test_sysctl_proc_maps_dotted_interface_names(tmp_path):
    (tmp_path / "net/ipv4/conf/eth0.100").mkdir(parents=True)
    (tmp_path / "net/ipv4/conf/eth0.100/arp_ignore").write_text("0\n")
    sysctls = SysctlProc(str(tmp_path))
    assert sysctls.read("net.ipv4.conf.eth0/100.arp_ignore") == "0"
    sysctls.write("net.ipv4.conf.eth0/100.arp_ignore", "1")
    assert sysctls.read("net.ipv4.conf.eth0/100.arp_ignore") == "1"
    assert sysctls.read("net.ipv4.conf.nothere.arp_ignore") is None
