"""A race for the worker tests (``tests/`` is on the import path): a lease extension that
reaches the backend only after an ack of the same message has landed, as when the lease
keeper's extension and a handler's ack cross."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import fairq


@contextlib.contextmanager
def extensions_after_acks(broker: fairq.Broker) -> Iterator[list[str]]:
    """While inside, each extension waits for the next ack (up to 2 s) and then runs; the
    list yielded collects the receipts the extensions found already gone."""
    backend = broker.backend
    acked = asyncio.Event()
    raced: list[str] = []
    ack, extend = backend.ack, backend.extend
    ack_receive = backend.ack_receive
    progress = backend.attention_progress

    async def ack_then_tell(queue: str, receipts: list[str]) -> list[str]:
        lost = await ack(queue, receipts)
        acked.set()
        return lost

    async def ack_receive_then_tell(
        queue: str, receipts: list[str], n: int, vt: float | None
    ) -> tuple[list[str], list[fairq.Received]]:  # a worker's acks sent with its receive
        got = await ack_receive(queue, receipts, n, vt)
        acked.set()
        return got

    async def progress_then_tell(
        domain: str, token: str, key: str, queue: str, receipts: list[str]
    ) -> list[str]:  # an attention slice's acks
        lost = await progress(domain, token, key, queue, receipts)
        acked.set()
        return lost

    async def extend_after_the_ack(queue: str, receipts: list[str], seconds: float) -> list[str]:
        acked.clear()
        await asyncio.wait_for(acked.wait(), 2.0)
        lost = await extend(queue, receipts, seconds)
        raced.extend(lost)
        return lost

    backend.ack, backend.extend = ack_then_tell, extend_after_the_ack  # type: ignore[method-assign]
    backend.ack_receive = ack_receive_then_tell  # type: ignore[method-assign]
    backend.attention_progress = progress_then_tell  # type: ignore[method-assign]
    try:
        yield raced
    finally:
        backend.ack, backend.extend = ack, extend  # type: ignore[method-assign]
        backend.ack_receive = ack_receive  # type: ignore[method-assign]
        backend.attention_progress = progress  # type: ignore[method-assign]
