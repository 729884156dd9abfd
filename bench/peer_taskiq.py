"""taskiq as the Redis benchmark runs it: the Redis stream broker; each job counts itself
in ``bench:done`` (the benchmark's only way to see a worker process's progress)."""

import os

import redis.asyncio as aioredis
from taskiq_redis import RedisStreamBroker

PORT = int(os.environ.get("BENCH_REDIS_PORT", "6379"))
broker = RedisStreamBroker(url=f"redis://127.0.0.1:{PORT}/0")
_counter = aioredis.Redis(port=PORT)


@broker.task(task_name="noop")
async def noop(i: int) -> None:
    """Do nothing but count."""
    await _counter.incr("bench:done")
