"""Running the lab's helper programs, with failures as LabError."""

import subprocess

from lbctl.errors import LabError

# No lab helper runs this long (the slowest, a rollout driven over SSH, is
# given more by its caller): one that does is stuck, and must say so rather
# than hold the suite until CI's own limit cuts it off without a word.
DEFAULT_TIMEOUT = 600


def run(argv, check=True, timeout=DEFAULT_TIMEOUT, **kw):
    """Run argv (never through a shell) and return the CompletedProcess."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(map(str, argv))}: no answer after {timeout:g} s") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
    return done
