"""What root may trust: files and folders no user but root can change.

lbctl runs as root from its boot units and over ssh.  A folder it writes
under, or the Python and the lbctl it runs, that another user can change
would hand that user root.  A root-owned sticky folder (/tmp) is safe to pass
through: others can add names to it but cannot replace root's.
"""

import os
import stat


def others_can_change(info, me=0):
    """True if `info` (an os.stat result) is owned by someone other than root
    (or `me`), or can be written by group or others."""
    sticky_folder = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
    return info.st_uid not in (0, me) or bool(info.st_mode & 0o022 and not sticky_folder)


def first_unsafe(paths):
    """The first of `paths`, or of the folders above them, that another user
    could change, as (path, os.stat result); None when all are root's alone.
    Both the path as named and where its links lead are walked."""
    for path in paths:
        for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            for step in [*ancestors(candidate), candidate]:
                info = os.stat(step)
                if others_can_change(info):
                    return step, info
    return None


def ancestors(path):
    """'/a/b/c' -> ['/', '/a', '/a/b']"""
    parts = path.strip("/").split("/")[:-1]
    return ["/"] + ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]
