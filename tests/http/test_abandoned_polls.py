"""A long poll whose client closes its connection (over a real socket: uvicorn) ends there:
it takes no message sent afterwards, and its waiting slot is free at once. A message an
engine call leased just as the client left goes back uncounted (``api.receive``)."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
from httpsupport import uvicorn_serving

import fairq
from fairq.http.app import create_app


async def _abandon(port: int, path: str, body: dict[str, object]) -> None:
    """Send a POST and close the socket without reading the answer."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = orjson.dumps(body)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    await writer.drain()
    await asyncio.sleep(0.3)  # the poll is waiting
    writer.close()
    await writer.wait_closed()


async def test_an_abandoned_long_poll_takes_nothing_and_frees_its_slot() -> None:
    async with await fairq.connect("memory://") as broker:
        app = create_app(broker, max_waiting=5)
        async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
            port = int(url.rsplit(":", 1)[1])
            await http.put("/v1/queues/jobs", json={"max_attempts": 1, "visibility_timeout": 30})
            body = {"wait": 10, "max_messages": 1}
            await asyncio.gather(
                *(_abandon(port, "/v1/queues/jobs/receive", body) for _ in range(5))
            )
            deadline = time.monotonic() + 5
            while True:  # every slot is free again, long before the polls' 10 s
                r = await http.post("/v1/queues/jobs/receive", json={"wait": 0.1})
                if r.status_code == 200:
                    break
                assert r.status_code == 503 and time.monotonic() < deadline, r.text
                await asyncio.sleep(0.05)
            await http.post("/v1/queues/jobs/messages", json={"messages": [{"body": "hello"}]})
            r = await http.post("/v1/queues/jobs/receive", json={"wait": 2})
            assert [m["body"] for m in r.json()["messages"]] == ["hello"]
            stats = (await http.get("/v1/queues/jobs")).json()["stats"]
            assert (stats["dead_lettered"], stats["redelivered"]) == (0, 0)
