"""What the benchmarks share to write docs/benchmarks.md.

A benchmark prints its section between markers named after its script; the
lab VM's root is thrown away when it powers off, so bench/run.py, outside
the VM, reads them off the output and puts each in place of the old one."""

import math
import os
import re
import time
from pathlib import Path


def section(script, text):
    """`text` as `script`'s section of the document, between its markers."""
    return f"<!-- {script}: start -->\n{text}\n<!-- {script}: end -->"


def write_sections(path, output):
    """Every section in `output` into the Markdown file `path`: in place of the
    same script's old one, or added at the end.  Returns the scripts written."""
    path = Path(path)
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    written = []
    for match in re.finditer(r"^<!-- (\S+): start -->\n.*?^<!-- \1: end -->$", output,
                             re.M | re.S):
        script, block = match[1], match[0]
        start, end = f"<!-- {script}: start -->", f"<!-- {script}: end -->"
        if start in doc and end in doc:
            doc = doc[:doc.index(start)] + block + doc[doc.index(end) + len(end):]
        else:
            doc = doc.rstrip("\n") + "\n\n" + block + "\n"
        written.append(script)
    path.write_text(doc)
    return written


def percentile(values, share):
    """The nearest-rank percentile; None (a run that never got there) sorts last."""
    ranked = sorted(values, key=lambda v: math.inf if v is None else v)
    return ranked[max(0, math.ceil(share * len(ranked)) - 1)]


def machine():
    """Where and when the figures were measured: the kernel, and whether emulated."""
    emulated = os.environ.get("LBCTL_LAB_VM") == "1"
    return (f"Linux {os.uname().release}"
            + (" in the lab VM, emulated (qemu TCG, 2 vCPUs)" if emulated else "")
            + f", {os.cpu_count()} CPUs seen, {time.strftime('%Y-%m-%d')}")
