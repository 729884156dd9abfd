"""Routing keys and patterns: AMQP topic-exchange matching, and an index of many patterns.

A routing key is a string of words separated by ``.`` (at most 255 bytes of UTF-8, may be
empty). A pattern is the same, except that a word may be a wildcard:

* ``*`` matches exactly one word;
* ``#`` matches zero or more words.

These are RabbitMQ's topic-exchange rules, down to the edge cases:

* The empty string has *no* words (not one empty word), so the key ``""`` is matched by
  ``#``, ``#.#`` and the empty pattern ``""``, but not by ``*`` or ``*.#``.
* Empty words are words: ``"a..b"`` has three, ``".a"`` two (``""`` and ``"a"``), so
  ``*.a`` matches ``.a`` and ``a.*`` matches ``a.``.
* ``a.#.b`` matches ``a.b``, ``a.x.b`` and ``a.x.y.b``; ``a.#`` matches ``a``.
* A pattern without wildcards is an exact (direct) match.

One rule is stricter than RabbitMQ: a wildcard must be a whole word. RabbitMQ takes
``a*.b`` as the literal word ``a*``, which is almost always a mistake, so fairq refuses it
with :class:`~fairq.errors.InvalidFilter`. Routing keys may contain ``*`` and ``#``; there
they are ordinary characters, as in RabbitMQ.

:class:`RoutingIndex` holds many patterns and finds the ones a key matches in time that
does not grow with the number of patterns: exact patterns sit in a dict, wildcard
patterns in a trie of words, and fanout entries (pattern ``None``) in a set.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from .errors import InvalidFilter, InvalidMessage

__all__ = [
    "MAX_ROUTING_KEY_BYTES",
    "RoutingIndex",
    "check_pattern",
    "check_routing_key",
    "is_exact",
    "topic_matches",
]

MAX_ROUTING_KEY_BYTES = 255
# A str of at most this many characters is at most 255 bytes of UTF-8 (4 bytes a character),
# so short keys skip the encode.
_SURELY_SHORT = MAX_ROUTING_KEY_BYTES // 4

T = TypeVar("T", bound=Hashable)


def _byte_length(text: str) -> int:
    return len(text) if len(text) <= _SURELY_SHORT else len(text.encode("utf-8", "surrogatepass"))


def _words(text: str) -> list[str]:
    # RabbitMQ splits "" into no words at all, and anything else on every dot.
    return text.split(".") if text else []


def check_routing_key(key: object) -> str:
    """Return ``key`` if it is a valid routing key, else raise :class:`~fairq.InvalidMessage`.

    A routing key is a ``str`` of at most 255 bytes of UTF-8; it may be empty, have empty
    words (``"a..b"``) and contain ``*`` or ``#`` (ordinary characters in a key).
    """
    if not isinstance(key, str):
        raise InvalidMessage(f"a routing key is a str, got {type(key).__name__}")
    if "\x00" in key:  # no engine's text type takes it alike (PostgreSQL refuses it)
        raise InvalidMessage(f"a routing key cannot contain NUL characters: {key!r}")
    if _byte_length(key) > MAX_ROUTING_KEY_BYTES:
        raise InvalidMessage(
            f"routing key {key[:40]!r}... is {_byte_length(key)} bytes of UTF-8, "
            f"the limit is {MAX_ROUTING_KEY_BYTES}"
        )
    return key


def check_pattern(pattern: object) -> str:
    """Return ``pattern`` if it is a valid routing pattern, else raise
    :class:`~fairq.InvalidFilter`.

    A pattern is a ``str`` of at most 255 bytes of UTF-8 whose words are separated by
    ``.``; ``*`` and ``#`` are allowed only as whole words (``a.*.c``, not ``a*.c``).
    """
    if not isinstance(pattern, str):
        raise InvalidFilter(f"a routing pattern is a str, got {type(pattern).__name__}")
    if "\x00" in pattern:  # as in routing keys: no engine's text holds it alike
        raise InvalidFilter(f"a routing pattern cannot contain NUL characters: {pattern!r}")
    if _byte_length(pattern) > MAX_ROUTING_KEY_BYTES:
        raise InvalidFilter(
            f"routing pattern {pattern[:40]!r}... is {_byte_length(pattern)} bytes of UTF-8, "
            f"the limit is {MAX_ROUTING_KEY_BYTES}"
        )
    if "*" in pattern or "#" in pattern:
        for position, word in enumerate(_words(pattern), 1):
            if word not in ("*", "#") and ("*" in word or "#" in word):
                raise InvalidFilter(
                    f"routing pattern {pattern!r}: word {position} ({word!r}) mixes a wildcard "
                    "with other characters; '*' and '#' must be whole words between dots, "
                    "e.g. 'order.*.paid' or 'order.#'"
                )
    return pattern


def is_exact(pattern: str) -> bool:
    """True if ``pattern`` has no wildcard words, so it matches exactly one routing key."""
    return "*" not in pattern and "#" not in pattern


def topic_matches(pattern: str | None, key: str) -> bool:
    """True if routing ``key`` matches topic ``pattern`` (``None`` matches every key).

    This is the reference definition; :class:`RoutingIndex` gives the same answers for
    many patterns at once. Both arguments are validated.
    """
    check_routing_key(key)
    if pattern is None:
        return True
    check_pattern(pattern)
    if is_exact(pattern):
        return pattern == key
    words = _words(key)
    # reach[j]: the pattern words seen so far can match exactly the first j key words.
    reach = [True] + [False] * len(words)
    for token in _words(pattern):
        if token == "#":
            seen = False
            for j, ok in enumerate(reach):
                seen = seen or ok
                reach[j] = seen
        elif token == "*":
            reach = [False, *reach[:-1]]
        else:
            reach = [False] + [reach[j] and words[j] == token for j in range(len(words))]
        if not any(reach):
            return False
    return reach[-1]


class _Node(Generic[T]):
    """One trie node: the pattern words consumed so far lead here."""

    __slots__ = ("hash", "star", "values", "words")

    def __init__(self) -> None:
        self.words: dict[str, _Node[T]] = {}
        self.star: _Node[T] | None = None
        self.hash: _Node[T] | None = None
        self.values: set[T] = set()

    def child(self, token: str) -> _Node[T] | None:
        if token == "*":
            return self.star
        if token == "#":
            return self.hash
        return self.words.get(token)

    def add_child(self, token: str) -> _Node[T]:
        node = self.child(token)
        if node is None:
            node = _Node()
            if token == "*":
                self.star = node
            elif token == "#":
                self.hash = node
            else:
                self.words[token] = node
        return node

    def drop_child(self, token: str) -> None:
        if token == "*":
            self.star = None
        elif token == "#":
            self.hash = None
        else:
            del self.words[token]

    def is_empty(self) -> bool:
        return not (self.values or self.words or self.star or self.hash)


class RoutingIndex(Generic[T]):
    """Many routing patterns, each with a set of values (say, subscription names).

    ``match(key)`` returns the values of every pattern the key matches. Its cost depends
    on the key and on how many patterns actually match, not on how many are stored:

    * a pattern of ``None`` matches every key (fanout);
    * exact patterns (no wildcards) are one dict lookup;
    * wildcard patterns share a trie of words; ``#`` is followed with a memo of
      (trie node, key position) so ``#.#.#...`` cannot make the walk exponential.

    Not thread-safe; a backend that shares one across threads holds its own lock.
    """

    __slots__ = ("_everything", "_exact", "_root", "_size")

    def __init__(self) -> None:
        self._everything: set[T] = set()
        self._exact: dict[str, set[T]] = {}
        self._root: _Node[T] = _Node()
        self._size = 0

    def __len__(self) -> int:
        """The number of distinct (pattern, value) pairs held."""
        return self._size

    def __repr__(self) -> str:
        return f"<RoutingIndex of {self._size} (pattern, value) pairs>"

    def add(self, pattern: str | None, value: T) -> None:
        """Route keys matching ``pattern`` (``None``: every key) to ``value``; idempotent.

        Raises :class:`~fairq.InvalidFilter` for an invalid pattern.
        """
        if pattern is None:
            bucket = self._everything
        elif is_exact(check_pattern(pattern)):
            bucket = self._exact.setdefault(pattern, set())
        else:
            node = self._root
            for token in _words(pattern):
                node = node.add_child(token)
            bucket = node.values
        if value not in bucket:
            bucket.add(value)
            self._size += 1

    def remove(self, pattern: str | None, value: T) -> None:
        """Undo :meth:`add`; raise :class:`KeyError` if that pair is not held."""
        if not self.discard(pattern, value):
            raise KeyError((pattern, value))

    def discard(self, pattern: str | None, value: T) -> bool:
        """Undo :meth:`add` if that pair is held; return whether it was."""
        if pattern is None:
            if value not in self._everything:
                return False
            self._everything.remove(value)
        elif is_exact(check_pattern(pattern)):
            bucket = self._exact.get(pattern)
            if bucket is None or value not in bucket:
                return False
            bucket.remove(value)
            if not bucket:
                del self._exact[pattern]
        else:
            path: list[tuple[_Node[T], str]] = []
            node: _Node[T] | None = self._root
            for token in _words(pattern):
                assert node is not None
                path.append((node, token))
                node = node.child(token)
                if node is None:
                    return False
            assert node is not None
            if value not in node.values:
                return False
            node.values.remove(value)
            # Prune the branch that no pattern uses any more, so churn does not leak nodes.
            for parent, token in reversed(path):
                child = parent.child(token)
                if child is None or not child.is_empty():
                    break
                parent.drop_child(token)
        self._size -= 1
        return True

    def match(self, key: str) -> set[T]:
        """The values of every pattern that routing ``key`` matches (a new set).

        Raises :class:`~fairq.InvalidMessage` for an invalid key.
        """
        check_routing_key(key)
        found = set(self._everything)
        exact = self._exact.get(key)
        if exact:
            found |= exact
        root = self._root
        if root.words or root.star is not None or root.hash is not None:
            self._walk(_words(key), found)
        return found

    def _walk(self, words: list[str], found: set[T]) -> None:
        end = len(words)
        stack: list[tuple[_Node[T], int]] = [(self._root, 0)]
        # A trie node has one parent, so a state (node, i) can only be reached twice through
        # a '#' edge. For each '#' node, remember the lowest position it was entered from:
        # entering from i covers every state (node, j >= i), so each is pushed once, which
        # bounds the walk by nodes x positions however many '#' a pattern has.
        hash_from: dict[int, int] = {}
        while stack:
            node, i = stack.pop()
            if i == end:
                if node.values:
                    found |= node.values
            else:
                if node.words:
                    nxt = node.words.get(words[i])
                    if nxt is not None:
                        stack.append((nxt, i + 1))
                if node.star is not None:
                    stack.append((node.star, i + 1))
            hashed = node.hash
            if hashed is not None:
                # '#' swallows words i..j-1 for every j from i (none) to the end (all).
                covered = hash_from.get(id(hashed), end + 1)
                if i < covered:
                    hash_from[id(hashed)] = i
                    stack.extend((hashed, j) for j in range(i, covered))

    def __iter__(self) -> Iterator[tuple[str | None, T]]:
        """Every (pattern, value) pair held, in no particular order."""
        for value in self._everything:
            yield None, value
        for pattern, bucket in self._exact.items():
            for value in bucket:
                yield pattern, value
        todo: list[tuple[_Node[T], list[str]]] = [(self._root, [])]
        while todo:
            node, tokens = todo.pop()
            for value in node.values:
                yield ".".join(tokens), value
            for word, child in node.words.items():
                todo.append((child, [*tokens, word]))
            if node.star is not None:
                todo.append((node.star, [*tokens, "*"]))
            if node.hash is not None:
                todo.append((node.hash, [*tokens, "#"]))


if __name__ == "__main__":  # pragma: no cover - a look at the scaling, not a test
    import timeit

    def _per_match(patterns: list[str], keys: list[str]) -> float:
        index: RoutingIndex[int] = RoutingIndex()
        for i, p in enumerate(patterns):
            index.add(p, i)
        rounds = 200_000
        took = timeit.timeit(lambda: [index.match(k) for k in keys], number=rounds // len(keys))
        return took / rounds * 1e9

    _SHAPES = [
        ("exact   shop<i>.order.paid", "shop{}.order.paid", "shop{}.order.paid"),
        ("star    order.*.br<i>", "order.*.br{}", "order.x.br{}"),
        ("hash    shop<i>.#", "shop{}.#", "shop{}.a.b.c"),
    ]
    for _name, _pattern, _key in _SHAPES:
        _keys = [_key.format(i) for i in (0, 3, 7, 9)] + ["nothing.matches.here"]
        _small = _per_match([_pattern.format(i) for i in range(10)], _keys)
        _large = _per_match([_pattern.format(i) for i in range(10_000)], _keys)
        print(
            f"{_name:28} 10: {_small:6.0f} ns  10,000: {_large:6.0f} ns  "
            f"ratio {_large / _small:.2f}"
        )
