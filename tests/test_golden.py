"""Golden files: each cluster under tests/golden/ and the plan every node gets on a fresh host.

After a deliberate change, `./dev.sh golden` rewrites the .plan files; read
the diff before committing it.  The test itself only compares, so it cannot
pass by writing what it then reads.
"""

import sys
from pathlib import Path

import pytest

from lbctl.config import load_cluster
from lbctl.engine.desired import KEEPALIVED_SCRIPTS, BootApply, desired_state
from lbctl.engine.plan import format_plan, make_plan
from lbctl.layout import Layout
from lbctl.state import NodeState, Ownership

GOLDEN = Path(__file__).parent / "golden"


def render_fresh_plans(path):
    cluster = load_cluster(path)
    parts = []
    for node in list(cluster.balancers) + list(cluster.workers):
        boot = BootApply(Path(path).read_text(), "/opt/lbctl/bin/python")
        desired = desired_state(cluster, node, "eth0", boot=boot,
                                layout=Layout(cluster.name))
        empty = NodeState(desired.role, node, cluster.name)
        plan = make_plan(desired, empty, Ownership())
        parts.append(format_plan(plan))
        for change in plan.changes:
            # The saved cluster file and keepalived's scripts are copies, not renders.
            if change.kind == "file" and not change.key.endswith((".yaml", *KEEPALIVED_SCRIPTS)):
                parts.append(f"--- {change.key}\n{change.new.content.rstrip()}")
    return "\n\n".join(parts) + "\n"


@pytest.mark.parametrize("cluster", sorted(GOLDEN.glob("*.yaml")), ids=lambda p: p.stem)
def test_plan_matches_golden(cluster):
    assert render_fresh_plans(cluster) == cluster.with_suffix(".plan").read_text()


def update():
    """Rewrite every .plan file from what lbctl renders now; print the changed ones."""
    for cluster in sorted(GOLDEN.glob("*.yaml")):
        path = cluster.with_suffix(".plan")
        actual = render_fresh_plans(cluster)
        if not path.exists() or path.read_text() != actual:
            path.write_text(actual)
            print(f"rewrote {path}")


if __name__ == "__main__":
    sys.exit(update())
