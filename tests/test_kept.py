"""A cluster file validated once is read back from lbctl's cache, and never
when anything it was made from changed: the file, its name, lbctl's code."""

import os
import tempfile

import pytest

from lbctl.config import load_cluster
from lbctl.config import load as parser
from lbctl.errors import ConfigError

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "pi-pair.yaml")


@pytest.fixture
def cache(monkeypatch):
    """An empty cache, in the home folder where lbctl trusts one."""
    base = tempfile.mkdtemp(dir=os.environ["XDG_CACHE_HOME"])
    monkeypatch.setenv("XDG_CACHE_HOME", base)
    return os.path.join(base, "lbctl", "clusters")


@pytest.fixture
def parses(monkeypatch):
    """How many times a file was parsed."""
    count = []
    real = parser.parse_document

    def counted(text, path="<string>"):
        count.append(path)
        return real(text, path)
    monkeypatch.setattr(parser, "parse_document", counted)
    return count


def copy_of_example(tmp_path, name="cluster.yaml", edit=lambda t: t):
    path = tmp_path / name
    path.write_text(edit(open(EXAMPLE).read()))
    return str(path)


def test_a_file_validated_once_is_read_back_unparsed(cache, parses, tmp_path):
    path = copy_of_example(tmp_path)
    first = load_cluster(path)
    again = load_cluster(path)
    assert again == first and again is not first
    assert len(parses) == 1
    (entry,) = os.listdir(cache)
    assert oct(os.stat(cache).st_mode & 0o777) == "0o700"


def test_an_edited_file_is_validated_anew_and_its_error_shown(cache, parses, tmp_path):
    path = copy_of_example(tmp_path)
    load_cluster(path)
    copy_of_example(tmp_path, edit=lambda t: t.replace("priority: 150", "priority: 1500"))
    with pytest.raises(ConfigError) as raised:
        load_cluster(path)
    assert f"{path}:" in str(raised.value) and "priority" in str(raised.value)
    assert len(parses) == 2


def test_the_same_text_under_another_name_is_validated_anew(cache, parses, tmp_path):
    # The model and its errors carry the file's name.
    first = load_cluster(copy_of_example(tmp_path, "a.yaml"))
    second = load_cluster(copy_of_example(tmp_path, "b.yaml"))
    assert len(parses) == 2 and first.source != second.source


def test_a_change_to_lbctl_code_validates_anew(cache, parses, tmp_path, monkeypatch):
    from lbctl import cache as lbctl_cache

    path = copy_of_example(tmp_path)
    load_cluster(path)
    stamp = lbctl_cache.code_stamp()
    monkeypatch.setattr(lbctl_cache, "code_stamp", lambda: stamp + "\nconfig/validate.py:1:2")
    load_cluster(path)
    assert len(parses) == 2


@pytest.mark.parametrize("damage", ["cut short", "bytes changed", "not a model"])
def test_a_damaged_entry_is_validated_anew(cache, parses, tmp_path, damage):
    import hashlib
    import pickle

    path = copy_of_example(tmp_path)
    expected = load_cluster(path)
    (entry,) = (os.path.join(cache, name) for name in os.listdir(cache))
    data = open(entry, "rb").read()
    if damage == "cut short":
        data = data[:-20]
    elif damage == "bytes changed":  # still a model, with another name: only the digest tells
        assert b"pi-web" in data
        data = data.replace(b"pi-web", b"pi-wex")
    else:  # a well-formed entry holding something else
        other = pickle.dumps({"name": "forged"})
        data = hashlib.sha256(other).hexdigest().encode() + b"\n" + other
    open(entry, "wb").write(data)
    assert load_cluster(path) == expected
    assert len(parses) == 2


def test_a_cache_others_can_change_is_not_used(cache, parses, tmp_path):
    path = copy_of_example(tmp_path)
    load_cluster(path)
    os.chmod(cache, 0o777)
    load_cluster(path)
    load_cluster(path)
    assert len(parses) == 3
