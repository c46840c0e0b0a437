"""Every benchmark with a section in docs/benchmarks.md, one after the other,
in one lab VM, each at its full size: bench/run.py (`./dev.sh bench`) runs
this there."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("dataplane.py", "ipvs_apply.py", "schedulers.py", "failover.py", "ecmp.py")


def main():
    chosen = sys.argv[1:] or BENCHMARKS
    unknown = set(chosen) - set(BENCHMARKS)
    if unknown:
        sys.exit(f"bench: no benchmark {', '.join(sorted(unknown))}; "
                 f"they are {', '.join(BENCHMARKS)}")
    failed = []
    for script in chosen:
        print(f"\n=== bench/{script}", flush=True)
        if subprocess.run([sys.executable, str(HERE / script)]).returncode:
            failed.append(script)
    if failed:
        sys.exit(f"bench: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
