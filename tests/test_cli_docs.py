"""Shell completion and the man page, both made from the parser: every
command and flag the parser has is in them, and bash really completes them.

The parser is walked here on its own (not with the generator's walker), so
a generator that drops a level or a flag fails these tests.
"""

import argparse
import os
import re
import subprocess
import sys

import pytest

from lbctl.cli import build_parser
from lbctl.commands.completion import bash_script, manpage, zsh_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def every_level(parser, path=("lbctl",)):
    """{command path: set of its option strings}, found by walking argparse."""
    found = {path: set()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(every_level(sub, (*path, name)))
        else:
            found[path] |= set(action.option_strings)
    return found


LEVELS = every_level(build_parser())


def complete(words, script=None):
    """What bash's completion offers after `words` (the last one being typed)."""
    script = script or bash_script(build_parser())
    line = " ".join(words)
    program = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
               "_lbctl; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True,
                          text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_bash_script_is_valid_bash():
    done = subprocess.run(["bash", "-n"], input=bash_script(build_parser()), text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", [p for p in LEVELS if len(p) > 1], ids=" ".join)
def test_bash_completes_every_command_and_each_of_its_flags(path):
    # The command's name, from its first letters.
    assert path[-1] in complete([*path[:-1], path[-1][:2]])
    # Every flag of that command, from a lone dash.
    assert LEVELS[path] <= complete([*path, "-"]), path


def test_bash_completes_top_level_flags_and_files_where_a_file_goes():
    assert {"--version", "--debug", "--expect-version"} <= complete(["lbctl", "--"])
    assert "examples" in complete(["lbctl", "plan", "exa"])  # the cluster file
    assert "examples" in complete(["lbctl", "plan", "f", "--ssh-config", "exa"])
    assert complete(["lbctl", "plan", "f", "--node", "exa"]) == set()  # a name, not a file


def test_zsh_gets_the_same_completion_through_bashcompinit():
    script = zsh_script(build_parser())
    assert script.startswith("#compdef lbctl\n")
    assert "bashcompinit" in script and bash_script(build_parser()) in script


def test_the_man_page_is_clean_roff_and_names_every_command_and_flag():
    roff = manpage(build_parser())
    warnings = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=roff, text=True,
                              capture_output=True)
    assert warnings.returncode == 0 and warnings.stderr == "", warnings.stderr
    shown = subprocess.run(["groff", "-man", "-Tascii", "-rLL=200n"], input=roff, text=True,
                           capture_output=True, check=True).stdout
    shown = re.sub(".\b", "", shown)  # overstrikes for bold
    for path, flags in LEVELS.items():
        if len(path) > 1 and not (path == ("lbctl", "lab")):
            assert " ".join(path[1:]) in shown, path
        for flag in flags:
            assert flag in shown, (path, flag)
    assert "EXIT STATUS" in shown and "64 usage" in shown


def test_the_commands_print_them(capsys):
    from lbctl.cli import main

    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == bash_script(build_parser())
    assert main(["manpage"]) == 0
    assert capsys.readouterr().out.startswith(".TH LBCTL 8")
    assert sys.modules.get("lbctl.commands.completion") is not None
