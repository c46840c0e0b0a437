"""Errors a person can act on.

Config errors carry every problem found, each with its place in the file.
Runtime errors name the operation and the object.  The CLI turns both into
messages and exit codes; nothing else prints tracebacks.
"""

from dataclasses import dataclass

EXIT_CHANGES = 2  # plan --detailed-exitcode: changes are pending
EXIT_VERSION = 3  # --expect-version: this node runs another lbctl
# --all (plan, status, doctor): some nodes could not be asked or did not
# answer, so the answer covers only the others.  Problems found on the
# nodes that did answer (doctor) still exit 1.
EXIT_UNCHECKED = 4
EXIT_USAGE = 64  # sysexits EX_USAGE: a command line lbctl cannot run

# Control characters in a quoted source line are shown as their Unicode pictures
# (one character each, so the caret stays in place), never sent to the terminal.
_VISIBLE = {code: 0x2400 + code for code in range(0x20) if code != 0x09}
_VISIBLE |= {0x7F: 0x2421} | {code: 0xFFFD for code in range(0x80, 0xA0)}


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int  # 1-based
    col: int  # 1-based
    message: str
    source_line: str = ""

    def format(self):
        head = f"{self.file}:{self.line}:{self.col}: {self.message}"
        if not self.source_line:
            return head
        caret = " " * (self.col - 1) + "^"
        return f"{head}\n    {self.source_line.translate(_VISIBLE)}\n    {caret}"


class LbctlError(Exception):
    """Base class: an error with a message meant for the user."""

    exit_code = 1


class ConfigError(LbctlError):
    def __init__(self, diagnostics):
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.line, d.col, d.message))
        super().__init__("\n".join(d.format() for d in self.diagnostics))


class NodeError(LbctlError):
    """This host cannot be matched to a node of the cluster file."""


class ApplyError(LbctlError):
    """A change the kernel or the filesystem refused, with what was being done."""

    def __init__(self, operation, obj, reason):
        self.operation, self.obj, self.reason = operation, obj, reason
        super().__init__(f"apply: {operation} {obj}: {reason}")


class KernelError(LbctlError):
    """The kernel lacks something lbctl needs (IPVS) or refused to talk."""


class LabError(LbctlError):
    """The lab could not be built or driven."""


class UsageError(LbctlError):
    exit_code = EXIT_USAGE


class PlanChanged(LbctlError):
    """apply --expect-plan: the node's plan is no longer the one shown and
    agreed to.  Nothing was changed, so it is no failed apply either."""
