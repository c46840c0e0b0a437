"""A fleet change shows what it will do and asks first, as `terraform apply` does.

apply --all (with or without --remove) and rollout change every node of a
cluster.  On a terminal they show the change and go ahead only on "y";
`--yes` skips the question for scripts.  Without a terminal and without
`--yes` there is nobody to ask, so they refuse before contacting any node:
a script that forgot `--yes` fails at once instead of changing the fleet
unseen or hanging on a question nobody reads.
"""

import sys

from lbctl.errors import LbctlError


class NotConfirmed(LbctlError):
    """A fleet change that nobody agreed to: nothing was changed."""


def on_terminal(stdin=None, out=None):
    """Both ends are a terminal: a person sees the question and can answer it."""
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if out is None else out
    return _isatty(stdin) and _isatty(out)


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def require_a_way_to_ask(what, yes, stdin=None, out=None):
    """Refuse `what` (before anything is contacted) when it would have to ask
    and cannot: no `--yes`, and no terminal."""
    if yes or on_terminal(stdin, out):
        return
    raise NotConfirmed(f"{what} asks before it changes the nodes, and there is no terminal "
                       "to ask on: pass --yes to go ahead without asking; nothing was changed")


def ask(question, stdin=None, out=None):
    """Ask on the terminal; True only for y or yes.  End of input is a no."""
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if out is None else out
    out.write(f"{question} [y/N] ")
    out.flush()
    answer = stdin.readline()
    if not answer.endswith("\n"):
        out.write("\n")
    return answer.strip().lower() in ("y", "yes")
