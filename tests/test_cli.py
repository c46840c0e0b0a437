"""The command line as a user meets it: exit codes, messages, and a light start-up."""

import subprocess
import sys
from pathlib import Path

from lbctl.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pi-single.yaml"


def test_validate_a_good_file(capsys):
    assert main(["validate", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{EXAMPLE}: valid: cluster pi-web, 1 balancer(s), 3 worker(s), 2 service(s); balancers run by netlink")


def test_usage_errors_exit_2(capsys):
    try:
        main(["plan"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "usage: lbctl" in capsys.readouterr().err


def test_validate_imports_neither_pyroute2_nor_jinja2():
    code = ("import sys; from lbctl.cli import main; rc = main(['validate', sys.argv[1]]);"
            "print(rc, 'pyroute2' in sys.modules, 'jinja2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1]
    assert out == "0 False False"


def test_python_dash_m_lbctl_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "lbctl", "validate", str(EXAMPLE)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "valid" in done.stdout
