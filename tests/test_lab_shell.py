"""The lab's helpers for its own files (lbctl.lab.shell)."""

import os
import subprocess

import pytest

from lbctl.lab.shell import mounts_below, remove_tree


@pytest.fixture
def bound(tmp_path):
    """A lab folder with another folder bound inside it, as a booted node's
    overlay root is mounted inside the lab's: (lab folder, what is bound)."""
    assert os.geteuid() == 0, "dev.sh runs the unit tests as root"
    lab, elsewhere = tmp_path / "lab", tmp_path / "machine root"
    (lab / "booted" / "lb1" / "root").mkdir(parents=True)
    (elsewhere / "usr").mkdir(parents=True)
    (elsewhere / "usr" / "precious").write_text("not the lab's\n")
    mount = lab / "booted" / "lb1" / "root"
    subprocess.run(["mount", "--bind", str(elsewhere), str(mount)], check=True)
    try:
        yield lab, elsewhere
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_removing_the_lab_folder_leaves_what_is_mounted_in_it(bound):
    lab, elsewhere = bound
    assert mounts_below(lab) == [str(lab / "booted" / "lb1" / "root")]
    remove_tree(lab)
    assert not lab.exists()
    assert (elsewhere / "usr" / "precious").read_text() == "not the lab's\n"
    assert mounts_below(lab) == []


def test_a_mount_point_with_a_space_is_read_from_its_escaped_form(bound):
    lab, elsewhere = bound
    inner = lab / "with space"
    inner.mkdir()
    subprocess.run(["mount", "--bind", str(elsewhere), str(inner)], check=True)
    try:
        assert set(mounts_below(lab)) == {str(inner), str(lab / "booted" / "lb1" / "root")}
        remove_tree(lab)
        assert not lab.exists() and (elsewhere / "usr" / "precious").exists()
    finally:
        subprocess.run(["umount", "-l", str(inner)], check=False)
