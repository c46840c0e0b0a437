"""YAML to plain values, keeping where each value and key stood.

The file is read with bounds (source.py) and parsed event by event with
libyaml's C parser where PyYAML has it (marks included, about twenty times
faster than the pure-Python scanner).  We build the values
ourselves rather than through PyYAML's composer so that:

- duplicate keys are errors (YAML says keys are unique, PyYAML keeps the last);
- every value the validator looks at can be reported as file:line:col;
- nesting depth is bounded before it can exhaust the stack (libyaml's composer
  recurses in C, and crashes on deep enough input);
- aliases are shared, not copied, and the size they would expand to is
  bounded, so an alias bomb costs nothing to refuse;
- merge keys, tags and keys YAML reads as something other than text are
  refused with the reason, where they stand.
"""

import re
from dataclasses import dataclass, field
from functools import cached_property

import yaml

from lbctl.config.source import line_col, read_source, source_lines
from lbctl.errors import ConfigError, Diagnostic

# libyaml keeps line and column marks; without it PyYAML's own parser does the same, slower.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_DEPTH = 32  # a cluster file needs 6 (services.NAME.health.exec.command.N)
# Values that aliases may repeat: ten times the values written out, plus this.
ALIAS_FACTOR = 10
ALIAS_ALLOWANCE = 10_000

_YAML = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_YAML + t for t in ("str", "int", "float", "bool", "null", "timestamp")}
_COLLECTION_TAGS = {yaml.MappingStartEvent: _YAML + "map", yaml.SequenceStartEvent: _YAML + "seq"}
_MERGE = _YAML + "merge"
# What YAML does not allow in a stream (PyYAML's and libyaml's readers refuse these).
_NOT_YAML = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_C0_NAMES = ("NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI DLE DC1 DC2 DC3 DC4 "
             "NAK SYN ETB CAN EM SUB ESC FS GS RS US").split()
_SHOWN_CHARACTER_ERRORS = 20


@dataclass
class Document:
    """A parsed cluster file: plain data plus positions by path."""

    path: str
    text: str
    data: object
    # (path tuple) -> (line, col) of the value; ("key", path) -> position of the key
    marks: dict = field(default_factory=dict)

    @cached_property
    def lines(self):
        return source_lines(self.text)

    def position(self, path, key=False):
        """Best position for a path: the key or value itself, else its nearest parent."""
        path = tuple(path)
        while True:
            found = self.marks.get(("key", path) if key else path) or self.marks.get(path)
            if found or not path:
                return found or (1, 1)
            path = path[:-1]

    def diagnostic(self, path, message, key=False):
        return self.at(self.position(path, key=key), message)

    def at(self, mark, message):
        line, col = mark
        source = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Diagnostic(self.path, line, col, message, source)


def load_document(path):
    name, text = read_source(path)
    return parse_document(text, name)


def parse_document(text, path="<string>"):
    doc = Document(path=path, text=text, data=None)
    _check_characters(doc)
    loader = _Loader(text)
    try:
        builder = _Builder(doc, loader)
        doc.data = builder.build()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"invalid YAML: {exc.problem or exc.context}"
        raise ConfigError([doc.at(_mark(mark), message)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Diagnostic(path, 1, 1, f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()
    if builder.errors:
        raise ConfigError(builder.errors)
    return doc


def _check_characters(doc):
    """Control characters (and the few others YAML forbids), each named where it stands."""
    errors = []
    for found in _NOT_YAML.finditer(doc.text):
        if len(errors) == _SHOWN_CHARACTER_ERRORS:
            break
        errors.append(doc.at(line_col(doc.text, found.start()),
                             f"{_character_name(found.group())} is not allowed in a cluster "
                             "file: it is text, and of the control characters only tab and "
                             "line breaks may appear"))
    if errors:
        raise ConfigError(errors)


def _character_name(char):
    code = ord(char)
    if code < 0x20:
        return f"control character {_C0_NAMES[code]} (U+{code:04X})"
    if code == 0x7F:
        return "control character DEL (U+007F)"
    if 0x80 <= code <= 0x9F:
        return f"control character U+{code:04X}"
    return f"character U+{code:04X}"


def _mark(mark):
    return (mark.line + 1, mark.column + 1)


class _Open:
    """An anchored collection still being read: an alias to it would contain itself."""


_OPEN = _Open()


@dataclass
class _Anchor:
    value: object
    size: int  # values it stands for, expanded
    height: int  # nesting levels it adds, expanded
    mark: tuple


class _Builder:
    """Plain values from the parser's events, with marks, checks and bounds."""

    def __init__(self, doc, loader):
        self.doc, self.loader = doc, loader
        self.errors = []
        self.anchors = {}
        self.written = 0  # values written out in the file
        self.repeated = 0  # values aliases stand for
        self.aliases = []  # (repeated so far, mark, anchor name, its size)

    def error(self, mark, message):
        self.errors.append(self.doc.at(mark, message))

    def fatal(self, mark, message):
        raise ConfigError(self.errors + [self.doc.at(mark, message)])

    def build(self):
        loader = self.loader
        loader.get_event()  # stream start
        if loader.check_event(yaml.StreamEndEvent):
            return {}  # an empty file: the validator names what is missing
        loader.get_event()  # document start
        value, _, _ = self.value((), 0)
        loader.get_event()  # document end
        if not loader.check_event(yaml.StreamEndEvent):
            self.fatal(_mark(loader.peek_event().start_mark),
                       "a cluster file is one YAML document; a second one starts here")
        self.check_repeats()
        return value

    def value(self, path, depth):
        """(value, expanded size, expanded height) of the next node; path None: no marks."""
        event = self.loader.get_event()
        mark = _mark(event.start_mark)
        if path is not None:
            self.doc.marks[path] = mark
        if isinstance(event, yaml.AliasEvent):
            return self.alias(event.anchor, mark, depth)
        self.written += 1
        if event.anchor is not None:
            self.reserve(event.anchor, mark)
        if isinstance(event, yaml.ScalarEvent):
            value, size, height = self.scalar(event, mark), 1, 0
        else:
            if depth >= MAX_DEPTH:
                self.fatal(mark, f"values are nested more than {MAX_DEPTH} levels deep; "
                           "a cluster file needs six")
            self.check_collection_tag(event, mark)
            build = self.mapping if isinstance(event, yaml.MappingStartEvent) else self.sequence
            value, size, height = build(path, depth)
        if event.anchor is not None:
            self.anchors[event.anchor] = _Anchor(value, size, height, mark)
        return value, size, height

    def mapping(self, path, depth):
        result, size, height = {}, 1, 0
        while not self.loader.check_event(yaml.MappingEndEvent):
            key, key_mark = self.key(depth)
            if key is not None and key in result:
                first = self.doc.marks.get(("key", path + (key,))) if path is not None else None
                where = f" (first defined at line {first[0]})" if first else ""
                self.error(key_mark, f"duplicate key {key!r}{where}")
                key = None
            child = path + (key,) if path is not None and key is not None else None
            if child is not None:
                self.doc.marks[("key", child)] = key_mark
            value, value_size, value_height = self.value(child, depth + 1)
            if key is not None:
                result[key] = value
            size, height = self.grow(size + value_size), max(height, value_height + 1)
        self.loader.get_event()
        return result, size, height

    def sequence(self, path, depth):
        result, size, height = [], 1, 0
        while not self.loader.check_event(yaml.SequenceEndEvent):
            child = path + (len(result),) if path is not None else None
            value, value_size, value_height = self.value(child, depth + 1)
            result.append(value)
            size, height = self.grow(size + value_size), max(height, value_height + 1)
        self.loader.get_event()
        return result, size, height

    def key(self, depth):
        """(key text or None when refused, mark) of the next mapping key."""
        event = self.loader.peek_event()
        mark = _mark(event.start_mark)
        if not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            self.value(None, depth + 1)
            self.error(mark, "keys must be plain names, not lists or mappings")
            return None, mark
        if isinstance(event, yaml.ScalarEvent) and self.is_merge_key(event):
            self.loader.get_event()
            self.error(mark, "merge keys (<<) are not supported: they hide where a value "
                       "comes from; write the keys out, or repeat a whole value with an "
                       "alias (*name)")
            return None, mark
        key, _, _ = self.value(None, depth + 1)
        if isinstance(key, str):
            return key, mark
        if isinstance(event, yaml.ScalarEvent):
            text = event.value
            self.error(mark, f"key {text} is read by YAML as {_reading(key)}, not as a name; "
                       f"names are text: put it in quotes, as in '{text}'")
        elif key is not None:
            self.error(mark, f"keys must be plain names; alias *{event.anchor} stands for "
                       f"{_reading(key)}")
        return None, mark

    @staticmethod
    def is_merge_key(event):
        if event.tag not in (None, "!"):
            return event.tag == _MERGE
        return event.implicit[0] and event.value == "<<"  # what YAML 1.1's resolver matches

    def scalar(self, event, mark):
        tag = event.tag
        if tag is None or tag == "!":
            if not event.implicit[0]:
                return event.value  # quoted: a string
            tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        elif tag not in _SCALAR_TAGS:
            self.error(mark, _tag_refused(tag))
            return event.value
        if tag == _YAML + "str":
            return event.value
        if tag not in _SCALAR_TAGS:
            return event.value  # YAML 1.1's `=` (value) reads as text
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            return self.loader.yaml_constructors[tag](self.loader, node)
        except (ValueError, TypeError, KeyError, OverflowError, yaml.YAMLError):
            self.error(mark, f"{event.value!r} is not a valid {tag[len(_YAML):]}")
            return event.value

    def check_collection_tag(self, event, mark):
        if event.tag not in (None, "!", _COLLECTION_TAGS[type(event)]):
            self.error(mark, _tag_refused(event.tag))

    def reserve(self, name, mark):
        """An anchor is known from where it starts: an alias inside it is a cycle."""
        known = self.anchors.get(name)
        if known is not None:
            self.error(mark, f"anchor &{name} is defined twice (first at line "
                       f"{known.mark[0]}); give each anchor its own name")
        self.anchors[name] = _Anchor(_OPEN, 0, 0, mark)

    def alias(self, name, mark, depth):
        anchor = self.anchors.get(name)
        if anchor is None:
            self.error(mark, f"alias *{name} refers to no anchor: define &{name} before "
                       "it is used")
            return None, 1, 0
        if anchor.value is _OPEN:
            self.fatal(mark, f"alias *{name} is inside the value anchored as &{name}, which "
                       "would then contain itself")
        if depth + anchor.height > MAX_DEPTH:
            self.fatal(mark, f"alias *{name} nests values more than {MAX_DEPTH} levels deep; "
                       "a cluster file needs six")
        # Shared, not copied: only the count says what it would expand to.
        self.repeated = self.grow(self.repeated + anchor.size)
        self.aliases.append((self.repeated, mark, name, anchor.size))
        return anchor.value, anchor.size, anchor.height

    def check_repeats(self):
        limit = ALIAS_FACTOR * self.written + ALIAS_ALLOWANCE
        if self.repeated <= limit:
            return
        total, mark, name, size = next(a for a in self.aliases if a[0] > limit)
        self.error(mark, f"alias *{name} stands for {_count(size)} values, and with it the "
                   f"aliases in this file stand for {_count(total)}: more than the {limit:,} "
                   f"allowed (ten times the {self.written:,} values written out, plus "
                   f"{ALIAS_ALLOWANCE:,}); write the values out instead")

    @staticmethod
    def grow(size):
        # Sizes saturate: a bomb's counts would otherwise grow to huge numbers.
        return min(size, 10 ** 12)


def _count(size):
    return f"{size:,}" if size < 10 ** 12 else "more than 10^12"


def _reading(value):
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if value is None:
        return "nothing (null)"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    return f"a {type(value).__name__}"


def _tag_refused(tag):
    shown = "!!" + tag[len(_YAML):] if tag.startswith(_YAML) else tag
    return (f"tag {shown} is not supported: a cluster file holds plain YAML values (text, "
            "numbers, booleans, lists and mappings); remove the tag")
