"""A worker's own numbers over HTTP: ``/metrics`` (Prometheus text format) and ``/healthz``
(for a supervisor's liveness or readiness probe), served by the worker process itself when
it is given a port (``Worker(metrics_port=9108)``, ``fairq worker --metrics-port 9108``).

The queues' numbers (depth, age, totals) are the server's ``/metrics``; these are what only
the worker knows: how long its handlers take, how many run now, how each message ended,
and whether the engine answers. Per queue or attention domain (label ``queue``):

* ``fairq_worker_received_total``, ``fairq_worker_handled_total{outcome}`` (``ok``,
  ``failed``, ``rejected``, ``duplicate``), ``fairq_worker_handler_seconds`` (a histogram
  of handler run times), ``fairq_worker_running`` and ``fairq_worker_concurrency``;
* for the worker: ``fairq_worker_slots``, ``fairq_worker_acks_total`` (acks sent),
  ``fairq_worker_ack_failed_total`` (of those, the ones the engine did not take),
  ``fairq_worker_released_total``, ``fairq_worker_lease_lost_total``,
  ``fairq_worker_backend_up`` (0 while the engine cannot be reached) and
  ``fairq_worker_backend_down_seconds`` (how long it has been away).

A plain asyncio server on the worker's event loop, no dependency: it answers GET only, one
request per connection, and reads at most a few kilobytes of each request.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOption

__all__ = ["BUCKETS", "HandlerTimes", "MetricsServer", "QueueRun", "render"]

log = logging.getLogger("fairq.worker")

#: upper bounds (seconds) of the handler-time histogram's buckets (+Inf is implied)
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REQUEST_LIMIT = 8192  # bytes of a request line and headers
_READ_TIMEOUT = 5.0  # seconds a client has to send its request


@dataclass(slots=True)
class HandlerTimes:
    """A histogram of handler run times: counts per bucket of :data:`BUCKETS` (not
    cumulative; the last one is past the largest bound), their sum and count."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds
        self.n += 1


@dataclass(slots=True)
class QueueRun:
    """What a worker did with one queue's (or attention domain's) messages."""

    received: int = 0
    ok: int = 0  # the handler returned (the worker acks)
    failed: int = 0  # it raised: nacked with backoff, or dead-lettered on the last attempt
    rejected: int = 0  # it raised fairq.Reject: dead-lettered at once
    duplicate: int = 0  # its idempotency key was taken: acked unhandled
    times: HandlerTimes = field(default_factory=HandlerTimes)


@dataclass(frozen=True, slots=True)
class Reading:
    """The worker state :func:`render` and the health answer are made of."""

    queues: dict[str, QueueRun]
    running: dict[str, int]  # handlers running now, by queue
    concurrency: dict[str, int]  # each queue's own limit
    slots: int  # the worker's limit over all queues
    acked: int  # handled messages acked (less those whose ack then failed)
    ack_failed: int  # acks of handled messages the engine did not take
    released: int
    lease_lost: int
    backend_down: float | None  # seconds the engine has been away; None: it answers
    stopping: bool


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(x: float) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


def render(r: Reading) -> str:
    """The Prometheus text exposition (format 0.0.4) of a reading."""
    lines: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")

    def per_queue(name: str, kind: str, text: str, values: dict[str, int]) -> None:
        family(name, kind, text)
        for q, v in sorted(values.items()):
            lines.append(f'{name}{{queue="{_label(q)}"}} {v}')

    qs = r.queues
    per_queue(
        "fairq_worker_received_total",
        "counter",
        "Messages this worker received.",
        {q: s.received for q, s in qs.items()},
    )
    family("fairq_worker_handled_total", "counter", "Handler runs that ended, by outcome.")
    for q, s in sorted(qs.items()):
        for outcome in ("ok", "failed", "rejected", "duplicate"):
            lines.append(
                f'fairq_worker_handled_total{{queue="{_label(q)}",outcome="{outcome}"}} '
                f"{getattr(s, outcome)}"
            )
    family("fairq_worker_handler_seconds", "histogram", "How long handlers ran.")
    for q, s in sorted(qs.items()):
        label = _label(q)
        cumulative = 0
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), s.times.counts, strict=True):
            cumulative += count
            lines.append(
                f'fairq_worker_handler_seconds_bucket{{queue="{label}",le="{bound}"}} {cumulative}'
            )
        lines.append(f'fairq_worker_handler_seconds_sum{{queue="{label}"}} {s.times.total!r}')
        lines.append(f'fairq_worker_handler_seconds_count{{queue="{label}"}} {s.times.n}')
    per_queue("fairq_worker_running", "gauge", "Handlers running now.", r.running)
    per_queue(
        "fairq_worker_concurrency", "gauge", "Handlers of the queue allowed at once.", r.concurrency
    )
    for name, kind, text, value in (
        ("fairq_worker_slots", "gauge", "Handlers allowed at once over all queues.", r.slots),
        (
            "fairq_worker_acks_total",
            "counter",
            "Acks sent for handled messages (less ack_failed: the ones the engine took).",
            r.acked + r.ack_failed,
        ),
        (
            "fairq_worker_ack_failed_total",
            "counter",
            "Acks the engine did not take (lease ended, engine away): those messages run again.",
            r.ack_failed,
        ),
        (
            "fairq_worker_released_total",
            "counter",
            "Messages given back unstarted at shutdown.",
            r.released,
        ),
        (
            "fairq_worker_lease_lost_total",
            "counter",
            "Handled messages whose lease had ended before the ack (run again).",
            r.lease_lost,
        ),
        (
            "fairq_worker_backend_up",
            "gauge",
            "1 when the engine answers, 0 while it cannot be reached.",
            int(r.backend_down is None),
        ),
        (
            "fairq_worker_backend_down_seconds",
            "gauge",
            "How long the engine has been unreachable (0 when it answers).",
            round(r.backend_down or 0.0, 3),
        ),
    ):
        family(name, kind, text)
        lines.append(f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"


def health(r: Reading) -> tuple[int, dict[str, Any]]:
    """The ``/healthz`` answer: 200 while the worker runs and its engine answers, else 503
    with why (``stopping``, or ``backend_unreachable`` and for how long)."""
    running = sum(r.running.values())
    if r.stopping:
        return 503, {"status": "stopping", "running": running}
    if r.backend_down is not None:
        return 503, {
            "status": "backend_unreachable",
            "down_seconds": round(r.backend_down, 1),
            "running": running,
        }
    return 200, {"status": "ok", "running": running}


class MetricsServer:
    """``/metrics`` and ``/healthz`` of one worker on ``host:port`` (port 0: a free one,
    then :attr:`port` says which)."""

    def __init__(self, read: Callable[[], Reading], host: str, port: int) -> None:
        self._read = read
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task[Any]] = set()  # one per open connection

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, limit=_REQUEST_LIMIT
            )
        except OSError as exc:
            raise InvalidOption(
                f"cannot serve worker metrics on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._serving):  # an idle client's connection ends here too
                task.cancel()
            await asyncio.gather(*self._serving, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._serving.add(me)
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path = _request_line(head)
            if method not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"only GET\n"
            elif path == "/metrics":
                status, ctype, body = 200, _CONTENT_TYPE, render(self._read()).encode()
            elif path == "/healthz":
                code, answer = health(self._read())
                status, ctype = code, "application/json"
                body = json.dumps(answer).encode()
            else:
                status, ctype, body = 404, "text/plain", b"/metrics or /healthz\n"
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(
                status, "Service Unavailable"
            )
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a client that sends no whole request in time, or too much: dropped
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            pass  # the worker stops: the connection ends with it
        finally:
            if me is not None:
                self._serving.discard(me)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _request_line(head: bytes) -> tuple[str, str]:
    """The method and path (query dropped) of a request's first line."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3:
        raise ValueError(line)
    return parts[0], parts[1].split("?", 1)[0]
