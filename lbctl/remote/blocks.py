"""How --all prints: a progress line on stderr, one short block per node."""

import sys

from lbctl.config.source import STDIN_NAME
from lbctl.errors import EXIT_CHANGES


def progress(text):
    print(f"lbctl: {text}", file=sys.stderr, flush=True)


def node_block(outcome, verdict=None, source=None):
    """`== node (role, host) SECONDS[: verdict]`, then what lbctl said there,
    indented.  `source`: the name of the file sent as standard input, which
    stands for "<stdin>" in the node's errors (file:line:col)."""
    t = outcome.target
    problem = outcome.problem()
    head = f"== {t.node} ({t.role}, {t.host})"
    if problem:
        return f"{head}: {problem}"
    body = outcome.stdout.rstrip().splitlines()
    if outcome.returncode not in (0, EXIT_CHANGES):  # else its stderr is only progress
        body += outcome.stderr.rstrip().splitlines()
    head += f" {outcome.seconds:.1f}s" + (f": {verdict}" if verdict else "")
    if source:
        body = [line.replace(f"{STDIN_NAME}:", f"{source}:") for line in body]
    return "\n".join([head] + [f"   {line}" for line in body])


def show_outcomes(targets, outcomes, out, source=None):
    """Print each node's block, marked ok or FAILED; the names that failed."""
    failed = []
    for target in targets:
        outcome = outcomes[target.node]
        ok = outcome.returncode == 0 and outcome.problem() is None
        out.write(node_block(outcome, "ok" if ok else "FAILED", source) + "\n")
        if not ok:
            failed.append(target.node)
    out.flush()
    return failed
