"""Every file lbctl renders: one line per value, and units systemd accepts."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cluster_from
from lbctl.desired import BootApply, desired_state
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
def fresh_cache(monkeypatch):
    """A new process's renderer and an empty cache (in the home folder, where
    lbctl trusts one); returns its lbctl folder."""
    import tempfile

    base = tempfile.mkdtemp(dir=os.environ["XDG_CACHE_HOME"])
    monkeypatch.setenv("XDG_CACHE_HOME", base)
    next_run()
    yield Path(base) / "lbctl"
    next_run()


def next_run():
    from lbctl.render import templates

    for cached in (templates._environment, templates._rendered_folder):
        getattr(cached, "cache_clear", lambda: None)()  # a test may have replaced it


UNIT = ("pi", ["192.168.100.10"], "/etc/sysctl.d/90-lbctl-pi.conf")


def test_a_file_rendered_once_is_read_back_by_the_next_run_without_jinja2(
        fresh_cache, monkeypatch):
    from lbctl.render import templates

    first = render_worker_unit(*UNIT)
    assert len(list((fresh_cache / "rendered").iterdir())) == 1
    for folder in (fresh_cache / "rendered", fresh_cache / "templates"):
        assert oct(folder.stat().st_mode & 0o777) == "0o700", folder
    next_run()

    def no_jinja(_folder):
        raise AssertionError("rendered again")
    monkeypatch.setattr(templates, "_environment", no_jinja)
    assert render_worker_unit(*UNIT) == first


def test_other_values_or_an_edited_template_render_anew(fresh_cache, monkeypatch):
    from lbctl.render import templates

    assert "cluster a." in render_worker_sysctl("a") and "cluster b." in render_worker_sysctl("b")
    assert len(list((fresh_cache / "rendered").iterdir())) == 2
    shipped = templates.template_text
    monkeypatch.setattr(templates, "template_text",
                        lambda folder, name: "# edited\n" + shipped(folder, name))
    next_run()
    assert render_worker_sysctl("a").startswith("# edited\n")


def test_a_template_compiled_once_is_not_compiled_again(fresh_cache, monkeypatch):
    import jinja2

    render_worker_sysctl("a")
    next_run()

    def no_compiling(*_args, **_kwargs):
        raise AssertionError("the template was compiled again")
    monkeypatch.setattr(jinja2.Environment, "compile", no_compiling)
    assert "cluster b." in render_worker_sysctl("b")  # other values: rendered, not compiled


def test_values_are_told_apart_by_contents_and_sets_in_any_order():
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
    entry.write_text(hashlib_line(forged) + forged)
    next_run()
    assert render_worker_sysctl("pi") == forged  # the entry as kept is read back
    for unsafe in ("group-writable", "another owner"):
        if unsafe == "group-writable":
            fresh_cache.chmod(0o770)
        else:
            fresh_cache.chmod(0o700)
            os.chown(fresh_cache, 65534, 65534)
        next_run()
        assert render_worker_sysctl("pi") == first, unsafe


def hashlib_line(text):
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest() + "\n"


@pytest.mark.parametrize("fault", ["cut short", "not text", "template code cut short",
                                   "read-only"])
def test_a_cache_that_cannot_be_read_or_written_still_renders(fresh_cache, fault, monkeypatch):
    import errno
    import tempfile

    import jinja2.bccache

    expected = render_worker_sysctl("pi")
    next_run()
    (entry,) = (fresh_cache / "rendered").iterdir()
    if fault == "cut short":
        entry.write_bytes(entry.read_bytes()[:-10])
    elif fault == "not text":
        entry.write_bytes(entry.read_bytes()[:65] + b"\xff\xfe" * 40)
    else:
        entry.unlink()
        (code,) = (fresh_cache / "templates").iterdir()
        if fault == "template code cut short":
            code.write_bytes(code.read_bytes()[:40])
        else:
            code.unlink()

            def read_only(*_args, **_kwargs):
                raise OSError(errno.EROFS, "Read-only file system")
            # Root writes through permission bits: the file system itself refuses.
            monkeypatch.setattr(jinja2.bccache.tempfile, "NamedTemporaryFile", read_only)
            monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert render_worker_sysctl("pi") == expected


def test_the_cache_keeps_only_the_newest_files(fresh_cache):
    for n in range(70):
        render_worker_sysctl(f"c{n}")
    kept = list((fresh_cache / "rendered").iterdir())
    assert len(kept) == 64
    next_run()
    assert "cluster c69." in render_worker_sysctl("c69")
