"""Kernel parameters through /proc/sys."""

import os


class SysctlProc:
    def __init__(self, root="/proc/sys"):
        self.root = root

    def _path(self, key):
        # sysctl.d spells a dot inside a name (eth0.100) as '/'.
        parts = [p.replace("/", ".") for p in key.split(".")]
        return os.path.join(self.root, *parts)

    def read(self, key):
        try:
            with open(self._path(key)) as fh:
                return fh.read().strip()
        except FileNotFoundError:
            return None

    def write(self, key, value):
        with open(self._path(key), "w") as fh:
            fh.write(f"{value}\n")
