"""A message another AMQP client publishes to a topic's exchange reaches the subscriptions
bound by routing pattern (docs/rabbitmq.md) and carries its routing key as the attribute
``fairq.routing_key``, as fairq's own copies do."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import aio_pika

import fairq


async def test_an_outside_publish_carries_its_routing_key(url: str) -> None:
    async with await fairq.connect(url) as broker:
        t = await broker.declare_topic("ext")
        everything = await t.subscribe("all")
        brazil = await t.subscribe("br", routing="order.*.br")
        await t.publish(b"ours", routing_key="order.a.br")
        parts = urlsplit(url)
        outside = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:5672{parts.path}")
        try:
            channel = await outside.channel()
            exchange = await channel.get_exchange("ext")
            await exchange.publish(
                aio_pika.Message(b"theirs", headers={"c": "sms"}), routing_key="order.x.br"
            )
        finally:
            await outside.close()
        for q in (everything, brazil):
            got: list[fairq.Received] = []
            deadline = time.monotonic() + 10
            while len(got) < 2:
                assert time.monotonic() < deadline, [m.body for m in got]
                got += await q.receive(max_messages=2, wait=0.5)
            by_body = {m.body: m.attributes for m in got}
            assert by_body[b"ours"]["fairq.routing_key"] == "order.a.br"
            assert by_body[b"theirs"] == {"c": "sms", "fairq.routing_key": "order.x.br"}
            for m in got:
                await m.ack()
