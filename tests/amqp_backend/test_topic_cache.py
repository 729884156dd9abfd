"""A broker caches each topic's subscriptions under the store's version of them (every
change raises it). A read of the subscriptions that answers late, after another publish has
seen a newer version and filled the cache, must not put its older list back."""

from __future__ import annotations

import asyncio
from typing import Any

import fairq


async def test_a_late_read_of_the_subscriptions_is_not_cached(url: str) -> None:
    async with await fairq.connect(url) as a, await fairq.connect(url) as b:
        t = await a.declare_topic("cached")
        await t.subscribe("s0")
        await t.subscribe("s1")
        store = a.backend.store  # type: ignore[attr-defined]
        read, release = asyncio.Event(), asyncio.Event()
        real = store.subscriptions
        calls = 0

        async def slow_first(topic: str) -> Any:
            nonlocal calls
            calls += 1
            got = await real(topic)  # read before the change below
            if calls == 1:
                read.set()
                await release.wait()
            return got

        store.subscriptions = slow_first
        try:
            x = asyncio.create_task(t.publish(b"x"))
            await asyncio.wait_for(read.wait(), 5)
            await b.topic("cached").subscribe("s2")  # elsewhere, after x read the old list
            y = await t.publish(b"y")  # sees the new version and caches the new list
            assert sorted(y.subscriptions) == ["s0", "s1", "s2"]
            release.set()
            assert sorted((await x).subscriptions) == ["s0", "s1"]  # it began before s2
            z = await t.publish(b"z")
            assert sorted(z.subscriptions) == ["s0", "s1", "s2"], "the late, old list was cached"
        finally:
            store.subscriptions = real
