"""Every file lbctl renders: one line per value, and units systemd accepts."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cluster_from
from lbctl import cache
from lbctl.engine.desired import BootApply, desired_state
from lbctl.layout import Layout
from lbctl.render.sysctl import render_worker_sysctl
from lbctl.render.systemd import render_worker_unit
from lbctl.render.templates import RenderError

EXAMPLES = Path(__file__).parent.parent / "examples"


def rendered_files(text):
    """Every file each node of the cluster would get, by node."""
    cluster = cluster_from(text)
    layout = Layout(cluster.name) if cluster.engine == "keepalived" else None
    nodes = [*cluster.balancers, *cluster.workers]
    return {node: desired_state(cluster, node, "eth0", layout=layout,
                                boot=BootApply(text, "/usr/bin/python3")).files
            for node in nodes}


@pytest.mark.parametrize("example", ["pi-single.yaml", "pi-pair.yaml"])
def test_every_unit_lbctl_writes_is_accepted_by_systemd(example, tmp_path):
    text = (EXAMPLES / example).read_text()
    checked = 0
    for node, files in rendered_files(text).items():
        for path, spec in files.items():
            if not path.endswith(".service"):
                continue
            unit = tmp_path / os.path.basename(path)
            unit.write_text(spec.content)
            found = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                                   capture_output=True, text=True)
            assert found.returncode == 0 and found.stderr == "", f"{node} {path}: {found.stderr}"
            checked += 1
    assert checked >= 4  # a unit per worker, and the balancers' own


@pytest.mark.parametrize("name", ["pi\n", "pi\nExecStartPre=/bin/sh", "pi\x00", "pi\x1b[2J"])
def test_a_name_with_a_control_character_never_reaches_a_rendered_file(name):
    # Validation refuses such names; rendering refuses them too, whatever the source.
    with pytest.raises(RenderError, match="control character"):
        render_worker_unit(name, ["192.168.100.10"], "/etc/sysctl.d/90-lbctl.conf")
    with pytest.raises(RenderError, match="control character"):
        render_worker_sysctl(name)


def test_a_cluster_named_with_a_trailing_newline_is_refused_before_rendering():
    text = (EXAMPLES / "pi-single.yaml").read_text().replace("cluster: pi-web", 'cluster: "pi\\n"')
    with pytest.raises(Exception) as raised:
        cluster_from(text)
    assert "cluster name 'pi\\n' is not a valid name" in str(raised.value)
    # The same cluster with the name forced through still renders nothing.
    cluster = dataclasses.replace(cluster_from((EXAMPLES / "pi-single.yaml").read_text()),
                                  name="pi\n")
    with pytest.raises(RenderError):
        desired_state(cluster, "pi1", "eth0")




@pytest.fixture
def fresh_cache(own_cache):
    """A new process's renderer and an empty cache; returns its lbctl folder."""
    next_run()
    yield own_cache
    next_run()


def next_run():
    from lbctl.render import templates

    for cached in (templates._environment, templates._rendered_folder, templates.template_text,
                   cache.code_stamp):
        getattr(cached, "cache_clear", lambda: None)()  # a test may have replaced it


@pytest.fixture
def renders(monkeypatch):
    """How many times Jinja2 rendered a file."""
    from lbctl.render import templates

    count = []
    real = templates._environment

    def counted():
        count.append(1)
        return real()
    monkeypatch.setattr(templates, "_environment", counted)
    return count


UNIT = ("pi", ["192.168.100.10"], "/etc/sysctl.d/90-lbctl-pi.conf")


def test_a_file_rendered_once_is_read_back_by_the_next_run_without_jinja2(
        fresh_cache, monkeypatch):
    from lbctl.render import templates

    first = render_worker_unit(*UNIT)
    assert len(list((fresh_cache / "rendered").iterdir())) == 1
    assert oct((fresh_cache / "rendered").stat().st_mode & 0o777) == "0o700"
    assert oct(fresh_cache.stat().st_mode & 0o777) == "0o700"
    next_run()

    def no_jinja():
        raise AssertionError("rendered again")
    monkeypatch.setattr(templates, "_environment", no_jinja)
    assert render_worker_unit(*UNIT) == first


def test_other_values_an_edited_template_or_other_code_render_anew(
        fresh_cache, renders, monkeypatch):
    from lbctl.render import templates

    assert "cluster a." in render_worker_sysctl("a") and "cluster b." in render_worker_sysctl("b")
    assert len(renders) == 2
    shipped = templates.template_text
    monkeypatch.setattr(templates, "template_text",
                        lambda folder, name: "# edited\n" + shipped(folder, name))
    next_run()
    assert render_worker_sysctl("a").startswith("# edited\n")
    monkeypatch.setattr(templates, "template_text", shipped)
    render_worker_sysctl("a")
    assert len(renders) == 3  # the shipped text again: kept from the first run
    # Any change to lbctl's code (a property a template calls, the filter
    # that refuses control characters) changes every key.
    stamp = cache.code_stamp()
    monkeypatch.setattr(cache, "code_stamp", lambda: stamp + "\nrender/templates.py:1:2")
    render_worker_sysctl("a")
    assert len(renders) == 4


def test_a_value_is_told_apart_by_its_contents_and_a_set_in_any_order():
    from ipaddress import IPv4Address

    from lbctl.render.templates import canonical

    # Another process iterates a set in another order (string hashes are
    # salted per process): the text must not change with it.
    code = ("from lbctl.render.templates import canonical; "
            "print(canonical({('web', 'a'), ('web', 'b'), ('dns', 'c'), ('ssh', 'd')}))")
    texts = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True).stdout
             for seed in range(1, 9)}
    assert len(texts) == 1, texts
    assert canonical([1, 2]) != canonical([2, 1]) != canonical((1, 2))
    assert canonical("1") != canonical(1) != canonical(IPv4Address("0.0.0.1"))
    assert canonical({"a": None}) != canonical({"a": "None"})
    with pytest.raises(TypeError):
        canonical([object()])


def test_a_value_without_a_canonical_text_is_rendered_and_not_kept(fresh_cache):
    from lbctl.render.templates import render

    class Named:
        def __str__(self):
            return "pi"
    assert "cluster pi." in render("sysctl", "90-lbctl-dr-worker.conf", cluster=Named())
    assert list((fresh_cache / "rendered").iterdir()) == []


def test_a_cache_others_can_change_is_never_read(fresh_cache):
    # Someone else could put text there that lbctl would write as root.
    first = render_worker_sysctl("pi")
    (entry,) = (fresh_cache / "rendered").iterdir()
    forged = first.replace("arp_ignore", "forged")
    cache.store(str(entry), forged.encode())
    next_run()
    assert render_worker_sysctl("pi") == forged  # an entry as kept is read back
    for unsafe in ("group-writable", "another owner"):
        if unsafe == "group-writable":
            fresh_cache.chmod(0o770)
        else:
            fresh_cache.chmod(0o700)
            os.chown(fresh_cache, 65534, 65534)
        next_run()
        assert render_worker_sysctl("pi") == first, unsafe


@pytest.mark.parametrize("planted", ["a link", "a second name", "another owner's"])
def test_an_entry_that_is_not_a_plain_file_of_ones_own_is_not_read(fresh_cache, planted):
    first = render_worker_sysctl("pi")
    (entry,) = (fresh_cache / "rendered").iterdir()
    forged = fresh_cache / "forged"
    cache.store(str(forged), first.replace("arp_ignore", "forged").encode())
    entry.unlink()
    if planted == "a link":
        entry.symlink_to(forged)
    elif planted == "a second name":
        os.link(forged, entry)
    else:
        os.rename(forged, entry)
        os.chown(entry, 65534, 65534)
    next_run()
    assert render_worker_sysctl("pi") == first


def test_root_makes_no_folder_where_another_user_points_it(tmp_path, monkeypatch):
    # sudo that keeps a user's HOME or XDG_CACHE_HOME: the user's folder is
    # theirs, and root makes nothing in it (nor where a link there leads).
    users = tmp_path / "home"
    users.mkdir()
    os.chown(users, 65534, 65534)
    monkeypatch.setenv("XDG_CACHE_HOME", str(users / ".cache"))
    next_run()
    try:
        assert "cluster pi." in render_worker_sysctl("pi")
        assert list(users.iterdir()) == []
    finally:
        next_run()


@pytest.mark.parametrize("fault", ["cut short", "not text", "read-only"])
def test_a_cache_that_cannot_be_read_or_written_still_renders(fresh_cache, fault, monkeypatch):
    import errno
    import tempfile

    expected = render_worker_sysctl("pi")
    next_run()
    (entry,) = (fresh_cache / "rendered").iterdir()
    if fault == "cut short":
        entry.write_bytes(entry.read_bytes()[:-10])
    elif fault == "not text":  # whole, with its digest, but no UTF-8
        cache.store(str(entry), b"\xff\xfe" * 40)
    else:
        entry.unlink()

        def read_only(*_args, **_kwargs):
            raise OSError(errno.EROFS, "Read-only file system")
        # Root writes through permission bits: the file system itself refuses.
        monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert render_worker_sysctl("pi") == expected


def test_the_cache_keeps_the_newest_files_even_with_equal_times(fresh_cache, monkeypatch):
    real_store = cache.store

    def store_then_age(path, data, keep=64):
        real_store(path, data, keep)
        os.utime(path, ns=(0, 0))  # one coarse clock tick for every entry
    monkeypatch.setattr(cache, "store", store_then_age)
    names = []
    for n in range(70):
        render_worker_sysctl(f"c{n}")
        names.append(sorted(p.name for p in (fresh_cache / "rendered").iterdir()))
    kept = names[-1]
    assert len(kept) == 64
    # Each run kept what it had just written.
    for n, listing in enumerate(names):
        newest = set(listing) - (set(names[n - 1]) if n else set())
        assert len(newest) == 1, n
