"""Where one lbctl command's time goes, measured inside that command.

    python bench/breakdown.py IMPORTS -- ARGV...

runs `lbctl ARGV...` in this process with a clock around each of its parts,
and prints one JSON line: {part: seconds}.  IMPORTS is a file of module
names (what `python -X importtime` printed for the same command, see
imported_modules()): they are imported first and timed as "imports", so no
part below pays for an import it happens to trigger.  The command's output
is thrown away.

Each part's time is its own: a part called inside another (the dump apply's
writes read back) is taken out of the outer one.  "the rest" is what the
command spent outside every part (node facts, records, locks, output).  The
caller measures the whole process from outside too; what this process did
not measure itself is the interpreter's start.
"""

import importlib
import io
import json
import re
import sys
import time
from contextlib import redirect_stdout

# (part, module, attribute): the function, or Class.method, behind each part.
PARTS = (
    ("read and validate the file", "lbctl.config", "load_cluster"),
    ("kernel dump: netlink round trips", "lbctl.adapters.ipvs_wire", "GenlSocket.dump"),
    ("kernel dump: decoding", "lbctl.adapters.ipvs", "IpvsNetlink.dump"),
    ("kernel dump: decoding", "lbctl.adapters.ipvs", "IpvsNetlink.snapshot"),
    ("desired state", "lbctl.engine.desired", "desired_state"),
    ("observed state", "lbctl.engine.observe", "observe"),
    ("plan", "lbctl.engine.plan", "make_plan"),
    ("writes", "lbctl.engine.execute", "execute"),
    ("status: gathering", "lbctl.status.collect", "collect"),
    ("status: formatting", "lbctl.status.render", "format_status"),
)

# The rows a breakdown table shows around the measured parts: what the
# benchmark adds from outside the command's clocks.
FIRST_ROWS = ("interpreter start", "imports")
LAST_ROWS = ("the rest", "the whole command", "-X importtime, its imports")


def ordered_rows(found):
    """The rows of a table of breakdowns ({label: {part: seconds}}): the
    start and the imports, then each part measured in the order the
    commands run them, then the totals."""
    order = list(dict.fromkeys(part for part, _module, _attribute in PARTS))
    measured = {part for parts in found.values() for part in parts}
    middle = sorted(measured - set(FIRST_ROWS) - set(LAST_ROWS), key=order.index)
    return list(FIRST_ROWS) + middle + list(LAST_ROWS)


IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)")


def imported_modules(importtime_text):
    """The modules a `-X importtime` run imported, in the order it finished
    them, and the seconds its top-level imports took in all."""
    names, total_us = [], 0
    for line in importtime_text.splitlines():
        found = IMPORT_LINE.match(line)
        if found:
            names.append(found[3])
            if len(found[2]) == 1:  # one space: imported by the command, not by a module
                total_us += int(found[1])
    return names, total_us / 1e6


class Clocks:
    """Exclusive seconds per part, kept across nested calls."""

    def __init__(self):
        self.seconds = {}
        self.stack = []  # [seconds spent in parts called inside the current one]

    def wrap(self, part, func):
        def timed(*args, **kwargs):
            self.stack.append(0.0)
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                inner = self.stack.pop()
                self.seconds[part] = self.seconds.get(part, 0.0) + spent - inner
                if self.stack:
                    self.stack[-1] += spent
        timed.__wrapped__ = func
        return timed


def install(clocks):
    """Put each part's clock wherever its function is looked up: its class,
    or every lbctl module that imported it by name."""
    for part, module_name, attribute in PARTS:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        owner_name, _, method = attribute.rpartition(".")
        if owner_name:
            owner = getattr(module, owner_name)
            setattr(owner, method, clocks.wrap(part, getattr(owner, method)))
            continue
        original = getattr(module, attribute)
        timed = clocks.wrap(part, original)
        for loaded in list(sys.modules.values()):
            if getattr(loaded, "__name__", "").startswith("lbctl") and \
                    getattr(loaded, attribute, None) is original:
                setattr(loaded, attribute, timed)


def main():
    split = sys.argv.index("--")
    imports_file, argv = sys.argv[1], sys.argv[split + 1:]
    with open(imports_file) as fh:
        names = fh.read().split()
    start = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a module only importable where it was (__main__'s siblings)
    imports = time.perf_counter() - start
    from lbctl.cli import main as lbctl_main

    clocks = Clocks()
    install(clocks)
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        code = lbctl_main(argv)
    whole = time.perf_counter() - start
    if code != 0:
        sys.exit(f"bench: lbctl {' '.join(argv)} exited {code}")
    parts = {"imports": imports, **clocks.seconds,
             "the rest": whole - sum(clocks.seconds.values())}
    print(json.dumps(parts))


if __name__ == "__main__":
    main()
