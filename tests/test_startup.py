"""What a command costs a slow node before it does anything: its imports.

A Pi pays for every module a command imports, on every boot unit, every
--all node and every `status --watch` frame.  So each command imports only
what it runs, and the heavy libraries come in where they are used: Jinja2
only when a file must be rendered anew, scapy in doctor's probes,
prometheus_client in the exporter, a thread pool in --all.  A new top-level
import of one of them fails here, by name.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"
COMMANDS = sorted(p.stem for p in (Path(__file__).parent.parent / "lbctl" / "commands")
                  .glob("*.py") if p.stem != "__init__")
HEAVY = ["jinja2", "scapy", "prometheus_client", "pyroute2", "concurrent.futures", "asyncio",
         "ssl", "http.client", "email", "xml", "urllib.request", "multiprocessing", "curses",
         "ctypes", "decimal", "zipfile", "importlib.resources", "importlib.metadata"]


def imported(code, env=None):
    """The modules a fresh interpreter holds after running `code`."""
    done = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\n"
                           "print(' '.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def heavy_in(modules):
    return sorted(h for h in HEAVY if h in modules)


def test_every_command_is_found():
    assert {"apply", "plan", "status", "validate", "doctor", "exporter",
            "cluster_apply"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_imports_no_heavy_library_before_it_runs(command):
    assert heavy_in(imported(f"import lbctl.cli, lbctl.commands.{command}")) == []


def test_a_file_is_parsed_once_and_validate_always_parses_it(own_cache):
    env = os.environ  # a cache of its own (own_cache): the file is new to it
    example = str(EXAMPLES / "pi-pair.yaml")
    load = f"from lbctl.config import load_cluster; load_cluster({example!r})"
    first = imported(load, env)
    assert heavy_in(first) == [] and "yaml" in first  # the check can see an import
    again = imported(load, env)
    assert heavy_in(again) == [] and "yaml" not in again
    # lbctl validate is the operator's own check: it parses the file whatever is kept.
    validate = f"from lbctl.cli import main\nassert main(['validate', {example!r}]) == 0"
    checked = imported(validate, env)
    assert heavy_in(checked) == [] and "yaml" in checked


def test_a_file_rendered_before_is_read_back_without_jinja2(own_cache):
    env = os.environ  # a cache of its own (own_cache)
    render = "from lbctl.render.sysctl import render_worker_sysctl; render_worker_sysctl('pi')"
    first = imported(render, env)
    assert "jinja2" in first
    assert heavy_in(imported(render, env)) == []
