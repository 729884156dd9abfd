"""The pre-queue draw of a waiting room: a random order that anyone can audit.

Fans who join a waiting room before it opens wait in a *pre-queue*; at opening they are
placed in a uniformly random order (SPEC §8 rule 3). fairq does not store that order fan
by fan: at opening it draws one 256-bit seed from the operating system's CSPRNG
(``secrets.token_bytes``) and from then on a fan's place is a keyed pseudorandom
permutation of its arrival number. Drawing is therefore one write of one value however
many fans wait (two million at 10:00), it happens atomically once, and the whole order can
be recomputed — audited — by anyone given the seed and the pre-queue's size
(``RoomStats.draw_seed``, ``RoomStats.pre_queue_size``)::

    from fairq.draw import draw_order
    order = draw_order(bytes.fromhex(stats.draw_seed), stats.pre_queue_size)
    order[i]   # the place (0-based) of the fan who arrived i-th (0-based)

The permutation is a balanced Feistel network of eight rounds whose round function is
BLAKE2b keyed with the seed; "cycle walking" restricts it from the next power of four to
exactly ``size`` places. With a secret random key, a Feistel network of four or more rounds
over a pseudorandom function is a pseudorandom permutation (Luby–Rackoff): no test can tell
its order from a uniformly random one, and the seed is drawn only at opening, so nobody —
the operator included — knows the order before.
"""

from __future__ import annotations

import hashlib
import struct

__all__ = ["ROUNDS", "draw_index", "draw_order", "draw_position"]

ROUNDS = 8
_PERSON = b"fairq-draw-v1"


def _half_bits(size: int) -> int:
    bits = max(2, (size - 1).bit_length())
    return (bits + 1) // 2


def _round(seed: bytes, size: int, i: int, value: int, mask: int) -> int:
    digest = hashlib.blake2b(
        struct.pack(">QIQ", size, i, value), key=seed, digest_size=8, person=_PERSON
    ).digest()
    return int.from_bytes(digest, "big") & mask


def _encrypt(seed: bytes, size: int, half: int, x: int) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for i in range(ROUNDS):
        left, right = right, left ^ _round(seed, size, i, right, mask)
    return (left << half) | right


def _decrypt(seed: bytes, size: int, half: int, x: int) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for i in reversed(range(ROUNDS)):
        left, right = right ^ _round(seed, size, i, left, mask), left
    return (left << half) | right


def _check(seed: bytes, size: int, value: int) -> None:
    if not isinstance(seed, bytes) or not 16 <= len(seed) <= 64:
        raise ValueError("the draw seed must be 16 to 64 bytes")
    if not 0 <= value < size:
        raise ValueError(f"{value} is outside 0..{size - 1}")


def draw_position(seed: bytes, size: int, index: int) -> int:
    """The place (0-based) in the drawn order of the fan who arrived ``index``-th
    (0-based) among ``size`` pre-queue fans."""
    _check(seed, size, index)
    if size == 1:
        return 0
    half = _half_bits(size)
    x = _encrypt(seed, size, half, index)
    while x >= size:  # cycle walking: at most a few steps, the domain is < 4 * size
        x = _encrypt(seed, size, half, x)
    return x


def draw_index(seed: bytes, size: int, position: int) -> int:
    """The inverse of :func:`draw_position`: which arrival holds place ``position``."""
    _check(seed, size, position)
    if size == 1:
        return 0
    half = _half_bits(size)
    x = _decrypt(seed, size, half, position)
    while x >= size:
        x = _decrypt(seed, size, half, x)
    return x


def draw_order(seed: bytes, size: int) -> list[int]:
    """Every fan's place: ``draw_order(seed, size)[i] == draw_position(seed, size, i)``."""
    return [draw_position(seed, size, i) for i in range(size)]
