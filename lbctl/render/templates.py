"""Where the shipped templates live and how they are rendered.

The templates sit in top-level folders of the repository (sysctl/, systemd/)
so an operator can read them without opening Python; the package maps those
folders in as lbctl.data.* so they ship with every install.
"""

import re
from importlib.resources import files

from lbctl.errors import LbctlError

# Every value lbctl writes into a root-read file is one line of printable text.
# Validation keeps control characters out of the cluster file; this is the
# last line of defence for values from anywhere else (node names, paths).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class RenderError(LbctlError):
    """A value would have broken the line structure of a rendered file."""


def template_text(folder, name):
    return files(f"lbctl.data.{folder}").joinpath(name).read_text(encoding="utf-8")


def render(folder, name, **values):
    # Jinja2 only here: it costs start-up time that validate and status do not need.
    import jinja2

    def one_line(value):
        if _CONTROL.search(str(value)):
            raise RenderError(f"render {folder}/{name}: refusing to write {str(value)!r}: "
                              "it holds a control character")
        return value

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False, finalize=one_line)
    return env.from_string(template_text(folder, name)).render(**values)
