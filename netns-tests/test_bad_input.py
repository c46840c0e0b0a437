"""Bad cluster files are refused with FILE:LINE:COL and leave the node exactly as it was,
keepalived included: they never reach it.

One bad file goes through `lbctl apply` as a user runs it, with the node
compared before and after.  The others go through lbctl's own command-line
entry, main(), all in one Python per node: a Python start costs seconds in
the emulated lab, and sixty of them were a tenth of the suite.  The node is
compared before and after all of them.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bad_cases import bad_cases, error_lines
from clusters import PAIR

NODES = ("lb1", "pi1")
CASES = bad_cases()
THROUGH_THE_COMMAND = "interface-injection"  # one with much to break: keepalived.conf

# Each file given through main() as `lbctl apply FILE --root ROOT` would, what
# it printed and returned: {path: {"returncode", "stdout", "stderr"}} as JSON.
APPLY_EACH = """
import contextlib, io, json, sys
from lbctl.cli import main

root, results = sys.argv[1], {}
for path in sys.argv[2:]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["apply", path, "--root", root])
        except SystemExit as exc:
            code = exc.code
    results[path] = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
json.dump(results, sys.stdout)
"""


def _files(root):
    return {str(p): p.read_bytes() for p in sorted(Path(root).rglob("*"))
            if p.is_file() and "state" not in p.parts and p.suffix != ".log"}


def _snapshot(lab, node):
    return (lab.ipvs_rules(node) if node == "lb1" else None,
            lab.keepalived_pids(node) if node == "lb1" else None,
            lab.sh(node, ["ip", "-4", "-o", "address"]).stdout,
            lab.sh(node, ["sysctl", "net.ipv4.conf.all.arp_ignore",
                          "net.ipv4.conf.eth0.arp_ignore"]).stdout,
            _files(lab.nodes[node].root))


def _on_each(work):
    """{node: work(node)}, run on every node at once: the nodes share nothing it reads."""
    with ThreadPoolExecutor(len(NODES)) as pool:
        return dict(zip(NODES, pool.map(work, NODES)))


def _assert_refused(result, case, node):
    assert result["returncode"] == 1, f"{node}: {result['stdout']}{result['stderr']}"
    found = error_lines(result["stderr"], case.path)
    assert any((l, c) == (case.line, case.col) and case.text in m for l, c, m in found), \
        f"{node}: {result['stderr']}"
    assert "Traceback" not in result["stderr"]


@pytest.fixture(scope="module")
def applied(lab):
    """The failover pair in place (keepalived running), so a bad apply has much to break."""
    path = lab.reset(PAIR, "pair")
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 master")
    return path


@pytest.fixture(scope="module")
def refused(lab, applied):
    """(before, {node: {path: result}}, after) for every bad file on each node."""
    before = _on_each(lambda node: _snapshot(lab, node))

    def apply_each(node):
        done = lab.sh(node, [sys.executable, "-c", APPLY_EACH, lab.nodes[node].root,
                             *(str(c.path) for c in CASES)], check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)
    results = _on_each(apply_each)
    return before, results, _on_each(lambda node: _snapshot(lab, node))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_input_is_refused_where_it_is_written(refused, case):
    _, results, _ = refused
    for node in NODES:
        _assert_refused(results[node][str(case.path)], case, node)


def test_no_bad_file_changed_the_nodes_keepalived_included(refused):
    before, _, after = refused
    assert after == before


def test_a_bad_file_given_to_the_command_changes_nothing(lab, applied):
    (case,) = [c for c in CASES if c.name == THROUGH_THE_COMMAND]
    before = _on_each(lambda node: _snapshot(lab, node))
    results = _on_each(lambda node: lab.lbctl(node, "apply", str(case.path)))
    for node, result in results.items():
        _assert_refused({"returncode": result.returncode, "stdout": result.stdout,
                         "stderr": result.stderr}, case, node)
    assert _on_each(lambda node: _snapshot(lab, node)) == before
