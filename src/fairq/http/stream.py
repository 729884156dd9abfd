"""Server-Sent Events for ``Topic.listen``: ``GET /v1/topics/{topic}/stream``.

The stream is what a :class:`~fairq.pubsub.Listener` sees — at most once, nothing
stored, a bounded buffer whose overflow drops the oldest messages (the count is sent
as an event ``dropped``). Each message is one event::

    event: message
    id: 0001935c8e4a0001
    data: {"id": "...", "body": "...", "encoding": "text", "attributes": {...}, ...}

and a comment line (``: keep-alive``) goes out every ``keepalive`` seconds so proxies
keep the connection open. The listener is closed when the client goes away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

from ..pubsub import Listener
from . import models as m

__all__ = ["sse_event", "topic_stream"]

KEEPALIVE = 15.0


def sse_event(event: str, data: bytes, id: str | None = None) -> bytes:
    """One SSE event (``data`` is one line of JSON)."""
    head = f"event: {event}\n" + (f"id: {id}\n" if id else "")
    return head.encode() + b"data: " + data + b"\n\n"


async def events(listener: Listener, keepalive: float = KEEPALIVE) -> AsyncIterator[bytes]:
    """The SSE byte chunks of ``listener`` until the client disconnects."""
    try:
        yield b": listening\n\n"
        dropped = 0
        while True:
            msg = await listener.get(timeout=keepalive)
            if listener.dropped != dropped:
                dropped = listener.dropped
                yield sse_event("dropped", str(dropped).encode())
            if msg is None:
                yield b": keep-alive\n\n"
                continue
            yield sse_event("message", m.encode(m.message(msg)), msg.id)
    finally:
        await listener.close()


def topic_stream(listener: Listener, keepalive: float = KEEPALIVE) -> StreamingResponse:
    """The streaming response of a topic listener."""
    return StreamingResponse(
        events(listener, keepalive),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
