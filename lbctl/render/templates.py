"""Where the shipped templates live and how they are rendered.

The templates sit in top-level folders of the repository (sysctl/, systemd/)
so an operator can read them without opening Python; the package maps those
folders in as lbctl.data.* so they ship with every install.
"""

from importlib.resources import files


def template_text(folder, name):
    return files(f"lbctl.data.{folder}").joinpath(name).read_text(encoding="utf-8")


def render(folder, name, **values):
    # Jinja2 only here: it costs start-up time that validate and status do not need.
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    return env.from_string(template_text(folder, name)).render(**values)
