"""Reading and parsing a cluster file: bounded input, refused YAML features, positions."""

import os
from ipaddress import IPv4Address

import pytest

from helpers import PI_SINGLE, cluster_from
from large_cluster import many_services
from lbctl.config import load_cluster
from lbctl.config.source import MAX_BYTES
from lbctl.errors import ConfigError


def errors_of(text):
    with pytest.raises(ConfigError) as err:
        cluster_from(text)
    return [(d.line, d.col, d.message) for d in err.value.diagnostics]


def load_errors(path):
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    return [(d.line, d.col, d.message) for d in err.value.diagnostics]


def bomb(levels, under="lol"):
    """The "billion laughs": each level an anchored list of nine aliases to the last."""
    lines = [f"{under}0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for n in range(1, levels):
        lines.append(f"{under}{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


# -- characters --------------------------------------------------------------

@pytest.mark.parametrize("char,name", [
    ("\x00", "control character NUL (U+0000)"), ("\x07", "control character BEL (U+0007)"),
    ("\x0c", "control character FF (U+000C)"), ("\x1b", "control character ESC (U+001B)"),
    ("\x7f", "control character DEL (U+007F)"), ("\x9b", "control character U+009B"),
    ("\uffff", "character U+FFFF"),
], ids=lambda v: repr(v))
def test_a_control_character_is_named_where_it_stands(char, name):
    text = PI_SINGLE.replace("  pi2: {address", f"  pi2: {{addr{char}ess")
    assert errors_of(text) == [(6, 13, f"{name} is not allowed in a cluster file: it is text, "
                                "and of the control characters only tab and line breaks may "
                                "appear")]


def test_the_quoted_line_shows_a_control_character_as_its_picture(tmp_path):
    path = tmp_path / "esc.yaml"
    path.write_text(PI_SINGLE.replace("cluster: pi-web", "cluster: pi\x1b]0;owned\x07web"))
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    shown = str(err.value)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "    cluster: pi\u241b]0;owned\u2407web\n" + " " * 15 + "^" in shown


def test_tabs_and_any_kind_of_line_break_are_fine(tmp_path):
    path = tmp_path / "dos.yaml"
    path.write_bytes(PI_SINGLE.replace("\n", "  #\tnote\r\n").encode())
    assert set(load_cluster(path).services) == {"web", "dns"}


def test_bytes_that_are_not_utf8_are_placed(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(PI_SINGLE.replace("pi3:", "pi\xe9:").encode("latin-1"))
    assert load_errors(path) == [(7, 5, "byte 0xe9 is not UTF-8 text; save the file as UTF-8")]


# -- what is read at all -----------------------------------------------------

def test_dev_zero_is_refused_at_once():
    [(line, col, message)] = load_errors("/dev/zero")
    assert (line, col) == (1, 1)
    assert message.startswith("cannot read file: it is a character device, not a regular file")


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    [(_, _, message)] = load_errors(fifo)
    assert "it is a pipe (FIFO), not a regular file" in message


def test_a_directory_is_refused(tmp_path):
    [(_, _, message)] = load_errors(tmp_path)
    assert "it is a directory, not a regular file" in message


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(MAX_BYTES + 1)  # sparse: nothing is written, nothing need be read
    assert load_errors(big) == [(1, 1, "the file is larger than 16 MiB; a cluster file of "
                                 "50,000 services is about 4 MiB")]


# -- YAML features a cluster file does not use -------------------------------

def test_a_merge_key_is_refused_at_the_key():
    text = PI_SINGLE.replace("  pi1: {address: 192.168.100.3}",
                             "  pi1: &pi {address: 192.168.100.3}") \
        .replace("  pi2: {address: 192.168.100.4}", "  pi2:\n    <<: *pi\n    weight: 3")
    [(line, col, message)] = errors_of(text)
    assert (line, col) == (7, 5)
    assert message.startswith("merge keys (<<) are not supported: they hide where a value "
                              "comes from")


@pytest.mark.parametrize("tag,shown", [
    ("!ip", "!ip"), ("!!binary", "!!binary"), ("!!python/object:os.system", "!!python/object:os.system"),
    ("!!set", "!!set"), ("!!merge", "!!merge"),
])
def test_a_tag_is_refused_where_it_stands(tag, shown):
    text = PI_SINGLE.replace("web: {vip: 192.168.100.10", f"web: {{vip: {tag} 192.168.100.10")
    [(line, col, message)] = errors_of(text)
    assert (line, col) == (9, 14)
    assert message.startswith(f"tag {shown} is not supported")


def test_standard_tags_that_name_plain_values_are_read_as_such():
    cluster = cluster_from(PI_SINGLE.replace("port: 80", "port: !!int '80'"))
    assert cluster.services["web"].port == 80


def test_a_value_its_explicit_tag_cannot_read_is_placed():
    [(line, col, message)] = errors_of(PI_SINGLE.replace("port: 80", "port: !!int eighty"))
    assert (line, col, message) == (9, 36, "'eighty' is not a valid int")


def test_a_second_document_is_refused():
    [(line, col, message)] = errors_of(PI_SINGLE + "---\ncluster: other\n")
    assert (line, col) == (11, 1)
    assert message.startswith("a cluster file is one YAML document")


# -- aliases: shared, bounded ------------------------------------------------

def test_an_alias_bomb_is_refused_without_being_expanded():
    # Twelve levels stand for 9^12 (about 2.8e11) values; nine would be 387 million.
    [(line, col, message)] = errors_of(PI_SINGLE + bomb(12))
    assert (line, col) == (15, 12)
    assert message.startswith("alias *l3 stands for 7,381 values, and with it the aliases in "
                              "this file stand for ")
    assert "ten times the" in message


def test_aliases_within_the_bound_repeat_a_value():
    text = PI_SINGLE.replace("workers: [pi1, pi2]}", "workers: &two [pi1, pi2]}") \
        + "  ntp: {vip: 192.168.100.12, port: 123, protocol: udp, workers: *two}\n"
    cluster = cluster_from(text)
    assert [r.worker for r in cluster.services["ntp"].real_servers] == ["pi1", "pi2"]


def test_an_error_inside_an_aliased_value_is_placed_at_the_alias_too():
    text = PI_SINGLE.replace("workers: [pi1, pi2]}", "workers: &two [pi1, pi9]}") \
        + "  ntp: {vip: 192.168.100.12, port: 123, protocol: udp, workers: *two}\n"
    assert [(line, col) for line, col, _ in errors_of(text)] == [(10, 90), (11, 65)]


def test_an_alias_inside_its_own_anchored_value_is_refused():
    [(line, col, message)] = errors_of(PI_SINGLE.replace("workers: [pi1, pi2]}",
                                                         "workers: &w [pi1, *w]}"))
    assert (line, col) == (10, 88)
    assert message == ("alias *w is inside the value anchored as &w, which would then contain "
                       "itself")


def test_an_unknown_alias_and_a_reused_anchor_are_named():
    text = PI_SINGLE.replace("workers: [pi1, pi2]}", "workers: [*nope]}") \
        .replace("{address: 192.168.100.3}", "&a {address: 192.168.100.3}") \
        .replace("{address: 192.168.100.4}", "&a {address: 192.168.100.4}")
    assert errors_of(text) == [
        (6, 8, "anchor &a is defined twice (first at line 5); give each anchor its own name"),
        (10, 80, "alias *nope refers to no anchor: define &nope before it is used"),
    ]


# -- nesting -----------------------------------------------------------------

def test_deep_nesting_is_refused_where_it_passes_the_bound():
    # Deeper than lbctl allows, shallower than libyaml's own limit (1000 levels
    # since PyYAML 6.0.3), so lbctl's bound is what refuses it.
    depth = 500
    [(line, col, message)] = errors_of("cluster: " + "[" * depth + "]" * depth + "\n")
    assert (line, col) == (1, 41)
    assert message == "values are nested more than 32 levels deep; a cluster file needs six"


def test_nesting_deep_enough_to_exhaust_the_stack_is_an_error_not_a_crash():
    # libyaml's composer would crash at this depth; PyYAML's raises RecursionError.
    # Whichever bound meets it first, the user gets one positioned error.
    depth = 200_000
    [(line, col, message)] = errors_of("cluster: " + "[" * depth + "]" * depth + "\n")
    assert line == 1 and 10 <= col <= 10 + 1000
    assert "nest" in message


def test_nesting_built_from_aliases_is_bounded_too():
    # Twenty levels written out, and twenty more around an alias to them.
    lines = ["l0: &l0 " + "[" * 20 + "]" * 20, "l1: " + "[" * 19 + "*l0" + "]" * 19]
    [(line, col, message)] = errors_of("\n".join(lines) + "\n")
    assert (line, col) == (2, 24)
    assert message.startswith("alias *l0 nests values more than 32 levels deep")


# -- keys that YAML reads as something other than text -----------------------

@pytest.mark.parametrize("key,reading", [
    ("no", "the boolean false"), ("yes", "the boolean true"), ("1", "the number 1"),
    ("0x10", "the number 16"), ("~", "nothing (null)"), ("2024-01-01", "a date"),
])
def test_a_key_yaml_reads_as_another_type_is_refused_with_the_fix(key, reading):
    text = PI_SINGLE.replace("  pi2: {address", f"  {key}: {{address")
    assert errors_of(text) == [(6, 3, f"key {key} is read by YAML as {reading}, not as a "
                                f"name; names are text: put it in quotes, as in '{key}'")]


def test_a_quoted_key_is_a_name():
    cluster = cluster_from(PI_SINGLE.replace("  pi2: {address", "  'no': {address")
                           .replace("[pi1, pi2]", "[pi1, 'no']"))
    assert "no" in cluster.workers


def test_a_name_yaml_reads_as_another_type_is_refused_with_the_fix():
    text = PI_SINGLE.replace("cluster: pi-web", "cluster: no") \
        .replace("[pi1, pi2]", "[pi1, off]")
    assert errors_of(text) == [
        (1, 10, "cluster name: YAML reads this as a boolean (False), not as a name; names "
                "are text: put it in quotes"),
        (10, 85, "services.dns.workers: YAML reads this as a boolean (False), not as a worker "
                 "name; names are text: put it in quotes"),
    ]


# -- size and speed ----------------------------------------------------------

def test_a_file_of_five_thousand_services_is_read_whole(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(many_services(5000))
    cluster = load_cluster(path)
    assert len(cluster.services) == 5000
    last = cluster.services["s4999"]
    assert (last.vip, last.port, last.scheduler) == (IPv4Address("10.1.19.250"), 1079, "wrr")
    assert [(r.worker, r.weight) for r in last.real_servers] == [("w3", 3), ("w4", 4), ("w5", 5)]


def test_positions_and_duplicate_keys_hold_in_a_large_file():
    text = many_services(5000) + "  s17: {vip: 10.9.0.1, port: 80, workers: [w3]}\n" \
        + "  s5000: {vip: 10.9.0.2, port: 99999}\n"
    assert errors_of(text) == [
        (5017, 3, "duplicate key 's17' (first defined at line 34)"),
    ]
    text = many_services(5000) + "  s5000: {vip: 10.9.0.2, port: 99999}\n"
    assert errors_of(text) == [
        (5017, 32, "services.s5000.port: port 99999 is out of range (1 to 65535)"),
    ]
