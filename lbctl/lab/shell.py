"""Running the lab's helper programs, with failures as LabError."""

import subprocess

from lbctl.errors import LabError


def run(argv, check=True, **kw):
    """Run argv (never through a shell) and return the CompletedProcess."""
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
    return done
