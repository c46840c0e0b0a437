"""lbctl completion bash|zsh, and lbctl manpage: both made from the parser.

Made from the parser itself, never written by hand, so a new command or
flag is completed and documented the day it is added (tests/test_cli_docs.py
walks the parser on its own and checks both outputs).
"""

import argparse
import re
from dataclasses import dataclass, field

from lbctl import __version__


@dataclass
class Command:
    """One command line level: `lbctl`, `lbctl plan`, `lbctl lab demo`."""

    path: tuple  # ("lbctl", "lab", "demo")
    help: str = ""
    subcommands: list = field(default_factory=list)  # [(name, help)]
    options: list = field(default_factory=list)  # [argparse.Action] with option strings
    positionals: list = field(default_factory=list)  # [argparse.Action]


def commands(parser, path=("lbctl",), help_text=""):
    """Every level of the command line, the top first."""
    here = Command(path, help_text or parser.description or "")
    below = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                here.subcommands.append((name, helps.get(name, "")))
                below.append((name, sub, helps.get(name, "")))
        elif action.option_strings:
            if action.help != argparse.SUPPRESS:  # lbctl's own, between its processes
                here.options.append(action)
        else:
            here.positionals.append(action)
    yield here
    for name, sub, text in below:
        yield from commands(sub, (*path, name), text)


def takes_value(action):
    return action.nargs != 0 and not isinstance(
        action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction,
                 argparse._VersionAction, argparse._CountAction, argparse._StoreConstAction))


def run(args, out):
    from lbctl.cli import build_parser

    parser = build_parser()
    if args.command == "manpage":
        out.write(manpage(parser))
    else:
        out.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0


# -- bash and zsh ------------------------------------------------------------

def bash_script(parser):
    levels = list(commands(parser))
    known = [" ".join(c.path) for c in levels]
    lines = [
        "# bash completion for lbctl, made by `lbctl completion bash` from lbctl's parser.",
        f"# lbctl {__version__}.  Installed by `lbctl install --all` as",
        "# /usr/local/share/bash-completion/completions/lbctl, where bash-completion finds it.",
        "_lbctl() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local path=lbctl i words="" flags=""',
        "    # The command the words so far name: lbctl, lbctl plan, lbctl lab demo.",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "$path ${COMP_WORDS[i]}" in',
        "            " + "|".join(_quoted(k) for k in known[1:]) + ') path="$path ${COMP_WORDS[i]}" ;;',
        "        esac",
        "    done",
        "    # After a flag that takes a value: its choices, files (FILE), folders",
        "    # (DIR), else nothing: a name or a number is the user's to type.",
        '    case "$path $prev" in',
    ]
    kinds = {"-f": [], "-d": [], "": []}
    choices = {}
    for level in levels:
        for action in level.options:
            if not takes_value(action):
                continue
            for flag in action.option_strings:
                key = _quoted(" ".join(level.path) + " " + flag)
                if action.choices:
                    choices.setdefault(" ".join(map(str, action.choices)), []).append(key)
                else:
                    kinds[{"FILE": "-f", "DIR": "-d"}.get(action.metavar, "")].append(key)
    for words, keys in choices.items():
        lines.append(f"        {'|'.join(keys)}) COMPREPLY=($(compgen -W {_quoted(words)} "
                     '-- "$cur")); return ;;')
    for kind, keys in kinds.items():
        if keys:
            reply = f'$(compgen {kind} -- "$cur")' if kind else ""
            lines.append(f"        {'|'.join(keys)}) COMPREPLY=({reply}); return ;;")
    lines += ["    esac", '    case "$path" in']
    for level in levels:
        flags = sorted(f for a in level.options for f in a.option_strings)
        # Subcommands, or the choices of a positional (completion's SHELL).
        names = [name for name, _ in level.subcommands] or [
            str(choice) for a in level.positionals for choice in a.choices or ()]
        lines.append(f"        {_quoted(' '.join(level.path))})")
        lines.append(f"            words={_quoted(' '.join(names))}")
        lines.append(f"            flags={_quoted(' '.join(flags))} ;;")
    lines += [
        "    esac",
        '    if [[ $cur == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$flags" -- "$cur"))',
        '    elif [[ -n $words ]]; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    else",
        '        COMPREPLY=($(compgen -f -- "$cur"))  # the cluster file, a worker\'s name',
        "    fi",
        "}",
        "complete -o filenames -F _lbctl lbctl",
        "",
    ]
    return "\n".join(lines)


def zsh_script(parser):
    """zsh runs the bash function through its bashcompinit layer.

    Installed as _lbctl in $fpath, this file is autoloaded as the
    completion function on the first Tab: it must complete that Tab itself
    as well as set up the later ones.  Sourced, it only sets them up."""
    return ("#compdef lbctl\n"
            "# zsh completion for lbctl, made by `lbctl completion zsh` from lbctl's parser.\n"
            "# Install: lbctl completion zsh > ~/.zfunc/_lbctl, with fpath=(~/.zfunc $fpath)\n"
            "# before compinit in ~/.zshrc; or source <(lbctl completion zsh) after it.\n"
            "autoload -U +X bashcompinit && bashcompinit\n"
            + bash_script(parser)
            + 'if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then\n'
            + '    _bash_complete -o filenames -F _lbctl "$@"\n'
            + "fi\n")


def _quoted(text):
    """A word for bash's case patterns and assignments: single quotes, always."""
    return "'" + text.replace("'", "'\\''") + "'"


# -- the man page --------------------------------------------------------------

def manpage(parser):
    from lbctl import cli

    levels = list(commands(parser))
    top = levels[0]
    out = [f'.TH LBCTL 8 "" "lbctl {__version__}" "System Administration"',
           ".SH NAME", r"lbctl \- " + _roff(top.help[:1].lower() + top.help[1:].rstrip(".")),
           ".SH SYNOPSIS", r".B lbctl", r"[\fIOPTIONS\fR] \fICOMMAND\fR [\fIARGS\fR]",
           ".SH DESCRIPTION",
           _roff("lbctl manages Linux IPVS load balancers in direct-routing mode from one "
                 "cluster file: IPVS on the balancers (by itself, or through keepalived "
                 "with health checks and failover), the VIP and ARP settings on the workers, "
                 "and BIRD in mode ecmp.  plan shows what apply would change; --all runs a "
                 "command on every node over SSH."),
           ".SH OPTIONS"]
    out += _options(top.options)
    out.append(".SH COMMANDS")
    everywhere = {f for a in top.options for f in a.option_strings}  # said once, above
    for level in levels[1:]:
        own = [a for a in level.options if not set(a.option_strings) & everywhere]
        if level.subcommands and not own and not level.positionals:
            continue
        usage = " ".join(level.path[1:] + tuple(_positional(a) for a in level.positionals))
        out += [f'.SS "{_roff(usage)}"', _roff(level.help)]
        for action in level.positionals:
            if action.help:
                out += [".TP", rf"\fI{_roff(action.dest.upper())}\fR", _roff(action.help)]
        out += _options(own)
    out += [".SH EXIT STATUS", _roff(_exit_text(cli.__doc__)),
            ".SH ENVIRONMENT", ".TP", ".B LBCTL_ROOT",
            _roff("prefix for the files lbctl writes, as --root (refused under sudo)"),
            ".SH FILES", ".TP", r".I /etc/lbctl/", _roff("the cluster's files on a node"),
            ".TP", r".I /var/lib/lbctl/", _roff("what lbctl owns on a node, and its records"),
            ".SH SEE ALSO", r"\fBipvsadm\fR(8), \fBkeepalived\fR(8), \fBbird\fR(8), "
            r"\fBssh_config\fR(5)", ""]
    return "\n".join(out)


def _options(actions):
    out = []
    for action in actions:
        if action.help == argparse.SUPPRESS:
            continue
        flags = ", ".join(rf"\fB{_roff(f)}\fR" for f in action.option_strings)
        if takes_value(action):
            flags += rf" \fI{_roff(action.metavar or action.dest.upper())}\fR"
        out += [".TP", flags, _roff(action.help or "")]
    return out


def _positional(action):
    name = action.metavar or action.dest.upper()
    return f"[{name}]" if action.nargs == "?" else name


def _exit_text(doc):
    text = " ".join(doc.split("Exit codes:", 1)[1].split())
    return re.sub(r"\s+", " ", text)


def _roff(text):
    """Plain text as roff: backslashes and dashes escaped, no line read as a request."""
    text = text.replace("\\", r"\e").replace("-", r"\-")
    return "\n".join(r"\&" + line if line[:1] in (".", "'") else line
                     for line in text.splitlines()) or ""
