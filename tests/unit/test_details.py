"""The free texts a dead letter keeps (``fairq.detail``): ``check_detail`` refuses what no
engine stores alike, ``safe_detail`` makes any text (an exception's) storable."""

from __future__ import annotations

import pytest

import fairq
from fairq.message import MAX_DETAIL, check_detail, safe_detail


def test_check_detail_refuses_what_engines_store_differently() -> None:
    for bad in ("", "a\x00b", "lone \udcff", None, 3):
        with pytest.raises(fairq.InvalidOption):
            check_detail("error", bad)
    assert check_detail("error", "é" * 1500) == "é" * MAX_DETAIL  # characters, not bytes


def test_safe_detail_escapes_whatever_an_exception_says() -> None:
    text = safe_detail("nul \x00 and \udcff and é")
    assert text == "nul \\x00 and \\udcff and é"
    assert check_detail("error", text) == text
    assert safe_detail("") == "?"
