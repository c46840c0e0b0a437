"""Where the shipped templates live and how they are rendered.

The templates sit in top-level folders of the repository (sysctl/, systemd/)
so an operator can read them without opening Python; the package maps those
folders in as lbctl.data.* so they ship with every install.

Compiling a template costs more than rendering it: on a Pi, or in the
emulated lab, keepalived.conf's template takes a quarter of a second to
compile, and every plan, status and apply on a balancer renders it.  Jinja2
keeps the compiled code in a private cache folder (jinja2's own bytecode
cache, keyed by the template's text and the Python version), so each
template is compiled once per node.
"""

import functools
import os
import re
import stat
from importlib.resources import files

from lbctl.errors import LbctlError

# Every value lbctl writes into a root-read file is one line of printable text.
# Validation keeps control characters out of the cluster file; this is the
# last line of defence for values from anywhere else (node names, paths).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

class RenderError(LbctlError):
    """A value would have broken the line structure of a rendered file."""


class _Unsafe(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


def template_text(folder, name):
    return files(f"lbctl.data.{folder}").joinpath(name).read_text(encoding="utf-8")


def render(folder, name, **values):
    try:
        return _environment(folder).get_template(name).render(**values)
    except _Unsafe as exc:
        raise RenderError(f"render {folder}/{name}: refusing to write {str(exc.value)!r}: "
                          "it holds a control character") from None


def _one_line(value):
    if _CONTROL.search(str(value)):
        raise _Unsafe(value)
    return value


@functools.cache
def _environment(folder):
    # Jinja2 only here: it costs start-up time that validate and status do not need.
    import jinja2

    def source(name):
        # Always up to date: the package's files do not change under a running lbctl.
        return template_text(folder, name), None, lambda: True

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False, finalize=_one_line,
                              loader=jinja2.FunctionLoader(source),
                              bytecode_cache=_bytecode_cache())


def cache_dir():
    """The folder for compiled templates (the user's cache, as for any
    command-line tool: root's is /root/.cache/lbctl/templates), or None where
    none can be kept safely."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = os.path.join(base, "lbctl", "templates")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None  # a read-only root, a full disk: compile every time
    return path if private(path) else None


def private(path):
    """True when only this user (or root) can change `path` or any folder above
    it: the cache holds code that lbctl runs, as root on a node."""
    uid = os.geteuid()
    here = os.path.realpath(path)
    while True:
        try:
            st = os.stat(here)
        except OSError:
            return False
        others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        # A sticky folder of root's (/tmp) lets no one else rename what is ours.
        if st.st_uid not in (0, uid) or (
                others_write and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX)):
            return False
        parent = os.path.dirname(here)
        if parent == here:
            return True
        here = parent


def _bytecode_cache():
    path = cache_dir()
    if path is None:
        return None
    import jinja2

    class QuietCache(jinja2.FileSystemBytecodeCache):
        """A cache entry that cannot be read (cut short by a power loss) or
        written (a read-only root) is no error: the template is compiled."""

        def load_bytecode(self, bucket):
            try:
                super().load_bytecode(bucket)
            except Exception:  # whatever unpickling a damaged file raises
                bucket.reset()

        def dump_bytecode(self, bucket):
            try:
                super().dump_bytecode(bucket)
            except OSError:
                pass

    return QuietCache(path)
