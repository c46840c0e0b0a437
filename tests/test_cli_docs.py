"""Shell completion and the man page, both made from the parser: every
command and flag the parser has is in them, and bash really completes them.

The parser is walked here on its own (not with the generator's walker), so
a generator that drops a level or a flag fails these tests.
"""

import argparse
import os
import re
import subprocess

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
        elif action.help != argparse.SUPPRESS:  # hidden flags are apply --all's own
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


def test_hidden_flags_are_neither_completed_nor_documented():
    assert "--expect-plan" not in complete(["lbctl", "apply", "--"])
    assert "expect\\-plan" not in manpage(build_parser()) and "fingerprint" not in manpage(build_parser())


def test_bash_completes_choices_and_folders_where_they_go():
    assert complete(["lbctl", "completion", ""]) == {"bash", "zsh"}
    assert complete(["lbctl", "plan", "f", "--root", "exa"]) == {"examples"}
    assert complete(["lbctl", "plan", "f", "--root", "READ"]) == set()  # a file, not a folder


# A real zsh on a pseudo-terminal: the completion file in $fpath, compinit,
# the words typed, one Tab and Enter.  `lbctl` is a shell function here that
# prints the words it was given, so the line as completed comes back.
ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PS1='> '; fpath=($1 \$fpath); autoload -U compinit && compinit -u -D"
zpty -w z 'lbctl() { print -r -- "AR""GS<$*>"; }'
zpty -w -n z "$2"$'\t'$'\r'
zpty -r z out '*ARGS<*>*'
print -r -- "${${out##*ARGS<}%%>*}"
zpty -d z
"""


def zsh_completes(folder, typed):
    (folder / "_lbctl").write_text(zsh_script(build_parser()))
    (folder / "drive.zsh").write_text(ZSH_DRIVER)
    done = subprocess.run(["zsh", "-f", str(folder / "drive.zsh"), str(folder), typed],
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_zsh_completes_from_the_first_tab_when_installed_in_fpath(tmp_path):
    # Each is a fresh zsh, so each Tab is the one that autoloads the file.
    assert zsh_completes(tmp_path, "lbctl manp") == "manpage"
    assert zsh_completes(tmp_path, "lbctl completion z") == "completion zsh"
    assert zsh_completes(tmp_path, "lbctl drain-b") == "drain-balancer"


def test_the_man_page_is_clean_roff_and_names_every_command_and_flag():
    roff = manpage(build_parser())
    warnings = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=roff, text=True,
                              capture_output=True)
    assert warnings.returncode == 0 and warnings.stderr == "", warnings.stderr
    shown = subprocess.run(["groff", "-man", "-Tascii", "-rLL=200n"], input=roff, text=True,
                           capture_output=True, check=True).stdout
    shown = re.sub(".\b", "", shown)  # overstrikes for bold
    # Each command has its own section, headed by its usage line.
    headings = [h.replace("\\-", "-").split()
                for h in re.findall(r'^\.SS "(.*)"$', roff, re.M)]
    for path, flags in LEVELS.items():
        if len(path) > 1 and path != ("lbctl", "lab"):  # lab: only `lab demo` runs
            assert any(h[:len(path) - 1] == list(path[1:]) for h in headings), path
        for flag in flags:
            assert flag in shown, (path, flag)
    assert "EXIT STATUS" in shown and "64 usage" in shown


def test_the_commands_print_them(capsys):
    from lbctl.cli import main

    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == bash_script(build_parser())
    assert main(["manpage"]) == 0
    assert capsys.readouterr().out == manpage(build_parser())
