"""The worker runtime: run handlers over queues with bounded concurrency.

    worker = fairq.Worker("sqlite:///fairq.db", concurrency=16)

    @worker.queue("ticket-pdf", concurrency=8, retry=fairq.Backoff(base=1, cap=300))
    async def make_pdf(msg): ...

    await worker.run()          # or: fairq worker app.module:worker

* A handler that returns acks its message; one that raises nacks it with exponential
  backoff and jitter (the backend dead-letters it after ``max_attempts``); one that
  raises :class:`fairq.Reject` dead-letters it at once.
* Messages are received only into free slots (never more than the worker can start), and
  their leases are extended while their handler runs, so a slow handler keeps its message.
* Sync handlers run in a thread pool.
* ``SIGTERM``/``SIGINT`` (or :meth:`Worker.stop`): stop receiving, let running handlers
  finish within ``grace`` seconds, then give the rest back without counting the attempt.
  A ``SIGKILL`` loses nothing either: the leases simply run out and the messages return.
"""

from __future__ import annotations

from .pushing import PushRuntime
from .runtime import Backoff, WorkerStats

__all__ = ["Backoff", "Worker", "WorkerStats"]


class Worker(PushRuntime):
    """Runs handlers over queues, attention domains and push subscriptions; see the module
    docstring.

    ``broker`` is a connected :class:`~fairq.Broker`, or a URL (None: ``$FAIRQ_URL``,
    else the SQLite default) that :meth:`run` connects to — so a worker can be defined at
    import time and started with ``fairq worker module:attr``.
    """
