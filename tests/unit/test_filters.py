"""SNS-style attribute filter policies: every operator, the edge cases, the errors, and a
property test against a small reference evaluator written here from the rules."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairq.errors import InvalidFilter, InvalidOption
from fairq.filters import MAX_KEYS, MAX_VALUES, Filter, compile_filter, parse_number

ABSENT: dict[str, str] = {}

ROWS: list[tuple[Any, dict[str, str], bool]] = [
    # No policy, empty policy: everything passes.
    (None, {}, True),
    (None, {"a": "x"}, True),
    ({}, {"a": "x"}, True),
    # Exact strings; a list is OR, keys are AND; other attributes are ignored.
    ({"a": "x"}, {"a": "x"}, True),
    ({"a": "x"}, {"a": "X"}, False),
    ({"a": "x"}, {"a": "x", "other": "1"}, True),
    ({"a": "x"}, ABSENT, False),
    ({"a": ["x", "y"]}, {"a": "y"}, True),
    ({"a": ["x", "y"]}, {"a": "z"}, False),
    ({"a": ("x", "y")}, {"a": "y"}, True),
    ({"a": "x", "b": "y"}, {"a": "x", "b": "y"}, True),
    ({"a": "x", "b": "y"}, {"a": "x"}, False),
    ({"a": "x", "b": "y"}, {"a": "x", "b": "z"}, False),
    ({"a": ""}, {"a": ""}, True),
    ({"a": "10"}, {"a": "10.0"}, False),  # a string is compared as a string
    # Bare numbers compare numerically with the parsed attribute.
    ({"n": 10}, {"n": "10"}, True),
    ({"n": 10}, {"n": "10.0"}, True),
    ({"n": 10}, {"n": "1e1"}, True),
    ({"n": 10}, {"n": "ten"}, False),
    ({"n": 10.5}, {"n": "10.50"}, True),
    ({"n": -3}, {"n": "-3"}, True),
    ({"n": 3}, {"n": "+3"}, True),
    ({"n": 0}, {"n": "-0"}, True),
    ({"n": 0.5}, {"n": ".5"}, True),
    ({"n": 10}, {"n": " 10"}, False),  # whitespace is not part of a number
    ({"n": 1000}, {"n": "1_000"}, False),  # nor are underscores
    ({"n": 10}, ABSENT, False),
    # prefix / suffix / equals-ignore-case
    ({"a": {"prefix": "eu-"}}, {"a": "eu-west"}, True),
    ({"a": {"prefix": "eu-"}}, {"a": "us-east"}, False),
    ({"a": {"prefix": "eu-"}}, {"a": "EU-west"}, False),
    ({"a": [{"prefix": "eu-"}]}, ABSENT, False),
    ({"a": {"prefix": ""}}, {"a": "anything"}, True),
    ({"a": {"suffix": ".jpg"}}, {"a": "cat.jpg"}, True),
    ({"a": {"suffix": ".jpg"}}, {"a": "cat.png"}, False),
    ({"a": {"equals-ignore-case": "Gold"}}, {"a": "GOLD"}, True),
    ({"a": {"equals-ignore-case": "Gold"}}, {"a": "gold"}, True),
    ({"a": {"equals-ignore-case": "Gold"}}, {"a": "golden"}, False),
    ({"a": {"equals-ignore-case": "straße"}}, {"a": "STRASSE"}, True),
    ({"a": {"equals-ignore-case": "STRASSE"}}, {"a": "straße"}, True),  # casefold, not lower
    # anything-but: present and none of the values; an absent attribute does not match.
    ({"a": {"anything-but": ["x", "y"]}}, {"a": "z"}, True),
    ({"a": {"anything-but": ["x", "y"]}}, {"a": "x"}, False),
    ({"a": {"anything-but": ["x", "y"]}}, ABSENT, False),
    ({"a": {"anything-but": "x"}}, {"a": "x"}, False),
    ({"a": {"anything-but": "x"}}, {"a": "xx"}, True),
    ({"n": {"anything-but": [100, 500]}}, {"n": "101"}, True),
    ({"n": {"anything-but": [100, 500]}}, {"n": "100.0"}, False),
    ({"n": {"anything-but": [100, 500]}}, {"n": "abc"}, True),
    ({"n": {"anything-but": 100}}, {"n": "1e2"}, False),
    ({"n": {"anything-but": "100"}}, {"n": "1e2"}, True),
    ({"a": {"anything-but": {"prefix": "test-"}}}, {"a": "test-1"}, False),
    ({"a": {"anything-but": {"prefix": "test-"}}}, {"a": "prod-1"}, True),
    ({"a": {"anything-but": {"prefix": "test-"}}}, ABSENT, False),
    ({"a": [{"anything-but": ["x"]}, {"exists": False}]}, ABSENT, True),
    ({"a": [{"anything-but": ["x"]}, {"exists": False}]}, {"a": "x"}, False),
    ({"a": [{"anything-but": ["x"]}, {"exists": False}]}, {"a": "y"}, True),
    # numeric ranges
    ({"p": {"numeric": [">=", 10, "<", 20]}}, {"p": "10"}, True),
    ({"p": {"numeric": [">=", 10, "<", 20]}}, {"p": "19.999"}, True),
    ({"p": {"numeric": [">=", 10, "<", 20]}}, {"p": "20"}, False),
    ({"p": {"numeric": [">=", 10, "<", 20]}}, {"p": "9.99"}, False),
    ({"p": {"numeric": [">=", 10, "<", 20]}}, {"p": "abc"}, False),
    ({"p": {"numeric": [">=", 10, "<", 20]}}, ABSENT, False),
    ({"p": {"numeric": [">", 0, "<=", 5]}}, {"p": "0"}, False),
    ({"p": {"numeric": [">", 0, "<=", 5]}}, {"p": "5"}, True),
    ({"p": {"numeric": ["=", 301.5]}}, {"p": "3.015e2"}, True),
    ({"p": {"numeric": ["=", 301.5]}}, {"p": "301.6"}, False),
    ({"p": {"numeric": ["<", 0]}}, {"p": "-0.5"}, True),
    ({"p": {"numeric": ["<", 0]}}, {"p": "0"}, False),
    ({"p": {"numeric": ["<=", 0]}}, {"p": "0"}, True),
    ({"p": {"numeric": [">", 0]}}, {"p": "nan"}, False),
    ({"p": {"numeric": [">", 0]}}, {"p": "inf"}, False),
    ({"p": {"numeric": [">", 0]}}, {"p": "1e400"}, False),  # overflows to inf: not a number
    ({"p": {"numeric": [">", 0]}}, {"p": "0x10"}, False),
    ({"p": {"numeric": [">", 0]}}, {"p": ""}, False),
    # exists
    ({"a": {"exists": True}}, {"a": "x"}, True),
    ({"a": {"exists": True}}, {"a": ""}, True),
    ({"a": {"exists": True}}, ABSENT, False),
    ({"a": {"exists": False}}, ABSENT, True),
    ({"a": {"exists": False}}, {"b": "x"}, True),
    ({"a": {"exists": False}}, {"a": "x"}, False),
    ({"a": [{"exists": True}], "b": "x"}, {"a": "1", "b": "x"}, True),
    ({"a": [{"exists": True}], "b": "x"}, {"b": "x"}, False),
    # Mixed alternatives.
    ({"a": ["gold", {"prefix": "plat"}, 7]}, {"a": "gold"}, True),
    ({"a": ["gold", {"prefix": "plat"}, 7]}, {"a": "platinum"}, True),
    ({"a": ["gold", {"prefix": "plat"}, 7]}, {"a": "7.0"}, True),
    ({"a": ["gold", {"prefix": "plat"}, 7]}, {"a": "silver"}, False),
    (
        {"store": ["example_corp"], "event": [{"anything-but": "order_cancelled"}],
         "price_usd": [{"numeric": [">=", 100]}]},
        {"store": "example_corp", "event": "order_placed", "price_usd": "210.75"},
        True,
    ),
    (
        {"store": ["example_corp"], "event": [{"anything-but": "order_cancelled"}],
         "price_usd": [{"numeric": [">=", 100]}]},
        {"store": "example_corp", "event": "order_cancelled", "price_usd": "210.75"},
        False,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("policy", "attributes", "expected"), ROWS)
def test_filter_table(policy: Any, attributes: dict[str, str], expected: bool) -> None:
    assert compile_filter(policy).matches(attributes) is expected
    assert reference_matches(policy, attributes) is expected  # the reference agrees too


def test_table_is_large_enough() -> None:
    assert len(ROWS) >= 40


# --- invalid policies --------------------------------------------------------------------------

INVALID: list[tuple[Any, str]] = [
    (["a", "x"], 'got ["a", "x"]'),
    ("a", 'got "a"'),
    ({"a": []}, "filter key 'a': the condition is an empty list"),
    ({1: "x"}, "filter key 1: attribute names are strings"),
    ({"": "x"}, "filter key '': attribute names are strings of 1-128"),
    ({"k" * 129: "x"}, "attribute names are strings of 1-128"),
    ({"$or": [{"a": "x"}, {"b": "y"}]}, "filter key '$or': the SNS $or operator is not supported"),
    ({"a": True}, "filter key 'a': true is not a value"),
    ({"a": [None]}, "filter key 'a': null is not a value"),
    ({"a": [["x"]]}, """filter key 'a': ["x"] is not a string, a number or an operator"""),
    ({"a": float("nan")}, "filter key 'a': a numeric value needs a finite number, got NaN"),
    ({"a": 10**400}, "filter key 'a': a numeric value needs a finite number"),
    ({"a": [10**30]}, "needs a finite number, got 1000000000000000000000000000000 (integers of at"),
    ({"a": [-(2**63) - 1]}, "(integers of at most 64 bits; write larger ones as floats: 1e30)"),
    ({"a": {}}, "filter key 'a': an operator object holds exactly one operator, got {}"),
    ({"a": {"prefix": "x", "suffix": "y"}}, "exactly one operator"),
    ({"a": {"cidr": "10.0.0.0/8"}}, """filter key 'a': unknown operator "cidr"; known:"""),
    ({"a": {"b": ["x"]}}, """unknown operator "b" (nested policies are not supported)"""),
    ({"a": {"prefix": 5}}, """filter key 'a': "prefix" needs a string, got 5"""),
    ({"a": {"suffix": None}}, """filter key 'a': "suffix" needs a string, got null"""),
    ({"a": {"equals-ignore-case": ["x"]}}, """"equals-ignore-case" needs a string, got ["x"]"""),
    ({"a": {"exists": "true"}}, """filter key 'a': "exists" needs true or false, got "true\""""),
    ({"a": {"exists": 1}}, """"exists" needs true or false, got 1"""),
    (
        {"price": {"numeric": [">", "x"]}},
        """filter key 'price': "numeric" needs an operator and a number, got [">", "x"]""",
    ),
    ({"p": {"numeric": [">"]}}, """filter key 'p': "numeric" needs an operator and a number"""),
    ({"p": {"numeric": []}}, """"numeric" needs an operator and a number, or a lower and an"""),
    ({"p": {"numeric": ">"}}, """"numeric" needs an operator and a number, or a lower"""),
    ({"p": {"numeric": [">", 1, "<"]}}, """"numeric" needs an operator and a number, or"""),
    ({"p": {"numeric": ["~", 1]}}, """"numeric" needs an operator and a number, got ["~", 1]"""),
    (
        {"p": {"numeric": [">", True]}},
        """"numeric" needs an operator and a number, got [">", true]""",
    ),
    ({"p": {"numeric": [">", float("nan")]}}, """"numeric" needs finite numbers, got [">", NaN]"""),
    ({"p": {"numeric": ["<", float("inf")]}}, """"numeric" needs finite numbers"""),
    ({"p": {"numeric": [">", 10**30]}}, """needs finite numbers, got [">", 100000000000000000"""),
    ({"p": {"numeric": [">", 10, "<", 5]}}, """needs the lower bound below the upper one"""),
    ({"p": {"numeric": [">=", 5, "<=", 5]}}, """got 5 and 5 (for exactly one number: ["=", 5])"""),
    ({"p": {"numeric": ["<", 5, ">", 1]}}, """needs a range as a lower bound (">" or ">=") then"""),
    ({"p": {"numeric": ["=", 1, "<", 5]}}, """needs a range as a lower bound"""),
    ({"p": {"numeric": [">", 1, "<", 5, "<", 6]}}, """"numeric" needs an operator and a number"""),
    ({"a": {"anything-but": []}}, """filter key 'a': "anything-but" needs at least one value"""),
    ({"a": {"anything-but": [{"prefix": "x"}]}}, """"anything-but" members are strings or num"""),
    (
        {"a": {"anything-but": [True]}},
        """"anything-but" members are strings or numbers, got true""",
    ),
    ({"a": {"anything-but": None}}, """"anything-but" members are strings or numbers, got null"""),
    ({"a": {"anything-but": [float("inf")]}}, """"anything-but" member needs a finite number"""),
    (
        {"a": {"anything-but": {"suffix": "x"}}},
        """"anything-but" takes a value, a list of values""",
    ),
    ({"a": {"anything-but": {"prefix": 1}}}, """"anything-but prefix" needs a string, got 1"""),
    ({f"k{i}": "x" for i in range(MAX_KEYS + 1)}, "at most 50 keys, got 51"),
    ({"a": ["x"] * 76, "b": ["y"] * 76}, "at most 150 values in total, got 152"),
    ({"a": {"anything-but": ["x"] * 151}}, "at most 150 values in total, got 151"),
]


@pytest.mark.parametrize(("policy", "message"), INVALID)
def test_invalid_policies_name_the_offending_part(policy: Any, message: str) -> None:
    with pytest.raises(InvalidFilter) as info:
        compile_filter(policy)
    assert message in str(info.value)


def test_limits_are_inclusive() -> None:
    assert compile_filter({f"k{i}": "x" for i in range(MAX_KEYS)}).matches(
        {f"k{i}": "x" for i in range(MAX_KEYS)}
    )
    assert compile_filter({"a": ["x"] * 75, "b": ["y"] * 75}).matches({"a": "x", "b": "y"})
    assert MAX_VALUES == 150


def test_invalid_filter_is_an_invalid_option_and_a_value_error() -> None:
    with pytest.raises(InvalidOption):
        compile_filter({"a": []})
    with pytest.raises(ValueError):
        compile_filter({"a": []})


# --- the Filter object -------------------------------------------------------------------------


def test_policy_is_normalized_and_copied() -> None:
    source: dict[str, Any] = {"a": "x", "b": ["y", {"prefix": "z"}], "n": {"numeric": (">", 1)}}
    compiled = compile_filter(source)
    assert compiled.policy == {
        "a": ["x"],
        "b": ["y", {"prefix": "z"}],
        "n": [{"numeric": [">", 1]}],
    }
    source["b"][1]["prefix"] = "changed"
    assert compiled.matches({"a": "x", "b": "zebra", "n": "2"})
    policy = compiled.policy
    assert policy is not None
    policy["a"].append("w")
    assert compiled.policy is not None and compiled.policy["a"] == ["x"]
    assert compiled.keys == frozenset({"a", "b", "n"})


def test_equality_and_identity() -> None:
    assert compile_filter({"a": "x"}) == compile_filter({"a": ["x"]})
    assert compile_filter({"a": "x"}) != compile_filter({"a": "y"})
    assert compile_filter(None) == compile_filter({})
    assert compile_filter(None).policy is None
    assert compile_filter(None).keys == frozenset()
    compiled = compile_filter({"a": "x"})
    assert compile_filter(compiled) is compiled
    assert "prefix" in repr(compile_filter({"a": {"prefix": "x"}}))
    assert isinstance(compiled, Filter)


def test_parse_number() -> None:
    assert parse_number("10") == 10.0
    assert parse_number("-2.5e1") == -25.0
    assert parse_number("5.") == 5.0
    for text in ["", " 1", "1 ", "1_0", "nan", "inf", "-Infinity", "0x1", "1e400", "1e", ".", "+"]:
        assert parse_number(text) is None, text


# --- property: the compiled filter agrees with a direct reading of the rules -------------------

_NUMBER_TEXT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\Z")


def reference_number(text: str) -> float | None:
    if not _NUMBER_TEXT.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def reference_item(item: Any, value: str | None) -> bool:
    """Does one alternative hold for an attribute value (None: absent)?"""
    if isinstance(item, dict):
        ((operator, argument),) = item.items()
        if operator == "exists":
            return (value is not None) is argument
        if value is None:
            return False
        if operator == "prefix":
            return value.startswith(argument)
        if operator == "suffix":
            return value.endswith(argument)
        if operator == "equals-ignore-case":
            return bool(value.casefold() == argument.casefold())
        if operator == "anything-but":
            if isinstance(argument, dict):
                return not value.startswith(argument["prefix"])
            members = argument if isinstance(argument, list) else [argument]
            return not any(reference_item(member, value) for member in members)
        if operator == "numeric":
            number = reference_number(value)
            compare = {
                "=": lambda a, b: a == b,
                "<": lambda a, b: a < b,
                "<=": lambda a, b: a <= b,
                ">": lambda a, b: a > b,
                ">=": lambda a, b: a >= b,
            }
            return number is not None and all(
                compare[argument[i]](number, argument[i + 1]) for i in range(0, len(argument), 2)
            )
        raise AssertionError(operator)
    if value is None:
        return False
    if isinstance(item, str):
        return value == item
    return bool(reference_number(value) == item)


def reference_matches(policy: Any, attributes: dict[str, str]) -> bool:
    if not policy:
        return True
    for key, condition in policy.items():
        alternatives = list(condition) if isinstance(condition, list | tuple) else [condition]
        if not any(reference_item(item, attributes.get(key)) for item in alternatives):
            return False
    return True


TEXTS = ["", "x", "xy", "X", "abc", "ß", "SS", "ss", "10", "10.0", "1e1", "-3", "2.5", "100",
         "20", "0", "+0", " 5", "nan", "inf", "1_0", "1e400"]  # fmt: skip
NUMBERS = [-3, 0, 2.5, 10, 20, 100]
KEYS = ["a", "b", "c"]

texts = st.sampled_from(TEXTS)
numbers = st.sampled_from(NUMBERS)
plain = st.one_of(texts, numbers)


@st.composite
def numeric_specs(draw: st.DrawFn) -> list[Any]:
    if draw(st.booleans()):
        return [draw(st.sampled_from(["=", "<", "<=", ">", ">="])), draw(numbers)]
    low, high = sorted(draw(st.lists(numbers, min_size=2, max_size=2, unique=True)))
    return [draw(st.sampled_from([">", ">="])), low, draw(st.sampled_from(["<", "<="])), high]


items = st.one_of(
    plain,
    texts.map(lambda t: {"prefix": t[:2]}),
    texts.map(lambda t: {"suffix": t[-1:]}),
    texts.map(lambda t: {"equals-ignore-case": t}),
    st.booleans().map(lambda b: {"exists": b}),
    numeric_specs().map(lambda spec: {"numeric": spec}),
    st.one_of(
        plain,
        st.lists(plain, min_size=1, max_size=3),
        texts.map(lambda t: {"prefix": t[:1]}),
    ).map(lambda spec: {"anything-but": spec}),
)
conditions = st.one_of(items, st.lists(items, min_size=1, max_size=3))
policies = st.one_of(st.none(), st.dictionaries(st.sampled_from(KEYS), conditions, max_size=3))
attribute_maps = st.dictionaries(st.sampled_from([*KEYS, "d"]), texts, max_size=4)


@settings(max_examples=1000)
@given(policy=policies, attributes=attribute_maps)
def test_filter_agrees_with_reference(policy: Any, attributes: dict[str, str]) -> None:
    assert compile_filter(policy).matches(attributes) is reference_matches(policy, attributes)
