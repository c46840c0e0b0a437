"""The data-plane benchmark at its smallest, so CI proves it still runs.

Its figures are not asserted (a rate in an emulated VM is no test); the
bytes are: they are what direct routing is about.  With direct routing the
balancer receives only the requests and the client's ACKs, while a proxy
receives every response byte from a worker before it sends it on.
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rows(markdown):
    """{path: {"share": received per response byte, "failed": N}} of the table."""
    found = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[1].isdigit():
            complete, failed = re.fullmatch(r"(\d+) \((\d+)\)", cells[6]).groups()
            found[cells[0]] = {"share": float(cells[5].rstrip("%")) / 100,
                               "complete": int(complete), "failed": int(failed)}
    return found


def test_the_dataplane_benchmark_shows_the_balancer_skipped_by_the_responses(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/dataplane.py", "--workers", "2", "--proxy-workers", "2",
         "--seconds", "3"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    # The section it prints is what bench/run.py writes into the document.
    sys.path.insert(0, str(REPO / "bench"))
    from report import write_sections

    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkept as it was\n")
    assert write_sections(doc, done.stdout) == ["bench/dataplane.py"]
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nkept as it was\n\n<!-- bench/dataplane.py: start")
    measured = rows(text)
    assert set(measured) == {"direct routing", "haproxy", "pen", "nginx"}, text
    for path, m in measured.items():
        assert m["complete"] > 0 and m["failed"] == 0, (path, text)
    assert measured["direct routing"]["share"] < 0.05, text
    for proxy in ("haproxy", "pen", "nginx"):
        assert measured[proxy]["share"] > 1.0, text
