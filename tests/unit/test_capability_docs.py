"""The capability tables in code (``Backend.missing``) and in docs/backends.md say the same:
every capability a backend lacks has its row in the docs, and the docs list none that the
code does not (the conformance suite skips exactly what ``missing`` names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fairq.backends.open import backend_class

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def _section(title: str) -> str:
    text = DOCS.read_text()
    start = text.index(title)
    end = text.find("\n## ", start)
    return text[start : end if end != -1 else None]


@pytest.mark.parametrize("scheme", ["sqlite", "redis", "postgresql"])
def test_backends_that_lack_nothing_list_nothing(scheme: str) -> None:
    assert backend_class(scheme).missing == {}


def test_memory_lacks_only_persistence() -> None:
    assert set(backend_class("memory").missing) == {"persistence"}
    text = DOCS.read_text()
    assert "`memory://`" in text and "nothing survives" in text


def test_every_capability_rabbitmq_lacks_has_its_row() -> None:
    pytest.importorskip("aio_pika")
    rows = _section("### What RabbitMQ lacks")
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", rows, flags=re.M))
    assert documented == set(backend_class("amqp").missing)
