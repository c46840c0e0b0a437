"""YAML to plain values, keeping where each value and key stood.

PyYAML's composer gives nodes with marks; we walk them ourselves so that
duplicate keys are errors (YAML says keys are unique, PyYAML keeps the last)
and every value the validator looks at can be reported as file:line:col.
"""

from dataclasses import dataclass, field

import yaml

from lbctl.errors import ConfigError, Diagnostic


@dataclass
class Document:
    """A parsed cluster file: plain data plus positions by path."""

    path: str
    text: str
    data: object
    # (path tuple) -> (line, col) of the value; ("key", path) -> position of the key
    marks: dict = field(default_factory=dict)

    def position(self, path, key=False):
        """Best position for a path: the key or value itself, else its nearest parent."""
        path = tuple(path)
        while True:
            found = self.marks.get(("key", path) if key else path) or self.marks.get(path)
            if found or not path:
                return found or (1, 1)
            path = path[:-1]

    def diagnostic(self, path, message, key=False):
        line, col = self.position(path, key=key)
        lines = self.text.splitlines()
        source = lines[line - 1] if 0 < line <= len(lines) else ""
        return Diagnostic(self.path, line, col, message, source)


def load_document(path):
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Diagnostic(str(path), 1, 1, f"cannot read file: {exc}")]) from None
    return parse_document(text, str(path))


def parse_document(text, path="<string>"):
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        lines = text.splitlines()
        source = lines[mark.line] if mark and mark.line < len(lines) else ""
        message = f"invalid YAML: {exc.problem or exc.context}"
        raise ConfigError([Diagnostic(path, mark.line + 1, mark.column + 1, message, source)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Diagnostic(path, 1, 1, f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()
    doc = Document(path=path, text=text, data=None)
    errors = []
    if node is None:
        doc.data = {}
    else:
        doc.data = _plain(node, (), doc, loader, errors)
    if errors:
        raise ConfigError(errors)
    return doc


def _mark(node):
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _plain(node, path, doc, loader, errors):
    doc.marks[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        result = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                errors.append(doc_error(doc, _mark(key_node), "keys must be plain names"))
                continue
            key = loader.construct_object(key_node)
            if not isinstance(key, (str, int)):
                key = str(key)
            if key in result:
                first = doc.marks[("key", path + (key,))]
                errors.append(doc_error(doc, _mark(key_node),
                                        f"duplicate key {key!r} (first defined at line {first[0]})"))
                continue
            doc.marks[("key", path + (key,))] = _mark(key_node)
            result[key] = _plain(value_node, path + (key,), doc, loader, errors)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_plain(item, path + (i,), doc, loader, errors) for i, item in enumerate(node.value)]
    return loader.construct_object(node)


def doc_error(doc, mark, message):
    line, col = mark
    lines = doc.text.splitlines()
    return Diagnostic(doc.path, line, col, message, lines[line - 1] if line <= len(lines) else "")
