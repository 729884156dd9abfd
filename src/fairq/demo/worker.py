"""The worker process of ``fairq demo``: renders each ``GenerateTicketPdf`` job.

Started by the demo as ``fairq worker fairq.demo.worker:make_worker``; reads its
settings from the environment the demo gives it (the CLI edge): ``FAIRQ_URL``,
``FAIRQ_DEMO_OUT`` (directory of the PDFs), ``FAIRQ_DEMO_CONCURRENCY``.
"""

from __future__ import annotations

import os

from ..errors import Reject
from ..message import Received
from ..worker import Worker

# its own queue: the demo purges and re-declares it, so never a queue of the user's own
# (the README's tour calls its example queue "ticket-pdf")
QUEUE = "demo.ticket-pdf"


def make_worker() -> Worker:
    """A worker that turns ticket jobs into ``<out>/<order>.pdf`` (idempotent writes)."""
    from .ticket_pdf import render_ticket

    out = os.environ.get("FAIRQ_DEMO_OUT", "tickets")
    concurrency = int(os.environ.get("FAIRQ_DEMO_CONCURRENCY", "4"))
    worker = Worker(os.environ.get("FAIRQ_URL"), concurrency=concurrency, grace=10.0)

    @worker.queue(QUEUE, concurrency=concurrency)
    def generate(msg: Received) -> None:
        job = msg.json()
        if not isinstance(job, dict) or job.get("type") != "GenerateTicketPdf":
            raise Reject(f"not a GenerateTicketPdf job: {str(job)[:100]}")
        render_ticket(job, out)

    return worker
