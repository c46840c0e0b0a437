"""Every bad cluster file gives a FILE:LINE:COL error naming the problem, and exit 1."""

import pytest

from bad_cases import bad_cases, error_lines
from lbctl.cli import main

CASES = bad_cases()


def test_there_are_at_least_twenty_bad_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_validate_reports_position_and_message(case, capsys):
    assert main(["validate", str(case.path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    found = error_lines(captured.err, case.path)
    assert found, captured.err
    assert any((line, col) == (case.line, case.col) and case.text in message
               for line, col, message in found), captured.err


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_errors_show_the_source_line_with_a_caret(case, capsys):
    main(["validate", str(case.path)])
    lines = capsys.readouterr().err.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith(str(case.path)))
    source = case.path.read_text().split("\n")[int(lines[head].split(":")[1]) - 1]
    # A control character is shown as its picture (ESC as U+241B), never sent as it is.
    shown = "".join(chr(0x2400 + ord(ch)) if ord(ch) < 0x20 and ch != "\t" else ch
                    for ch in source)
    assert lines[head + 1] == f"    {shown}"
    col = int(lines[head].split(":")[2])
    assert lines[head + 2] == "    " + " " * (col - 1) + "^"


def test_all_errors_are_reported_at_once(tmp_path, capsys):
    bad = tmp_path / "two.yaml"
    bad.write_text("cluster: pi-web\nbalancers:\n  lb1: {address: 192.168.100.2}\n"
                   "workers:\n  pi1: {address: 192.168.100.3, weight: -1}\n"
                   "services:\n  web: {vip: 192.168.100.10, port: 99999}\n")
    assert main(["validate", str(bad)]) == 1
    found = error_lines(capsys.readouterr().err, bad)
    assert [(l, c) for l, c, _ in found] == [(5, 41), (7, 36)]
