"""Bad cluster files are refused with FILE:LINE:COL and leave the node exactly as it was,
keepalived included: they never reach it."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bad_cases import bad_cases, error_lines
from clusters import PAIR


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


def _on_each(nodes, work):
    """{node: work(node)}, run on every node at once: each lbctl start costs
    seconds in the emulated lab, and the nodes do not share anything it reads."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        return dict(zip(nodes, pool.map(work, nodes)))


@pytest.fixture(scope="module")
def applied(lab):
    """The failover pair in place (keepalived running), so a bad apply has much to break."""
    path = lab.reset(PAIR, "pair")
    lab.wait_for(lambda: lab.vrrp_state("lb1") == "MASTER", what="lb1 master")
    return path


@pytest.mark.parametrize("case", bad_cases(), ids=lambda c: c.name)
def test_bad_input_is_refused_and_changes_nothing(lab, applied, case):
    nodes = ("lb1", "pi1")
    before = _on_each(nodes, lambda node: _snapshot(lab, node))
    results = _on_each(nodes, lambda node: lab.lbctl(node, "apply", str(case.path)))
    for node, result in results.items():
        assert result.returncode == 1, f"{node}: {result.stdout}"
        found = error_lines(result.stderr, case.path)
        assert any((l, c) == (case.line, case.col) and case.text in m for l, c, m in found), \
            result.stderr
        assert "Traceback" not in result.stderr
    assert _on_each(nodes, lambda node: _snapshot(lab, node)) == before
