"""lbctl's cache: what is costly to make and the same every time it is made
from the same inputs (validated models, rendered files), kept between runs so
a slow node pays for it once.

It lives in the user's cache folder, as any command-line tool's does:
${XDG_CACHE_HOME:-~/.cache}/lbctl (root's: /root/.cache/lbctl).  What is
read back from it goes into what root writes and runs, so:
- a folder is used only when no one but the user and root can change it or
  any folder above it (trust.py), checked on the nearest folder that exists
  before anything is made: root never makes a folder where a user points it
  (a HOME kept through sudo, a link);
- an entry is opened without following links and read only if it is a plain
  file of the user's with one name, and it carries the digest of its own
  bytes, so a damaged one is made anew;
- every key holds lbctl's code (code_stamp): a changed lbctl makes anew.
Where the cache cannot be had (a read-only root, a folder of another user's),
lbctl works without it.  Everything in it can be deleted at any time.
"""

import functools
import hashlib
import os
import stat
import sys
import time

from lbctl.trust import first_unsafe, others_can_change

REFRESH_SECONDS = 86400  # an entry read back is marked recent at most this often


def folder(kind):
    """The cache folder for `kind` ("clusters", "rendered"), made if need be;
    None where there is none to be had safely."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if not os.path.isabs(base) or code_stamp() is None:
        return None  # no HOME (XDG says a relative one is ignored), or a zipped lbctl
    path = os.path.join(base, "lbctl", kind)
    me = os.geteuid()
    try:
        existing = path
        while not os.path.lexists(existing):  # "/" exists: an absolute path ends
            existing = os.path.dirname(existing)
        if first_unsafe([existing], me=me) is not None:
            return None
        # What is made below a trusted folder is this user's, 0700: no second check.
        for step in _missing_steps(existing, path):
            os.mkdir(step, 0o700)
        return path
    except OSError:
        return None


def _missing_steps(existing, path):
    steps = []
    while path != existing:
        steps.append(path)
        path = os.path.dirname(path)
    return reversed(steps)


# The code a kept entry was made by: lbctl's own, and the libraries that
# shape a model (PyYAML and its libyaml module: what a file may hold) and a
# rendered file (Jinja2, MarkupSafe).
STAMPED = ("lbctl", "yaml", "_yaml", "jinja2", "markupsafe")


@functools.cache
def code_stamp():
    """That code as it stands: where each package is and every module's size
    and time, as Python's own bytecode checks, with lbctl's version and the
    Python running it.  A key made with it changes with any edit, upgrade or
    move of them.  None where lbctl's modules cannot be seen (run from a
    zip): then there is no cache."""
    import importlib.util

    from lbctl import __version__

    stamps = [sys.version, __version__]
    for package in STAMPED:
        spec = importlib.util.find_spec(package)  # found, not imported
        for top in (spec.submodule_search_locations or []) if spec else []:
            files = _module_stamps(top)
            if package == "lbctl" and not files:
                return None
            stamps += [top, *files]
    return "\n".join(stamps)


def _module_stamps(top):
    stamps = []
    for folder_path, folders, names in os.walk(top):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(names):
            if name.endswith((".py", ".so")):
                info = os.stat(os.path.join(folder_path, name))
                stamps.append(f"{os.path.relpath(folder_path, top)}/{name}:"
                              f"{info.st_size}:{info.st_mtime_ns}")
    return stamps


def key(*parts):
    """An entry's name: the digest of lbctl's code and `parts`."""
    return hashlib.sha256("\0".join((code_stamp(), *parts)).encode()).hexdigest()


def load(path, largest):
    """An entry's bytes, or None when it is missing, larger than `largest`,
    not a plain file of this user's alone, or damaged (the digest on its
    first line does not match)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            info = os.fstat(fd)
            if (not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or
                    others_can_change(info, os.geteuid())):
                return None
            digest, _, data = fh.read(largest + 80).partition(b"\n")
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest().encode() != digest:
            return None
        if time.time() - info.st_mtime > REFRESH_SECONDS:
            try:
                os.utime(fd)  # in use: not among the oldest, whatever its age
            except OSError:
                pass  # a read-only cache
    return data


def store(path, data, keep=64):
    """Write an entry whole, with its digest (another run reads either the
    old one or this), then drop the oldest entries of its folder beyond
    `keep`.  A cache that cannot be written is no error."""
    import tempfile  # only when something is written: most runs read

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
        _evict(directory, keep, os.path.basename(path))
    except OSError:
        pass


def _evict(directory, keep, just_written):
    """The oldest entries beyond `keep`; another run's entry being written
    (.new-*) and this run's own are never among them, but a write cut short
    by a power loss (.new-* older than an hour) goes."""
    aged = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            written = os.stat(path).st_mtime_ns
            if name.startswith(".new-"):
                if time.time_ns() - written > 3600 * 10**9:
                    os.unlink(path)
            elif name != just_written:
                aged.append((written, name))
        except FileNotFoundError:
            continue
    aged.sort()
    for _written, name in aged[:max(0, len(aged) - (keep - 1))]:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
