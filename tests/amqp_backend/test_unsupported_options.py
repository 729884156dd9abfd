"""Queue options RabbitMQ cannot honour raise ``fairq.Unsupported`` at declare and create
nothing (SPEC §10: never a silent difference; docs/backends.md, "What RabbitMQ lacks")."""

from __future__ import annotations

from typing import Any

import pytest

import fairq


@pytest.mark.parametrize(
    "options, capability",
    [
        ({"fifo": True}, "fifo"),
        ({"max_length": 2, "overflow": "block"}, "overflow.block"),
        (
            {"max_length": 2, "overflow": "drop_oldest", "max_priority": 5},
            "overflow.drop_oldest.priority",
        ),
    ],
)
async def test_an_option_rabbitmq_cannot_honour_is_refused(
    broker: fairq.Broker, options: dict[str, Any], capability: str
) -> None:
    with pytest.raises(fairq.Unsupported, match=capability):
        await broker.declare_queue("refused", **options)
    with pytest.raises(fairq.QueueNotFound):
        await broker.queue("refused").stats()
    # the same options without what RabbitMQ lacks are fine
    await broker.declare_queue("fine", max_length=2, overflow="drop_oldest")
