"""lbctl's cache: what is costly to make and the same every time it is made
from the same inputs, kept between runs so a slow node pays for it once.

It lives in the user's cache folder, as any command-line tool's does:
${XDG_CACHE_HOME:-~/.cache}/lbctl (root's: /root/.cache/lbctl).  What is
read back from it is run (compiled templates) or written into files root
reads, so a folder is used only when no one but the user and root can change
it or any folder above it (see trust.py); otherwise, and where it cannot be
made (a read-only root), lbctl works without it.  Everything in it can be
deleted at any time.
"""

import hashlib
import os
import tempfile

from lbctl.trust import first_unsafe


def folder(kind):
    """The cache folder for `kind` ("templates", "rendered"), made if need be;
    None where there is none to be had safely."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = os.path.join(base, "lbctl", kind)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if first_unsafe([path], me=os.geteuid()) is None:
            return path
    except OSError:
        pass
    return None


def load(path, largest):
    """An entry's bytes, or None when it is missing, larger than `largest`,
    or damaged (the digest on its first line does not match)."""
    try:
        with open(path, "rb") as fh:
            digest, _, data = fh.read(largest + 80).partition(b"\n")
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest().encode() == digest else None


def store(path, data, keep=64):
    """Write an entry whole, with its digest (another run reads either the
    old one or this), then drop the oldest entries of its folder beyond
    `keep`.  A cache that cannot be written is no error."""
    directory = os.path.dirname(path)
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".new-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        entries = os.listdir(directory)
        if len(entries) > keep:
            entries.sort(key=lambda name: _mtime(os.path.join(directory, name)))
            for name in entries[:len(entries) - keep]:
                os.unlink(os.path.join(directory, name))
    except OSError:
        pass


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0
