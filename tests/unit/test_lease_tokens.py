"""Lease tokens (``fairq.message.new_lease``): from the OS CSPRNG, odd (never 0), at most
62 bits, spread over the whole range."""

from __future__ import annotations

from fairq.message import new_lease


def test_tokens_are_odd_62_bit_and_distinct() -> None:
    tokens = [new_lease() for _ in range(5000)]
    assert len(set(tokens)) == len(tokens)
    assert all(t & 1 and 0 < t < 1 << 62 for t in tokens)
    assert max(t.bit_length() for t in tokens) > 55  # the whole range is used
