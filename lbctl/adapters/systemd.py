"""Every systemctl call lbctl makes, and the one answer to "does systemd run
this node's services?".

On a node booted with systemd, lbctl's daemons run as its units.  Elsewhere
(a container, the lab's nodes, a node root other than "/") there is no
systemd to ask, and each daemon's adapter runs its process itself.
"""

import os

from lbctl.adapters.programs import JOURNALCTL, SYSTEMCTL, SYSTEMD, run
from lbctl.errors import ApplyError

# `systemctl is-active` exit statuses: active, inactive or failed, no such unit.
ACTIVE, INACTIVE, NO_UNIT = 0, 3, 4


def systemd_runs(root="/"):
    """systemd manages this node's services: it booted the host, and the node
    is the host itself (a lab node's root is a folder; its systemd is the host's)."""
    return root == "/" and os.path.isdir("/run/systemd/system")


class Systemd:
    """systemctl for lbctl's units.  `runs` is False where systemd does not
    run the node, and then every call that would change something is refused."""

    def __init__(self, root="/", runs=None):
        self.runs = systemd_runs(root) if runs is None else runs

    def is_active(self, unit):
        """True or False; None when systemctl could not ask systemd (a reader
        that is not root, on a host without a D-Bus system bus)."""
        status = run([SYSTEMCTL, "is-active", "--quiet", unit]).returncode
        if status == ACTIVE:
            return True
        return False if status in (INACTIVE, NO_UNIT) else None

    def start(self, unit, what=None):
        self._systemctl("start", unit, what)

    def reload(self, unit, what=None):
        self._systemctl("reload", unit, what)

    def restart(self, unit, what=None):
        self._systemctl("restart", unit, what)

    def stop(self, unit, what=None):
        self._systemctl("stop", unit, what)

    def daemon_reload(self):
        """systemd reads lbctl's changed unit files; nothing to do without systemd."""
        if self.runs:
            run([SYSTEMCTL, "daemon-reload"], timeout=SYSTEMD)

    def stale(self, units):
        """Those of `units` whose file changed since systemd loaded it."""
        if not self.runs or not units:
            return []
        shown = run([SYSTEMCTL, "show", "--property=NeedDaemonReload", "--value", *units])
        return [unit for unit, flag in zip(units, shown.stdout.split()) if flag == "yes"]

    def _systemctl(self, verb, unit, what):
        if not self.runs:
            raise ApplyError(verb, what or unit, "systemd does not run this node's services")
        result = run([SYSTEMCTL, verb, unit], timeout=SYSTEMD)
        if result.returncode == 0:
            return
        said = (result.stderr or result.stdout).strip() or f"status {result.returncode}"
        # systemctl only points at the journal: show what the unit said there.
        journal = self.journal_tail(unit)
        if journal:
            said += "\n  the unit's last lines in the journal:\n    " + "\n    ".join(journal)
        raise ApplyError(verb, f"{what} ({unit})" if what else f"unit {unit}", said)

    def journal_tail(self, unit, lines=8):
        try:
            return run([JOURNALCTL, "--no-pager", "-q", "-o", "cat", "-n", str(lines),
                        "-u", unit]).stdout.strip().splitlines()
        except OSError:
            return []
