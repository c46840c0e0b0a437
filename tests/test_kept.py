"""A cluster file validated once is read back from lbctl's cache, and never
when anything it was made from changed: the file, its name, lbctl's code."""

import os

import pytest

from lbctl.config import load_cluster
from lbctl.config import load as parser
from lbctl.errors import ConfigError

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "pi-pair.yaml")


@pytest.fixture
def cache(own_cache):
    """An empty cache's folder of models."""
    return str(own_cache / "clusters")


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
    import pickle

    from lbctl.cache import store

    path = copy_of_example(tmp_path)
    expected = load_cluster(path)
    (entry,) = (os.path.join(cache, name) for name in os.listdir(cache))
    data = open(entry, "rb").read()
    if damage == "cut short":
        data = data[:-20]
    elif damage == "bytes changed":  # still a model, with another name: only the digest tells
        assert b"pi-web" in data
        data = data.replace(b"pi-web", b"pi-wex")
    if damage == "not a model":  # a well-formed entry holding something else
        store(entry, pickle.dumps({"name": "forged"}))
    else:
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


def test_an_entry_naming_anything_but_the_model_is_refused_unrun(cache, parses, tmp_path):
    # Whole, with its digest, from a cache root trusts: still only the model's
    # own classes are unpickled, so a forged entry cannot run a command.
    import pickle

    from lbctl.cache import store

    path = copy_of_example(tmp_path)
    expected = load_cluster(path)
    (entry,) = (os.path.join(cache, name) for name in os.listdir(cache))
    ran = tmp_path / "ran"

    class Forged:
        def __reduce__(self):
            return (os.system, (f"touch {ran}",))
    store(entry, pickle.dumps(Forged()))
    assert load_cluster(path) == expected
    assert not ran.exists() and len(parses) == 2


def test_no_cache_where_lbctl_cannot_see_its_own_code(cache, parses, tmp_path, monkeypatch):
    # lbctl run from a zip: its keys could not tell one lbctl from another.
    from lbctl import cache as lbctl_cache

    monkeypatch.setattr(lbctl_cache, "_module_stamps", lambda top: [])
    lbctl_cache.code_stamp.cache_clear()
    try:
        path = copy_of_example(tmp_path)
        load_cluster(path)
        load_cluster(path)
        assert len(parses) == 2 and not os.path.exists(cache)
    finally:
        lbctl_cache.code_stamp.cache_clear()


def test_the_code_in_a_key_covers_the_parser_and_the_template_engine():
    import jinja2
    import yaml

    from lbctl import cache as lbctl_cache

    stamp = lbctl_cache.code_stamp()
    for package in (yaml, jinja2):
        assert os.path.dirname(package.__file__) in stamp.splitlines()
    assert "/__init__.py:" in stamp


def test_a_relative_cache_folder_is_not_used(parses, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.chdir(tmp_path)
    path = copy_of_example(tmp_path)
    load_cluster(path)
    load_cluster(path)
    assert len(parses) == 2 and not (tmp_path / "relative").exists()


def test_a_write_cut_short_long_ago_is_cleaned_up(cache, tmp_path):
    import time

    load_cluster(copy_of_example(tmp_path, "a.yaml"))
    old, recent = os.path.join(cache, ".new-old"), os.path.join(cache, ".new-recent")
    for leftover in (old, recent):
        open(leftover, "wb").write(b"half")
    os.utime(old, (time.time() - 7200,) * 2)
    load_cluster(copy_of_example(tmp_path, "b.yaml"))
    assert not os.path.exists(old) and os.path.exists(recent)
