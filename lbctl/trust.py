"""What root may trust: files and folders no user but root can change.

lbctl runs as root from its boot units and over ssh.  A folder it writes
under, or the Python and the lbctl it runs, that another user can change
would hand that user root.  That includes a sticky folder such as /tmp: it
protects only names that exist, and /tmp is emptied at every boot, before a
boot unit runs, so anyone may then claim the name the unit runs.
"""

import os


def others_can_change(info, me=0):
    """True if `info` (an os.stat result) is owned by someone other than root
    (or `me`), or can be written by group or others."""
    return info.st_uid not in (0, me) or bool(info.st_mode & 0o022)


def first_unsafe(paths, me=0):
    """The first of `paths`, or of the folders above them, that another user
    could change, as (path, os.stat result); None when all are root's (and
    `me`'s) alone.  Both the path as named and where its links lead are walked."""
    seen = set()
    for path in paths:
        for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            for step in [*ancestors(candidate), candidate]:
                if step in seen:
                    continue
                seen.add(step)
                info = os.stat(step)
                if others_can_change(info, me):
                    return step, info
    return None


def ancestors(path):
    """'/a/b/c' -> ['/', '/a', '/a/b']"""
    parts = path.strip("/").split("/")[:-1]
    return ["/"] + ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]
