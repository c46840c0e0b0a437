"""--all shares one ssh connection per node for the whole command (remote/connections.py)."""

import os
import stat

from lbctl.remote import connections
from lbctl.remote.ssh import Target, ssh_argv


def test_every_ssh_of_a_command_shares_one_private_folder_of_masters(monkeypatch):
    monkeypatch.setattr(connections, "_folder", None)
    first = ssh_argv(Target("pi1", "worker", "192.168.1.3"), ["validate", "-"])
    second = ssh_argv(Target("lb1", "balancer", "192.168.1.2"), ["apply", "-"])
    path = next(o for o in first if o.startswith("ControlPath="))
    assert path in second and "ControlMaster=auto" in first
    folder = os.path.dirname(path.split("=", 1)[1])
    info = os.stat(folder)
    # Only this user may reach the masters (a socket there is a login to every node).
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert os.path.basename(folder).startswith("lbctl-ssh-") and folder != "/tmp/lbctl-ssh-"
    connections.close_all()
    assert not os.path.exists(folder)


def test_a_socket_path_too_long_for_unix_sockets_shares_nothing(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(connections.tempfile, "tempdir", None)
    monkeypatch.setattr(connections, "_folder", None)
    try:
        assert connections.sharing_options() == []
        argv = ssh_argv(Target("pi1", "worker", "192.168.1.3"), ["validate", "-"])
        assert not any(o.startswith("Control") for o in argv)  # a plain login each time
    finally:
        connections.close_all()
