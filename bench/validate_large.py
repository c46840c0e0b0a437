"""Reading a large cluster file: `lbctl validate` against bare YAML parsers, in one run.

Writes files of N services (default 5,000 and 50,000) and runs, each in a
fresh process, as a user would:

  lbctl validate FILE              load, check every field, report FILE:LINE:COL
  libyaml (yaml.CSafeLoader)       the peer: parse only, in C, nothing checked
  PyYAML (yaml.SafeLoader)         parse only, in Python

It prints wall time and peak RSS of each, with the ratio to libyaml.  It needs
no IPVS and changes nothing outside a private temporary folder.  Machines are
noisy: compare the ratios, and take the best of several runs.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from large_cluster import many_services  # noqa: E402

PARSE = "import sys, yaml; yaml.load(open(sys.argv[1]), Loader=yaml.{loader})"


def measure(argv):
    """(seconds, peak RSS in MiB) of one process, from its own rusage."""
    # stderr goes to a file, not a pipe: a pipe nobody reads until the exit
    # would block a process that reports thousands of errors.
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"{argv[:4]} failed: {err.read().decode()[:2000]}")
    return seconds, usage.ru_maxrss / 1024


def best(argv, runs):
    results = [measure(argv) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--runs", type=int, default=3, help="best of this many (default 3)")
    args = parser.parse_args()
    python = sys.executable
    print(f"{'services':>8}  {'what':<28} {'seconds':>8} {'x libyaml':>9} {'peak MiB':>9}")
    with tempfile.TemporaryDirectory(prefix="lbctl-bench-") as folder:
        for count in args.services:
            path = Path(folder) / f"services-{count}.yaml"
            path.write_text(many_services(count))
            rows = [("libyaml (CSafeLoader)",
                     [python, "-c", PARSE.format(loader="CSafeLoader"), str(path)]),
                    ("lbctl validate", [python, "-m", "lbctl", "validate", str(path)]),
                    ("PyYAML (SafeLoader)",
                     [python, "-c", PARSE.format(loader="SafeLoader"), str(path)])]
            floor = None
            for label, argv in rows:
                seconds, peak = best(argv, args.runs)
                floor = floor or seconds
                print(f"{count:>8}  {label:<28} {seconds:>8.2f} {seconds / floor:>8.2f}x "
                      f"{peak:>9.0f}")


if __name__ == "__main__":
    main()
