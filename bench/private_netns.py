"""What the IPVS benchmarks share: a kernel with IPVS, and a network namespace of
their own, so a benchmark never touches the host's IPVS table."""

import os
import subprocess
import sys

INSIDE = "--inside"  # the flag a benchmark gets once it runs in its namespace


def run_inside_private_netns():
    """Return when this process is in its own namespace; else re-run it in one."""
    if not os.path.exists("/proc/net/ip_vs"):
        subprocess.run(["modprobe", "-q", "ip_vs"], check=False)
    if not os.path.exists("/proc/net/ip_vs"):
        sys.exit("bench: this kernel has no IPVS; run: python -m lbctl.lab.vm -- "
                 f"{sys.executable} {' '.join(sys.argv)}")
    if INSIDE in sys.argv:
        return
    os.execvp("unshare", ["unshare", "--net", "--", sys.executable,
                          os.path.abspath(sys.argv[0]), *sys.argv[1:], INSIDE])


def run_benchmark(parser, body):
    """Parse the benchmark's arguments, move into a namespace of its own, then
    run `body(args)` there."""
    import argparse

    parser.add_argument(INSIDE, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    run_inside_private_netns()
    body(args)
