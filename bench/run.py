"""`./dev.sh bench [SCRIPT...]`: every benchmark (or those named, such as
failover.py) in one lab VM (bench/all.py), then their sections into
docs/benchmarks.md and their plots beside it.  Run here, outside the VM, because what
the VM writes is gone when it powers off; its output is what comes back."""

import subprocess
import sys
from pathlib import Path

from plots import draw_all
from report import write_sections

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"


# Run here, not in the VM: what they measure needs no IPVS, and emulation
# would bend it (bench/offline_plan.py).
ON_THIS_MACHINE = ("offline_plan.py",)


def main():
    chosen = sys.argv[1:]
    in_vm = [script for script in chosen if script not in ON_THIS_MACHINE]
    lines, status = [], 0
    if in_vm or not chosen:
        proc = subprocess.Popen([sys.executable, "-m", "lbctl.lab.vm", "--", sys.executable,
                                 str(REPO / "bench" / "all.py"), *in_vm],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\r\n"))  # the VM's console ends lines with \r\n
        status = proc.wait()
    for script in ON_THIS_MACHINE:
        if script in chosen or not chosen:
            done = subprocess.run([sys.executable, str(REPO / "bench" / script)], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True)
            sys.stdout.write(done.stdout)
            lines += done.stdout.splitlines()
            status = status or done.returncode
    output = "\n".join(lines)
    written = write_sections(DOC, output)
    print(f"\nbench: {', '.join(written) or 'no section'} written to {DOC.relative_to(REPO)}")
    for plot in draw_all(output, DOC.parent):
        print(f"bench: {plot.relative_to(REPO)} drawn")
    return status


if __name__ == "__main__":
    sys.exit(main())
