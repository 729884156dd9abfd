"""How deeply a JSON request may nest: a bound checked on the raw bytes, before decoding.

Decoders recurse: msgspec raises ``RecursionError`` near the interpreter's recursion
limit (about 1,000 levels, 1.2 KB of ``[[[…]]]``), orjson refuses to encode past 254
levels, and any Python walk over the decoded value recurses too. A bound well below all
of them, checked first, makes every deeper request one predictable ``400`` instead of a
500 that depends on the stack depth of the moment.

The check costs two ``bytes.count`` calls for the usual request (fewer brackets than the
bound: it cannot nest deeper); only a request with more brackets than that is scanned,
in C-speed passes: strings removed (a split on quotes, or a regex when some quote is
escaped), brackets kept by ``bytes.translate``, the running depth summed by
``itertools.accumulate``.
"""

from __future__ import annotations

import re
from array import array
from itertools import accumulate

__all__ = ["MAX_DEPTH", "nesting_depth", "too_deep"]

#: the deepest nesting of arrays and objects a request may have (serde_json's default)
MAX_DEPTH = 128

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = b"[]{}"
# opening brackets count +1, closing ones -1 (0xFF read as a signed byte)
_STEP = bytes.maketrans(_BRACKETS, b"\x01\xff\x01\xff")
_OTHERS = bytes(b for b in range(256) if b not in _BRACKETS)


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``raw`` (brackets inside
    strings do not count; malformed text gives some number, and fails to decode anyway)."""
    if b'"' not in raw:
        bare = raw
    elif b'\\"' not in raw:  # no escaped quote: every other piece between quotes is a string
        bare = b"".join(raw.split(b'"')[::2])
    else:
        bare = _STRING.sub(b"", raw)
    steps = array("b", bare.translate(_STEP, _OTHERS))
    return max(accumulate(steps), default=0)


def too_deep(raw: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """True if the JSON text ``raw`` nests arrays and objects more than ``limit`` deep."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # too few brackets to nest that deep: the usual case, no scan
    return nesting_depth(data) > limit
