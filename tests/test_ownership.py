"""The ownership record: what lbctl may take away, read as root from a file on disk."""

import json

import pytest

from lbctl.errors import NodeError
from lbctl.records.ownership import decode, read_ownership
from test_execute import RemovingNode

RECORD = "/var/lib/lbctl/pi-web.json"


def test_only_lbctl_s_own_paths_and_keys_are_taken_from_the_record():
    owned = decode(json.dumps({
        "format": 1,
        "services": [1, None, "tcp 999.0.0.1:80", "tcp 192.168.100.10:80\n", "tcp 192.168.100.10:80"],
        "addresses": ["192.168.100.10/32 dev lo; reboot", "192.168.100.10/32 dev lo"],
        "files": ["/etc/passwd", "/etc/lbctl/pi-web/../../shadow", "/etc/lbctl/other.yaml",
                  "/etc/lbctl/pi-web/keepalived.conf", "/etc/sysctl.d/90-lbctl-pi-web.conf", 7],
        "links": ["/etc/systemd/system/multi-user.target.wants/ssh.service",
                  "/etc/systemd/system/multi-user.target.wants/lbctl-pi-web-vips.service"],
        "sysctls": {"net.ipv4.//.//.//etc.x": "1", "kernel.modprobe": "/tmp/x",
                    "net.ipv4.conf.eth0/100.arp_ignore": "0"},
        "timeouts": {"tcp": True, "udp": 300},
    }), "pi-web")
    assert {str(k) for k in owned.services} == {"tcp 192.168.100.10:80"}
    assert {str(a) for a in owned.addresses} == {"192.168.100.10/32 dev lo"}
    assert owned.files == {"/etc/lbctl/pi-web/keepalived.conf", "/etc/sysctl.d/90-lbctl-pi-web.conf"}
    assert owned.links == {"/etc/systemd/system/multi-user.target.wants/lbctl-pi-web-vips.service"}
    assert owned.sysctls == {"net.ipv4.conf.eth0/100.arp_ignore": "0"}
    assert owned.timeouts == {"udp": 300}


def test_a_file_the_record_names_but_lbctl_never_writes_survives_remove():
    node = RemovingNode("pi1")
    node.apply()
    files = node.adapters.files.files
    record = json.loads(files[RECORD][0])
    files["/etc/passwd"] = ("root:x:0:0::/root:/bin/bash\n", 0o644)
    files[RECORD] = (json.dumps(record | {"files": record["files"] + ["/etc/passwd"]}), 0o644)
    planned = [str(c) for c in node.remove_plan().changes]
    assert any("90-lbctl-pi-web.conf" in c for c in planned)
    assert not any("/etc/passwd" in c for c in planned)


@pytest.mark.parametrize("damage", [{"services": "tcp 192.168.100.10:80"}, {"files": {"a": 1}},
                                    {"timeouts": [900]}])
def test_a_section_of_the_wrong_kind_is_a_damaged_record_not_a_traceback(damage):
    node = RemovingNode("pi1")
    node.apply()
    files = node.adapters.files.files
    files[RECORD] = (json.dumps(json.loads(files[RECORD][0]) | damage), 0o644)
    # apply owns only what the file declares; --remove refuses to guess.
    assert read_ownership(node.adapters.files, "/var/lib/lbctl", "pi-web").empty
    with pytest.raises(NodeError, match="is damaged"):
        read_ownership(node.adapters.files, "/var/lib/lbctl", "pi-web", strict=True)


@pytest.mark.parametrize("cluster", ["PURPOSE", "pi-web", "a.b"])
def test_a_record_owns_only_its_own_cluster_s_units(cluster):
    from lbctl.records.ownership import owned_paths_pattern

    ours = owned_paths_pattern(cluster)
    assert ours.fullmatch(f"/etc/systemd/system/lbctl-{cluster}-keepalived.service")
    assert ours.fullmatch(f"/etc/systemd/system/multi-user.target.wants/lbctl-{cluster}-vips.service")
    for other in ("/etc/systemd/system/lbctl-web-keepalived.service",
                  f"/etc/systemd/system/lbctl-{cluster}2-vips.service",
                  f"/etc/systemd/system/lbctl-{cluster}-.service",
                  "/etc/systemd/system/multi-user.target.wants/ssh.service",
                  f"/etc/lbctl/{cluster}/../../shadow"):
        assert not ours.fullmatch(other), other
