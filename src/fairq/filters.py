"""Filter policies: which messages a subscription wants, by their attributes.

The policy language is Amazon SNS's message-attribute filter policy. A policy is a dict
of attribute name to condition; **all** keys must hold. A condition is a list of
alternatives, **any** of which may match (a bare item is shorthand for a one-item list):

===========================================  ==============================================
``"gold"``                                   the attribute equals ``gold`` (case-sensitive)
``10``                                       the attribute is a number equal to 10
                                             (``"10"``, ``"10.0"``, ``"1e1"``)
``{"prefix": "eu-"}``                        starts with ``eu-``
``{"suffix": ".jpg"}``                       ends with ``.jpg``
``{"equals-ignore-case": "Gold"}``           equals ``gold`` ignoring case (Unicode casefold)
``{"anything-but": ["a", 5]}``               present and none of these (also a bare string
                                             or number, or ``{"prefix": "x"}``)
``{"numeric": [">=", 10, "<", 20]}``         a number in range: one bound (``=`` ``<``
                                             ``<=`` ``>`` ``>=``) or a lower bound
                                             (``>``/``>=``) then an upper (``<``/``<=``)
``{"exists": true}`` / ``{"exists": false}`` the attribute is present / absent
===========================================  ==============================================

Attributes are strings in fairq, so numeric conditions parse them: a decimal number
with an optional sign, fraction and exponent (``-3``, ``2.50``, ``1e3``). Anything else
(``"ten"``, ``" 5"``, ``"1_000"``, ``"nan"``, ``"inf"``) is not a number and matches no
numeric condition. Numbers compare as floats.

An absent attribute matches only ``{"exists": false}``; in particular ``anything-but``
does not match an absent attribute (as in SNS — list ``{"exists": false}`` beside it to
accept that too). Unlike SNS, ``{"exists": false}`` also matches a message with no
attributes at all, and ``{"exists": true}`` matches an attribute whose value is ``""``.

A policy of ``None`` or ``{}`` matches every message. Invalid policies raise
:class:`~fairq.errors.InvalidFilter` when compiled, naming the key and the part at fault.
Limits, to keep matching cheap: at most :data:`MAX_KEYS` (50) keys and
:data:`MAX_VALUES` (150) values in total, where every alternative counts one and every
member of an ``anything-but`` list counts one. (SNS itself allows 5 keys and 150 for the
*product* of the alternatives per key.) Not supported: ``$or``, ``cidr``, nested
policies and the message-body scope; ``true``/``false``/``null`` as values (attributes
are strings: write ``"true"``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from operator import eq, ge, gt, le, lt
from typing import Any

from .errors import InvalidFilter
from .message import MAX_ATTRIBUTE_KEY

__all__ = [
    "MAX_KEYS",
    "MAX_VALUES",
    "Filter",
    "compile_filter",
    "parse_number",
]

MAX_KEYS = 50
MAX_VALUES = 150

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_Compare = Callable[[float, float], bool]
_LOWER: dict[str, _Compare] = {">": gt, ">=": ge}
_UPPER: dict[str, _Compare] = {"<": lt, "<=": le}
_ANY_BOUND: dict[str, _Compare] = {**_LOWER, **_UPPER, "=": eq}
_OPERATORS = ("anything-but", "equals-ignore-case", "exists", "numeric", "prefix", "suffix")

# A test sees the attribute's text and, when the condition needs it, its numeric value.
_Test = Callable[[str, float | None], bool]


def parse_number(text: str) -> float | None:
    """The numeric value of attribute text, or None if it is not a finite decimal number."""
    if _NUMBER.fullmatch(text) is None:
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def _show(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


class _Condition:
    """The compiled alternatives for one attribute."""

    __slots__ = ("if_absent", "if_present", "needs_number", "numbers", "strings", "tests")

    def __init__(self) -> None:
        self.if_absent = False  # {"exists": false} is among the alternatives
        self.if_present = False  # {"exists": true} is
        self.strings: set[str] = set()
        self.numbers: set[float] = set()
        self.tests: list[_Test] = []
        self.needs_number = False

    def holds(self, text: str | None) -> bool:
        if text is None:
            return self.if_absent
        if self.if_present or text in self.strings:
            return True
        number = parse_number(text) if self.needs_number else None
        if number is not None and number in self.numbers:
            return True
        return any(test(text, number) for test in self.tests)


class Filter:
    """A compiled filter policy; build one with :func:`compile_filter`.

    ``policy`` is the normalized policy (every condition a list, a JSON-ready copy) or
    ``None`` for "match everything"; two filters are equal when their policies are.
    """

    __slots__ = ("_conditions", "_policy")

    def __init__(
        self, policy: dict[str, list[Any]] | None, conditions: dict[str, _Condition]
    ) -> None:
        self._policy = policy
        self._conditions = tuple(conditions.items())

    @property
    def policy(self) -> dict[str, list[Any]] | None:
        """The normalized policy (a fresh copy), or None if this filter matches everything."""
        return json.loads(json.dumps(self._policy)) if self._policy is not None else None

    @property
    def keys(self) -> frozenset[str]:
        """The attribute names the policy looks at."""
        return frozenset(key for key, _ in self._conditions)

    def matches(self, attributes: Mapping[str, str]) -> bool:
        """True if a message with these attributes passes the filter."""
        return all(condition.holds(attributes.get(key)) for key, condition in self._conditions)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Filter):
            return NotImplemented
        return self._policy == other._policy

    __hash__ = None  # type: ignore[assignment]  # equal by a dict's value

    def __repr__(self) -> str:
        return f"Filter({_show(self._policy) if self._policy is not None else 'None'})"


def compile_filter(policy: Mapping[str, Any] | Filter | None) -> Filter:
    """Validate an SNS-style filter policy once and return a :class:`Filter`.

    ``None`` and ``{}`` match everything; a :class:`Filter` is returned as it is. Raises
    :class:`~fairq.errors.InvalidFilter` naming the offending key and part.
    """
    if isinstance(policy, Filter):
        return policy
    if policy is None:
        return Filter(None, {})
    if not isinstance(policy, Mapping):
        raise InvalidFilter(
            f"a filter policy is a dict of attribute name to condition, got {_show(policy)}"
        )
    if not policy:
        return Filter(None, {})
    if len(policy) > MAX_KEYS:
        raise InvalidFilter(f"a filter policy has at most {MAX_KEYS} keys, got {len(policy)}")
    alternatives: dict[str, list[Any]] = {}
    for key, raw in policy.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_ATTRIBUTE_KEY or "\x00" in key:
            raise InvalidFilter(
                f"filter key {key!r}: attribute names are strings of 1-{MAX_ATTRIBUTE_KEY} "
                "characters, without NUL"
            )
        if key == "$or":
            raise InvalidFilter(
                "filter key '$or': the SNS $or operator is not supported; "
                "use one subscription per alternative"
            )
        items = list(raw) if isinstance(raw, list | tuple) else [raw]
        if not items:
            raise InvalidFilter(
                f"filter key {key!r}: the condition is an empty list, which matches nothing; "
                "give at least one value"
            )
        alternatives[key] = items
    values = sum(_weight(item) for items in alternatives.values() for item in items)
    if values > MAX_VALUES:
        raise InvalidFilter(
            f"a filter policy has at most {MAX_VALUES} values in total, got {values}"
        )
    normalized: dict[str, list[Any]] = {}
    conditions: dict[str, _Condition] = {}
    for key, items in alternatives.items():
        condition = conditions[key] = _Condition()
        normalized[key] = [_compile_item(key, item, condition) for item in items]
        if _holds_nul(normalized[key]):  # attributes never do, and PostgreSQL refuses it
            raise InvalidFilter(f"filter key {key!r}: a value cannot contain NUL characters")
    # A copy through JSON, so later changes to the caller's dicts cannot reach the filter.
    return Filter(json.loads(json.dumps(normalized)), conditions)


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    return False


def _weight(item: Any) -> int:
    """How many values an alternative counts for the :data:`MAX_VALUES` limit."""
    if isinstance(item, Mapping):
        excluded = item.get("anything-but")
        if isinstance(excluded, list | tuple):
            return max(1, len(excluded))
    return 1


def _check_number(key: str, value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidFilter(f"filter key {key!r}: {where} needs a number, got {_show(value)}")
    number = _float_or_inf(value)
    if not math.isfinite(number):
        raise InvalidFilter(
            f"filter key {key!r}: {where} needs a finite number, got {_show(value)} (integers "
            "of at most 64 bits; write larger ones as floats: 1e30)"
        )
    return number


def _check_string(key: str, operator: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidFilter(f'filter key {key!r}: "{operator}" needs a string, got {_show(value)}')
    return value


def _compile_item(key: str, item: Any, condition: _Condition) -> Any:
    """Add one alternative to ``condition``; return its normalized (JSON-ready) form."""
    if isinstance(item, str):
        condition.strings.add(item)
        return item
    if isinstance(item, bool) or item is None:
        raise InvalidFilter(
            f"filter key {key!r}: {_show(item)} is not a value fairq can match (attributes "
            f'are strings): write "{_show(item)}" for the text, or use {{"exists": ...}}'
        )
    if isinstance(item, int | float):
        condition.numbers.add(_check_number(key, item, "a numeric value"))
        condition.needs_number = True
        return item
    if not isinstance(item, Mapping):
        raise InvalidFilter(
            f"filter key {key!r}: {_show(item)} is not a string, a number or an operator "
            'object such as {"prefix": "x"}'
        )
    if len(item) != 1:
        raise InvalidFilter(
            f"filter key {key!r}: an operator object holds exactly one operator, got {_show(item)}"
        )
    ((operator, value),) = item.items()
    if operator == "prefix":
        prefix = _check_string(key, operator, value)
        condition.tests.append(lambda text, _n: text.startswith(prefix))
    elif operator == "suffix":
        suffix = _check_string(key, operator, value)
        condition.tests.append(lambda text, _n: text.endswith(suffix))
    elif operator == "equals-ignore-case":
        folded = _check_string(key, operator, value).casefold()
        condition.tests.append(lambda text, _n: text.casefold() == folded)
    elif operator == "exists":
        if not isinstance(value, bool):
            raise InvalidFilter(
                f'filter key {key!r}: "exists" needs true or false, got {_show(value)}'
            )
        if value:
            condition.if_present = True
        else:
            condition.if_absent = True
    elif operator == "numeric":
        condition.tests.append(_compile_numeric(key, value))
        condition.needs_number = True
    elif operator == "anything-but":
        test, value, uses_number = _compile_anything_but(key, value)
        condition.tests.append(test)
        condition.needs_number = condition.needs_number or uses_number
    else:
        nested = " (nested policies are not supported)" if isinstance(value, list) else ""
        raise InvalidFilter(
            f"filter key {key!r}: unknown operator {_show(operator)}{nested}; "
            f"known: {', '.join(_OPERATORS)}"
        )
    return {operator: value}


def _compile_numeric(key: str, spec: Any) -> _Test:
    def bad(why: str) -> InvalidFilter:
        return InvalidFilter(f'filter key {key!r}: "numeric" {why}, got {_show(spec)}')

    if not isinstance(spec, list | tuple) or len(spec) not in (2, 4):
        raise bad("needs an operator and a number, or a lower and an upper bound")
    bounds: list[tuple[str, float]] = []
    for i in range(0, len(spec), 2):
        operator, number = spec[i], spec[i + 1]
        if (
            not isinstance(operator, str)
            or operator not in _ANY_BOUND
            or isinstance(number, bool)
            or not isinstance(number, int | float)
        ):
            raise bad("needs an operator and a number")
        if not math.isfinite(_float_or_inf(number)):
            raise InvalidFilter(
                f'filter key {key!r}: "numeric" needs finite numbers, got {_show(spec)} '
                "(integers of at most 64 bits; write larger ones as floats: 1e30)"
            )
        bounds.append((operator, float(number)))
    if len(bounds) == 1:
        ((operator, bound),) = bounds
        compare = _ANY_BOUND[operator]
        return lambda _text, n: n is not None and compare(n, bound)
    (low_op, low), (high_op, high) = bounds
    if low_op not in _LOWER or high_op not in _UPPER:
        raise bad('needs a range as a lower bound (">" or ">=") then an upper bound ("<" or "<=")')
    if not low < high:
        raise bad(
            f"needs the lower bound below the upper one, as SNS does, got {_show(spec[1])} "
            f'and {_show(spec[3])} (for exactly one number: ["=", {_show(spec[1])}])'
        )
    above, below = _LOWER[low_op], _UPPER[high_op]
    return lambda _text, n: n is not None and above(n, low) and below(n, high)


def _float_or_inf(number: int | float) -> float:
    """The number as a float; inf for one no float (nor a stored filter) can hold — an int
    of more than 64 bits, which JSON engines and their stores refuse (write 1e30 instead)."""
    if isinstance(number, int) and not -(2**63) <= number < 2**64:
        return math.inf
    try:
        return float(number)
    except OverflowError:
        return math.inf


def _compile_anything_but(key: str, spec: Any) -> tuple[_Test, Any, bool]:
    """The test, the normalized spec, and whether the test needs the numeric value."""
    where = '"anything-but"'
    if isinstance(spec, Mapping):
        if list(spec) != ["prefix"]:
            raise InvalidFilter(
                f"filter key {key!r}: {where} takes a value, a list of values or "
                f'{{"prefix": "x"}}, got {_show(spec)}'
            )
        prefix = _check_string(key, "anything-but prefix", spec["prefix"])
        return (lambda text, _n: not text.startswith(prefix)), {"prefix": prefix}, False
    members = list(spec) if isinstance(spec, list | tuple) else [spec]
    if not members:
        raise InvalidFilter(f"filter key {key!r}: {where} needs at least one value, got []")
    strings: set[str] = set()
    numbers: set[float] = set()
    for member in members:
        if isinstance(member, str):
            strings.add(member)
        elif isinstance(member, int | float) and not isinstance(member, bool):
            numbers.add(_check_number(key, member, f"{where} member"))
        else:
            raise InvalidFilter(
                f"filter key {key!r}: {where} members are strings or numbers, got {_show(member)}"
            )

    def test(text: str, number: float | None) -> bool:
        return text not in strings and (number is None or number not in numbers)

    return test, (members if isinstance(spec, list | tuple) else spec), bool(numbers)
