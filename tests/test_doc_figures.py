"""The figures the README quotes come from docs/benchmarks.md, whose sections
the benchmarks write themselves (`./dev.sh bench`): a rerun that moves a
figure fails here until the README quotes the new one, so the two never
tell a reader different things."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A figure: a number and its unit (a ratio, a share, seconds).
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(x\b|%| s\b)")
SECTION = re.compile(r"<!-- (bench/\S+): start -->\n(.*?)<!-- \1: end -->", re.S)


def written_by_benchmarks(text):
    """What the benchmarks wrote into benchmarks.md: its marked sections."""
    return "\n".join(found[2] for found in SECTION.finditer(text))


def quoting_paragraphs(readme):
    """The README's paragraphs that quote measured figures: the one under
    "Why direct routing" that begins "Measured in the lab", and the one under
    "Benchmarks" that gives the headline."""
    paragraphs = readme.split("\n\n")
    return [p for p in paragraphs if p.startswith("Measured in the lab") or
            p.startswith("`./dev.sh bench` builds the lab")]


def unsourced(paragraph, source):
    """The figures of `paragraph` that no figure of `source` with the same
    unit rounds to, at the precision shown."""
    measured = {}
    for number, unit in FIGURE.findall(source):
        measured.setdefault(unit, []).append(float(number))
    missing = []
    for number, unit in FIGURE.findall(paragraph):
        places = len(number.partition(".")[2])
        half = 0.5 * 10 ** -places + 1e-9
        if not any(abs(value - float(number)) <= half for value in measured.get(unit, ())):
            missing.append(f"{number}{unit}")
    return missing


def test_the_readme_quotes_only_what_the_benchmarks_wrote():
    readme = (REPO / "README.md").read_text()
    source = written_by_benchmarks((REPO / "docs" / "benchmarks.md").read_text())
    paragraphs = quoting_paragraphs(readme)
    assert len(paragraphs) == 2, "the README's paragraphs of figures were not found"
    quoted = [figure for p in paragraphs for figure in FIGURE.findall(p)]
    assert len(quoted) >= 15, quoted  # every headline figure is checked, not a few
    for paragraph in paragraphs:
        assert unsourced(paragraph, source) == [], paragraph


def test_a_figure_the_benchmarks_never_wrote_is_found():
    source = "| direct routing | 8 | 9.32 | 7.45x | 93% | 1.79% |\n| lbctl | 0.69 s | 37.74 s |"
    assert unsourced("served 7.45x, 93%, 1.8% and 0.69 s; 38 s", source) == []
    # Another figure, a unit mixed up, a rounding the source does not give.
    assert unsourced("served 7.46x, 93 s, 1.7% and 0.7x", source) == ["7.46x", "93 s", "1.7%",
                                                                      "0.7x"]
    assert written_by_benchmarks("7.45x\n<!-- bench/a.py: start -->\n| 1.5x |\n"
                                 "<!-- bench/a.py: end -->\n9.9x") == "| 1.5x |\n"
