"""Bad cluster files are refused with FILE:LINE:COL and leave the node exactly as it was."""

from pathlib import Path

import pytest

from bad_cases import bad_cases, error_lines


def _snapshot(lab, node):
    return (lab.ipvs_rules(node) if node == "lb1" else None,
            lab.sh(node, ["ip", "-4", "-o", "address"]).stdout,
            lab.sh(node, ["sysctl", "net.ipv4.conf.all.arp_ignore",
                          "net.ipv4.conf.eth0.arp_ignore"]).stdout,
            sorted(str(p) for p in Path(lab.nodes[node].root).rglob("*")))


@pytest.fixture(scope="module")
def applied(lab):
    """The base cluster in place, so there is something a bad apply could break."""
    return lab.reset()


@pytest.mark.parametrize("case", bad_cases(), ids=lambda c: c.name)
def test_bad_input_is_refused_and_changes_nothing(lab, applied, case):
    before = {node: _snapshot(lab, node) for node in ("lb1", "pi1")}
    for node in ("lb1", "pi1"):
        result = lab.lbctl(node, "apply", str(case.path))
        assert result.returncode == 1, result.stdout
        found = error_lines(result.stderr, case.path)
        assert any((l, c) == (case.line, case.col) and case.text in m for l, c, m in found), \
            result.stderr
        assert "Traceback" not in result.stderr
    assert {node: _snapshot(lab, node) for node in ("lb1", "pi1")} == before
