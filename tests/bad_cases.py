"""The bad cluster files under tests/cases/bad, each with the error it must give.

The first line of each file says where and what: `# expect: LINE:COL text`.
Both the unit tests (message and position) and the netns suite (the kernel is
left unchanged) use them.
"""

import re
from dataclasses import dataclass
from pathlib import Path

CASES_DIR = Path(__file__).parent / "cases" / "bad"
_EXPECT = re.compile(r"^# expect: (\d+):(\d+) (.+)$")


@dataclass(frozen=True)
class BadCase:
    path: Path
    line: int
    col: int
    text: str

    @property
    def name(self):
        return self.path.stem


def bad_cases():
    cases = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        m = _EXPECT.match(path.read_text().splitlines()[0])
        assert m, f"{path} lacks its '# expect: LINE:COL text' line"
        cases.append(BadCase(path, int(m[1]), int(m[2]), m[3]))
    return cases


def error_lines(stderr, path):
    """The FILE:LINE:COL lines of lbctl's stderr, as (line, col, message)."""
    found = []
    for raw in stderr.splitlines():
        m = re.match(rf"^{re.escape(str(path))}:(\d+):(\d+): (.*)$", raw)
        if m:
            found.append((int(m[1]), int(m[2]), m[3]))
    return found
