"""A fleet change shows what it will do and asks first, as `terraform apply` does.

apply --all (with or without --remove) and rollout change every node of a
cluster.  When a person can answer (standard input is a terminal) they show
the change and go ahead only on "y"; `--yes` skips the question for scripts.
Without a terminal and without `--yes` there is nobody to ask, so they
refuse before contacting any node: a script that forgot `--yes` fails at
once instead of changing the fleet unseen or hanging on a question nobody
reads.  Standard output may be a pipe (`| tee change.log`): the question
then goes to standard error, where the person still sees it.
"""

import sys

from lbctl.errors import LbctlError


class NotConfirmed(LbctlError):
    """A fleet change that nobody agreed to: nothing was changed."""


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def _asking_on(out, err):
    """Where the question goes: the output if it is a terminal, else standard
    error if that is one; None when neither would reach a person."""
    err = sys.stderr if err is None else err
    return out if _isatty(out) else err if _isatty(err) else None


def require_a_way_to_ask(what, yes, stdin=None, out=None, err=None):
    """Refuse `what` (before anything is contacted) when it would have to ask
    and cannot: no `--yes`, and no terminal to ask on."""
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if out is None else out
    if yes or (_isatty(stdin) and _asking_on(out, err) is not None):
        return
    raise NotConfirmed(f"{what} asks before it changes the nodes, and there is no terminal "
                       "to ask on: pass --yes to go ahead without asking; nothing was changed")


# What a fleet command says when the answer was no (or Ctrl-C).
CANCELLED = "cancelled; nothing was changed"


def ask(question, stdin=None, out=None, err=None):
    """Ask on the terminal; True only for y or yes.  End of input is a no.
    What was typed before the question (while the plans came in) is dropped:
    only an answer to the question shown counts."""
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if out is None else out
    where = _asking_on(out, err) or out
    _drop_typed_ahead(stdin)
    where.write(f"{question} [y/N] ")
    where.flush()
    try:
        answer = stdin.readline()
    except KeyboardInterrupt:
        where.write(f"\n{CANCELLED}\n")
        where.flush()
        raise
    if not answer.endswith("\n"):
        where.write("\n")
    return answer.strip().lower() in ("y", "yes")


def _drop_typed_ahead(stdin):
    try:
        import termios

        termios.tcflush(stdin.fileno(), termios.TCIFLUSH)
    except (ImportError, AttributeError, ValueError, OSError):
        pass  # not a real terminal (a test's stream): nothing buffered there
