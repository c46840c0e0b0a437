"""Every benchmark with a section in docs/benchmarks.md, one after the other,
in one lab VM, each at its full size: bench/run.py (`./dev.sh bench`) runs
this there."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("dataplane.py", "ipvs_apply.py", "schedulers.py", "failover.py")


def main():
    failed = []
    for script in BENCHMARKS:
        print(f"\n=== bench/{script}", flush=True)
        if subprocess.run([sys.executable, str(HERE / script)]).returncode:
            failed.append(script)
    if failed:
        sys.exit(f"bench: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
