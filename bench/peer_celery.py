"""Celery as the Redis benchmark runs it: Redis broker, acks late, no result backend; each
job counts itself in ``bench:done`` (the benchmark's only way to see a worker process's
progress)."""

import os

import redis
from celery import Celery

PORT = int(os.environ.get("BENCH_REDIS_PORT", "6379"))
app = Celery("bench", broker=f"redis://127.0.0.1:{PORT}/0")
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=100,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)
_counter = redis.Redis(port=PORT)


@app.task(name="noop")
def noop(i: int) -> None:
    """Do nothing but count."""
    _counter.incr("bench:done")
