"""The README's tour as one runnable script: python examples/quickstart.py [URL]

Sends three jobs, runs a worker over them (one fails once and is retried, one is
rejected and dead-lettered), then prints the queue's stats.
"""

from __future__ import annotations

import asyncio
import sys

import fairq


async def main(url: str) -> None:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("ticket-pdf", visibility_timeout=30, max_attempts=5)
        await q.purge()
        before = await q.stats()  # counters add up over runs: this run's are the difference
        await q.send_batch(
            [
                fairq.Outgoing({"order": "o-7731", "seats": ["B-12", "B-13"]}),
                fairq.Outgoing({"order": "o-7732", "flaky": True}),
                fairq.Outgoing({"order": "bad", "seats": "not a list"}),
            ]
        )

        worker = fairq.Worker(broker, concurrency=4, poll_wait=0.2, handle_signals=False)

        @worker.queue("ticket-pdf", retry=fairq.Backoff(base=0.1, cap=1))
        async def make_pdf(msg: fairq.Received) -> None:
            job = msg.json()
            if not isinstance(job.get("seats"), list) and not job.get("flaky"):
                raise fairq.Reject("seats must be a list")
            if job.get("flaky") and msg.attempt == 1:
                raise RuntimeError("the PDF service timed out")  # retried with backoff
            print(f"ticket {job['order']} done on attempt {msg.attempt}")

        run = asyncio.create_task(worker.run())
        def done(s: fairq.QueueStats) -> int:
            return s.acked - before.acked + s.dead_lettered - before.dead_lettered

        while done(await q.stats()) < 3:
            await asyncio.sleep(0.05)
        worker.stop()
        await run

        s = await q.stats()
        print(
            f"acked={s.acked - before.acked} nacked={s.nacked - before.nacked} "
            f"dead_lettered={s.dead_lettered - before.dead_lettered}"
        )
        for dead in await broker.queue("ticket-pdf.dlq").receive(max_messages=10):
            print("dead letter:", dead.json(), dead.attributes["fairq.reason"])
            await dead.ack()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
