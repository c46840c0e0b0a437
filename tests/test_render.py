"""Every file lbctl renders: one line per value, and units systemd accepts."""

import dataclasses
import os
import subprocess
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
def fresh_cache(tmp_path, monkeypatch):
    """A new process's renderer, with its compiled templates kept in tmp_path/cache."""
    from lbctl.render import templates

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    templates._environment.cache_clear()
    yield tmp_path / "cache" / "lbctl" / "templates"
    templates._environment.cache_clear()


def test_a_template_compiled_once_is_read_back_compiled_by_the_next_run(fresh_cache, monkeypatch):
    import jinja2

    first = render_worker_unit("pi", ["192.168.100.10"], "/etc/sysctl.d/90-lbctl-pi.conf")
    (entry,) = fresh_cache.iterdir()
    assert oct(fresh_cache.stat().st_mode & 0o777) == "0o700"
    assert oct(entry.stat().st_mode & 0o777) == "0o600"

    from lbctl.render import templates

    templates._environment.cache_clear()  # the next run

    def no_compiling(*_args, **_kwargs):
        raise AssertionError("the template was compiled again")
    monkeypatch.setattr(jinja2.Environment, "compile", no_compiling)
    assert render_worker_unit("pi", ["192.168.100.10"], "/etc/sysctl.d/90-lbctl-pi.conf") == first


def test_a_cache_others_can_write_to_is_never_read(fresh_cache, monkeypatch):
    # Someone else could put code there that lbctl would run as root.
    fresh_cache.mkdir(parents=True)
    fresh_cache.chmod(0o777)
    render_worker_sysctl("pi")
    assert list(fresh_cache.iterdir()) == []
    fresh_cache.chmod(0o700)
    os.chown(fresh_cache, 65534, 65534)
    from lbctl.render import templates

    templates._environment.cache_clear()
    render_worker_sysctl("pi")
    assert list(fresh_cache.iterdir()) == []


@pytest.mark.parametrize("fault", ["read-only", "cut short", "garbage"])
def test_a_cache_that_cannot_be_written_or_read_still_renders(fresh_cache, fault, monkeypatch):
    import errno

    import jinja2.bccache

    expected = render_worker_sysctl("pi")
    from lbctl.render import templates

    templates._environment.cache_clear()
    (entry,) = fresh_cache.iterdir()
    if fault == "cut short":
        entry.write_bytes(entry.read_bytes()[:40])
    elif fault == "garbage":
        entry.write_bytes(entry.read_bytes()[:20] + os.urandom(200))
    else:
        entry.unlink()

        def read_only(*_args, **_kwargs):
            raise OSError(errno.EROFS, "Read-only file system")
        # Root writes through permission bits: the file system itself refuses.
        monkeypatch.setattr(jinja2.bccache.tempfile, "NamedTemporaryFile", read_only)
    assert render_worker_sysctl("pi") == expected
