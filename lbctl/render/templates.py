"""Where the shipped templates live and how they are rendered.

The templates sit in top-level folders of the repository (sysctl/, systemd/)
so an operator can read them without opening Python; links in lbctl/data/
bring those folders in as lbctl.data.* so they ship with every install.

Rendering is most of what a plan, status or apply costs a slow node: on a Pi,
or in the emulated lab, importing Jinja2 and compiling keepalived.conf's
template take half a second, and every one of those commands renders every
file of the node to compare it with the disk.  So a file rendered once is
kept in lbctl's cache (cache.py) under a digest of everything it is made
from: lbctl's code, the template's text and every value passed in.  The
next run with the same inputs reads it back without Jinja2.
"""

import dataclasses
import enum
import functools
import importlib
import ipaddress
import os
import re

from lbctl import cache
from lbctl.errors import LbctlError

# Every value lbctl writes into a root-read file is one line of printable text.
# Validation keeps control characters out of the cluster file; this is the
# last line of defence for values from anywhere else (node names, paths).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
LARGEST_KEPT = 1 << 20  # bytes; a larger rendered file is rendered each time


class RenderError(LbctlError):
    """A value would have broken the line structure of a rendered file."""


class _Unsafe(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


@functools.cache
def template_text(folder, name):
    """A shipped template's text, read once per run: the key of a rendered
    file and its rendering see the same text."""
    # Read from the package's folder by path: importlib.resources would import
    # zipfile and zlib into every command for installs that are never zipped.
    package = importlib.import_module(f"lbctl.data.{folder}")
    with open(os.path.join(os.path.dirname(package.__file__), name), encoding="utf-8") as fh:
        return fh.read()


def render(folder, name, **values):
    text = template_text(folder, name)
    entry = _kept_path(folder, name, text, values)
    if entry is not None:
        kept = _read_kept(entry)
        if kept is not None:
            return kept
    try:
        # From the text alone: with no loader, a template can include no other
        # file the key would not cover.
        rendered = _environment().from_string(text).render(**values)
    except _Unsafe as exc:
        raise RenderError(f"render {folder}/{name}: refusing to write {str(exc.value)!r}: "
                          "it holds a control character") from None
    if entry is not None:
        data = rendered.encode("utf-8")
        if len(data) <= LARGEST_KEPT:
            cache.store(entry, data)
    return rendered


def _read_kept(entry):
    """A kept file's text, or None (missing, damaged)."""
    data = cache.load(entry, LARGEST_KEPT)
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _kept_path(folder, name, text, values):
    """Where the file these inputs make is kept; None if it is not kept."""
    directory = _rendered_folder()
    if directory is None:
        return None
    try:
        inputs = canonical(values)
    except TypeError:
        return None  # a value that cannot be told apart by its contents
    return os.path.join(directory, cache.key(folder, name, text, inputs))


def canonical(value):
    """A text that differs whenever `value` could render differently: the
    contents of dataclasses, containers, addresses and plain values, with
    sets in a fixed order.  TypeError for anything else."""
    if isinstance(value, (str, int, float, bool, type(None), enum.Enum,
                          ipaddress.IPv4Address, ipaddress.IPv4Network)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[{','.join(canonical(v) for v in value)}]"
    if isinstance(value, (set, frozenset)):
        return f"set[{','.join(sorted(canonical(v) for v in value))}]"
    if isinstance(value, dict):
        return "dict[" + ",".join(f"{canonical(k)}={canonical(v)}"
                                  for k, v in value.items()) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"{type(value).__qualname__}(" + ",".join(
            f"{f.name}={canonical(getattr(value, f.name))}"
            for f in dataclasses.fields(value)) + ")"
    raise TypeError(f"no canonical text for {type(value).__name__}")


@functools.cache
def _rendered_folder():
    return cache.folder("rendered")


def _one_line(value):
    if _CONTROL.search(str(value)):
        raise _Unsafe(value)
    return value


@functools.cache
def _environment():
    # Jinja2 only here: it costs start-up time that validate and status do not need.
    import jinja2

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False, finalize=_one_line)
