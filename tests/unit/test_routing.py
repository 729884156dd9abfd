"""AMQP topic routing: ``topic_matches`` (the reference), ``RoutingIndex`` (many patterns at
once) and the checks on patterns and routing keys.

The first table restates the expectations of RabbitMQ's own topic-exchange test
(rabbitmq-server ``deps/rabbit/test/routing_SUITE.erl``, ``topic1``): the same bindings,
the same routing keys, the same expected queues. The second covers the edge cases that
suite leaves out (empty words, ``*`` against empty keys, validation).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairq.errors import InvalidFilter, InvalidMessage, InvalidOption
from fairq.routing import (
    MAX_ROUTING_KEY_BYTES,
    RoutingIndex,
    check_pattern,
    check_routing_key,
    is_exact,
    topic_matches,
)

# --- RabbitMQ's routing_SUITE:topic1 --------------------------------------------------------

RABBIT_BINDINGS = {
    "t1": "a.b.c",
    "t2": "a.*.c",
    "t3": "a.#.b",
    "t4": "a.b.b.c",
    "t5": "#",
    "t6": "#.#",
    "t7": "#.b",
    "t8": "*.*",
    "t9": "a.*",
    "t10": "*.b.c",
    "t11": "a.#",
    "t12": "a.#.#",
    "t13": "b.b.c",
    "t14": "a.b.b",
    "t15": "a.b",
    "t16": "b.c",
    "t17": "",
    "t18": "*.*.*",
    "t19": "vodka.martini",
    "t20": "a.b.c",
    "t21": "*.#",
    "t22": "#.*.#",
    "t23": "*.#.#",
    "t24": "#.#.#",
    "t25": "*",
    "t26": "#.b.#",
    "t27": "args-test",
}


def _names(text: str) -> set[str]:
    return {f"t{n}" for n in text.split()}


RABBIT_EXPECTED = {
    "a.b.c": _names("1 2 5 6 10 11 12 18 20 21 22 23 24 26"),
    "a.b": _names("3 5 6 7 8 9 11 12 15 21 22 23 24 26"),
    "a.b.b": _names("3 5 6 7 11 12 14 18 21 22 23 24 26"),
    "": _names("5 6 17 24"),
    "b.c.c": _names("5 6 18 21 22 23 24 26"),
    "a.a.a.a.a": _names("5 6 11 12 21 22 23 24"),
    "vodka.gin": _names("5 6 8 21 22 23 24"),
    "vodka.martini": _names("5 6 8 19 21 22 23 24"),
    "b.b.c": _names("5 6 10 13 18 21 22 23 24 26"),
    "nothing.here.at.all": _names("5 6 21 22 23 24"),
    "oneword": _names("5 6 21 22 23 24 25"),
    "args-test": _names("5 6 21 22 23 24 25 27"),
}

# After removing the bindings t1, t5, t11, t19 and t21.
RABBIT_EXPECTED_AFTER_REMOVAL = {
    "a.b.c": _names("2 6 10 12 18 20 22 23 24 26"),
    "a.b": _names("3 6 7 8 9 12 15 22 23 24 26"),
    "a.b.b": _names("3 6 7 12 14 18 22 23 24 26"),
    "": _names("6 17 24"),
    "b.c.c": _names("6 18 22 23 24 26"),
    "a.a.a.a.a": _names("6 12 22 23 24"),
    "vodka.gin": _names("6 8 22 23 24"),
    "vodka.martini": _names("6 8 22 23 24"),
    "b.b.c": _names("6 10 13 18 22 23 24 26"),
    "nothing.here.at.all": _names("6 22 23 24"),
    "oneword": _names("6 22 23 24 25"),
    "args-test": _names("6 22 23 24 25 27"),
}

RABBIT_ROWS = [
    (pattern, key, name in expected)
    for key, expected in RABBIT_EXPECTED.items()
    for name, pattern in RABBIT_BINDINGS.items()
]

# --- edge cases --------------------------------------------------------------------------------

EDGE_ROWS = [
    # The empty key has no words: '#' and '' match it, '*' does not.
    ("", "", True),
    ("#", "", True),
    ("#.#", "", True),
    ("*", "", False),
    ("*.#", "", False),
    ("#.*", "", False),
    ("#.*.#", "", False),
    ("", "a", False),
    ("a", "", False),
    # Empty words are words.
    (".", ".", True),
    ("*", ".", False),
    ("*.*", ".", True),
    ("#", ".", True),
    ("*.a", ".a", True),
    ("*.a", "a", False),
    (".a", ".a", True),
    (".a", "a", False),
    ("a.*", "a.", True),
    ("a.*", "a", False),
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("a.*.b", "a..b", True),
    ("a.#.b", "a..b", True),
    ("a.#", "a.", True),
    # '#' is zero or more words, anywhere.
    ("#", "a.b.c.d.e.f.g", True),
    ("a.#", "a", True),
    ("a.#", "ab", False),
    ("a.#", "b.a", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("a.#.b", "b", False),
    ("a.#.#.b", "a.b", True),
    ("#.a", "a", True),
    ("#.a", "b.a", True),
    ("#.a", "a.b", False),
    ("#.#.a", "a", True),
    ("#.a.#", "x.a.y.z", True),
    ("#.a.#.a.#", "a", False),
    ("#.a.#.a.#", "a.a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("*.#.*", "a.b.c.d", True),
    ("#.*.#", "a", True),
    ("#.*.*.#", "a", False),
    # '*' is exactly one word.
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", "a", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.b.b.c", False),
    # No wildcards: an exact, case-sensitive match of the whole key.
    ("a.b", "a.b", True),
    ("a.b", "a.b.c", False),
    ("a.b.c", "a.b", False),
    ("A.b", "a.b", False),
    ("ab", "a.b", False),
    ("ü.*", "ü.x", True),
    # '*' and '#' in a routing key are ordinary characters.
    ("a.*", "a.*", True),
    ("a.b", "a.*", False),
    ("a.#", "a.#", True),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), RABBIT_ROWS + EDGE_ROWS)
def test_topic_matches_table(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected
    index: RoutingIndex[str] = RoutingIndex()
    index.add(pattern, "v")
    assert index.match(key) == ({"v"} if expected else set())


def test_table_is_large_enough() -> None:
    assert len(EDGE_ROWS) >= 40
    assert len(RABBIT_ROWS) == len(RABBIT_BINDINGS) * len(RABBIT_EXPECTED)


def test_index_reproduces_rabbitmq_topic_suite() -> None:
    index: RoutingIndex[str] = RoutingIndex()
    for name, pattern in RABBIT_BINDINGS.items():
        index.add(pattern, name)
    assert len(index) == len(RABBIT_BINDINGS)
    for key, expected in RABBIT_EXPECTED.items():
        assert index.match(key) == expected, key
    for name in ("t1", "t5", "t11", "t19", "t21"):
        index.remove(RABBIT_BINDINGS[name], name)
    for key, expected in RABBIT_EXPECTED_AFTER_REMOVAL.items():
        assert index.match(key) == expected, key
    for name, pattern in RABBIT_BINDINGS.items():
        index.discard(pattern, name)
    assert len(index) == 0
    assert index.match("a.b.c") == set()
    assert index._root.is_empty()  # removal pruned every branch


def test_none_pattern_matches_everything() -> None:
    assert topic_matches(None, "")
    assert topic_matches(None, "a.b")
    index: RoutingIndex[str] = RoutingIndex()
    index.add(None, "fanout")
    index.add("a.b", "direct")
    index.add("a.*", "topic")
    assert index.match("a.b") == {"fanout", "direct", "topic"}
    assert index.match("") == {"fanout"}
    assert index.match("x.y") == {"fanout"}
    index.remove(None, "fanout")
    assert index.match("x.y") == set()


def test_index_add_is_idempotent_and_values_are_per_pattern() -> None:
    index: RoutingIndex[str] = RoutingIndex()
    index.add("a.*", "s1")
    index.add("a.*", "s1")
    index.add("a.*", "s2")
    index.add("a.#", "s1")
    assert len(index) == 3
    assert index.match("a.b") == {"s1", "s2"}
    index.remove("a.*", "s1")
    assert index.match("a.b") == {"s1", "s2"}  # s1 still via a.#
    assert index.match("a.b.c") == {"s1"}
    assert sorted(index, key=str) == sorted([("a.*", "s2"), ("a.#", "s1")], key=str)


def test_index_remove_of_an_unknown_pair() -> None:
    index: RoutingIndex[str] = RoutingIndex()
    index.add("a.*.c", "s")
    index.add("x", "s")
    for pattern, value in [("a.*.c", "other"), ("a.*", "s"), ("a.*.c.d", "s"), ("x", "t")]:
        with pytest.raises(KeyError):
            index.remove(pattern, value)
        assert index.discard(pattern, value) is False
    with pytest.raises(KeyError):
        index.remove(None, "s")
    assert len(index) == 2
    assert index.match("a.b.c") == {"s"}


def test_index_rejects_bad_patterns_and_keys() -> None:
    index: RoutingIndex[str] = RoutingIndex()
    with pytest.raises(InvalidFilter):
        index.add("a*.b", "s")
    with pytest.raises(InvalidFilter):
        index.discard("a.b#", "s")
    with pytest.raises(InvalidMessage):
        index.match("x" * 256)
    assert len(index) == 0


def test_many_hashes_do_not_blow_up() -> None:
    # Without the memo of '#' states this walk is exponential in the number of '#'.
    pattern = ".".join(["#"] * 40 + ["z"])
    key = ".".join(["a"] * 100)
    index: RoutingIndex[str] = RoutingIndex()
    index.add(pattern, "deep")
    index.add(".".join(["#"] * 40), "all")
    assert index.match(key) == {"all"}
    assert index.match(key + ".z") == {"deep", "all"}
    assert not topic_matches(pattern, key)
    assert topic_matches(pattern, key + ".z")


def test_is_exact() -> None:
    assert is_exact("a.b")
    assert is_exact("")
    assert not is_exact("a.*")
    assert not is_exact("#")


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "word"),
    [
        ("a*.b", "'a*'"),
        ("a.b#", "'b#'"),
        ("*#", "'*#'"),
        ("##", "'##'"),
        ("a.**", "'**'"),
        ("#a", "'#a'"),
    ],
)
def test_check_pattern_wildcards_must_be_whole_words(pattern: str, word: str) -> None:
    with pytest.raises(InvalidFilter) as info:
        check_pattern(pattern)
    assert word in str(info.value)
    assert repr(pattern) in str(info.value)
    with pytest.raises(InvalidFilter):
        topic_matches(pattern, "a.b")


@pytest.mark.parametrize("pattern", ["", "a", "a..b", ".", "*", "#", "#.#", "*.a.#", "x" * 255])
def test_check_pattern_accepts(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


def test_check_pattern_limits_and_types() -> None:
    with pytest.raises(InvalidFilter, match="256 bytes"):
        check_pattern("x" * 256)
    with pytest.raises(InvalidFilter, match="256 bytes"):
        check_pattern("é" * 128)  # 128 characters, 256 bytes of UTF-8
    assert check_pattern("é" * 127) == "é" * 127
    with pytest.raises(InvalidFilter, match="bytes"):
        check_pattern(b"a.b")
    with pytest.raises(InvalidFilter, match="NoneType"):
        check_pattern(None)


def test_check_routing_key() -> None:
    for key in ["", "a", "a..b", ".", "a.*", "a.#", "x" * MAX_ROUTING_KEY_BYTES]:
        assert check_routing_key(key) == key
    with pytest.raises(InvalidMessage, match="256 bytes"):
        check_routing_key("x" * 256)
    with pytest.raises(InvalidMessage, match="256 bytes"):
        check_routing_key("é" * 128)
    with pytest.raises(InvalidMessage, match="int"):
        check_routing_key(7)
    with pytest.raises(InvalidMessage):
        topic_matches("#", "x" * 256)


def test_errors_are_value_errors() -> None:
    assert issubclass(InvalidFilter, InvalidOption)
    assert issubclass(InvalidFilter, ValueError)
    assert issubclass(InvalidMessage, ValueError)


# --- properties --------------------------------------------------------------------------------


def reference_match(pattern: list[str], key: list[str]) -> bool:
    """The textbook recursive definition, independent of the module's dynamic programme."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return reference_match(rest, key) or (bool(key) and reference_match(pattern, key[1:]))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference_match(rest, key[1:])


def split(text: str) -> list[str]:
    return text.split(".") if text else []


pattern_words = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=5)
key_words = st.lists(st.sampled_from(["a", "b", ""]), max_size=5)
patterns = pattern_words.map(".".join)
keys = key_words.map(".".join)


@settings(max_examples=500)
@given(pattern=patterns, key=keys)
def test_topic_matches_agrees_with_the_recursive_definition(pattern: str, key: str) -> None:
    assert topic_matches(pattern, key) == reference_match(split(pattern), split(key))


@settings(max_examples=300)
@given(
    entries=st.lists(
        st.tuples(st.one_of(st.none(), patterns), st.integers(0, 5)), min_size=0, max_size=25
    ),
    removals=st.lists(st.integers(0, 24), max_size=8),
    probes=st.lists(keys, min_size=1, max_size=8),
)
def test_index_agrees_with_brute_force(
    entries: list[tuple[str | None, int]], removals: list[int], probes: list[str]
) -> None:
    index: RoutingIndex[int] = RoutingIndex()
    held: set[tuple[str | None, int]] = set()
    for pattern, value in entries:
        index.add(pattern, value)
        held.add((pattern, value))
    for position in removals:
        if position < len(entries):
            pattern, value = entries[position]
            assert index.discard(pattern, value) == ((pattern, value) in held)
            held.discard((pattern, value))
    assert len(index) == len(held)
    assert set(index) == held
    for key in probes:
        expected = {v for p, v in held if topic_matches(p, key)}
        assert index.match(key) == expected, key
