"""The file's shape: each value checked where it stands, every problem kept
with its place in the file (file:line:col), and names held to a pattern that
cannot carry text into the files lbctl generates."""

import re
from ipaddress import IPv4Address, ip_address

from lbctl.config.model import NAME_PATTERN

NAME_RE = re.compile(NAME_PATTERN)

DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
# Each unit's seconds as (numerator, denominator): a duration is worked out
# in whole numbers and divided once, so 700ms reads as the 0.7 that 0.7 does
# (700 * 0.001 is 0.7000000000000001, which keepalived refuses) and 1.1h as
# a whole 3960.
SECONDS_PER = {"ms": (1, 1000), "s": (1, 1), "m": (60, 1), "h": (3600, 1)}


class Checker:
    def __init__(self, doc):
        self.doc = doc
        self.errors = []

    def error(self, path, message, key=False):
        self.errors.append(self.doc.diagnostic(path, message, key=key))

    def where(self, path):
        return ".".join(str(p) for p in path) or "top level"

    def mapping(self, value, path, allowed, required=()):
        if not isinstance(value, dict):
            self.error(path, f"{self.where(path)}: expected a mapping, found {kind_of(value)}")
            return None
        for key in value:
            if key not in allowed:
                self.error(path + (key,), f"{self.where(path)}: unknown key {key!r}; "
                           f"allowed keys: {', '.join(sorted(allowed))}", key=True)
        for key in required:
            if key not in value:
                self.error(path, f"{self.where(path)}: missing required key {key!r}")
        return value

    def entries(self, value, section, what, allowed, required):
        """(name, spec, path) of each well-formed NAME: {mapping} entry of a section."""
        path = (section,)
        if isinstance(value, dict) and not value or value is None:
            self.error(path, f"{section}: empty: a cluster needs at least one {what}, as "
                       f"NAME: {{...}} under {section}:")
            return
        if not isinstance(value, dict):
            self.error(path, f"{section}: expected a mapping of {what} names to their settings, "
                       f"found {kind_of(value)}")
            return
        for name, spec in value.items():
            p = path + (name,)
            ok = self.name(name, p, f"{what} name")
            spec = self.mapping(spec, p, allowed, required=required)
            if spec is not None and ok:
                yield name, spec, p

    def name(self, value, path, what, key=True):
        if not isinstance(value, str):
            self.error(path, f"{what}: YAML reads this as {kind_of(value)} ({value!r}), not as a "
                       "name; names are text: put it in quotes", key=key)
            return False
        if not NAME_RE.fullmatch(value):
            self.error(path, f"{what} {value!r} is not a valid name: use letters, digits, "
                       "'_', '.' and '-' (up to 63, starting with a letter or digit)", key=key)
            return False
        return True

    def integer(self, value, path, low, high, what):
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"{self.where(path)}: {what} must be a whole number from "
                       f"{low} to {high}, found {kind_of(value)} {value!r}")
            return None
        if not low <= value <= high:
            self.error(path, f"{self.where(path)}: {what} {value} is out of range "
                       f"({low} to {high})")
            return None
        return value

    def address(self, value, path):
        text = value if isinstance(value, str) else None
        try:
            addr = ip_address(text) if text is not None else None
        except ValueError:
            addr = None
        if not isinstance(addr, IPv4Address):
            self.error(path, f"{self.where(path)}: {value!r} is not an IPv4 address")
            return None
        if addr.is_unspecified or addr.is_loopback or addr.is_multicast or addr.is_link_local \
                or addr == IPv4Address("255.255.255.255"):
            self.error(path, f"{self.where(path)}: {addr} cannot be a node or service address "
                       "(unspecified, loopback, multicast, link-local or broadcast)")
            return None
        return addr

    def boolean(self, value, path):
        if not isinstance(value, bool):
            self.error(path, f"{self.where(path)}: expected true or false, found "
                       f"{kind_of(value)} {value!r}")
            return None
        return value

    def duration(self, value, path, low, high, bound_by=""):
        """Seconds, from a number or a string such as 1s, 0.5s, 200ms, 15m or 1h.
        `bound_by`: why the range is what it is, where another key sets it."""
        seconds = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str) and DURATION_RE.fullmatch(value):
            number, unit = DURATION_RE.fullmatch(value).groups()
            whole, _, decimals = number.partition(".")
            per, per_unit = SECONDS_PER[unit]
            seconds = int(whole + decimals) * per / (10 ** len(decimals) * per_unit)
        if seconds is None:
            self.error(path, f"{self.where(path)}: expected a duration such as 1s, 0.5s, "
                       f"200ms or 15m, found {kind_of(value)} {value!r}")
            return None
        if not low <= seconds <= high:
            self.error(path, f"{self.where(path)}: {value!r} is out of range "
                       f"({seconds_text(low)} to {seconds_text(high)})"
                       + (f": {bound_by}" if bound_by else ""))
            return None
        return seconds

    def whole_seconds(self, value, path, low, high, counter, bound_by=""):
        """A duration (300, 300s) that is a whole number of seconds, as
        `counter` (BGP, IPVS) counts its time."""
        seconds = self.duration(value, path, low, high, bound_by)
        if seconds is not None and seconds != int(seconds):
            self.error(path, f"{self.where(path)}: {value!r} is not a whole number of seconds; "
                       f"{counter} counts it in seconds")
            return None
        return None if seconds is None else int(seconds)

    def choice(self, value, path, choices, what):
        if value not in choices:
            self.error(path, f"{self.where(path)}: unknown {what} {value!r}; "
                       f"known: {', '.join(choices)}")
            return None
        return value


def kind_of(value):
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "nothing"}.get(type(value), "a value")


def seconds_text(value):
    """0.5s, 30s, 2678400s: never in exponent form."""
    return f"{int(value)}s" if value == int(value) else f"{value:g}s"
