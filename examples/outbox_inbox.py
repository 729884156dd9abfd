"""The outbox and the inbox on PostgreSQL (SPEC §11), runnable:

    python examples/outbox_inbox.py postgresql://postgres@127.0.0.1:5432/postgres

The shop writes an order and sends its e-mail job in ONE transaction (the outbox: the job
exists only if the order does); the mailer records the e-mail it sent and acks the job in
ONE transaction (the inbox: a crash before the commit leaves neither, so the redelivered
job is handled exactly once). Everything lives in the schema ``outbox_example``, dropped at
the end.
"""

from __future__ import annotations

import asyncio
import sys

import psycopg

import fairq

SCHEMA = "outbox_example"


async def main(server: str) -> None:
    url = f"{server}?schema={SCHEMA}"
    async with await fairq.connect(url) as broker, await psycopg.AsyncConnection.connect(
        server
    ) as conn:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA}.orders (id int PRIMARY KEY, total int);"
            f"CREATE TABLE IF NOT EXISTS {SCHEMA}.emails (order_id int PRIMARY KEY);"
            f"TRUNCATE {SCHEMA}.orders, {SCHEMA}.emails"
        )
        await conn.commit()
        emails = await broker.declare_queue("emails")
        await emails.purge()

        # the outbox: the order and its job commit together ...
        async with conn.transaction():
            await conn.execute(f"INSERT INTO {SCHEMA}.orders VALUES (1, 120)")
            await emails.send({"order": 1}, connection=conn)
        # ... or not at all
        try:
            async with conn.transaction():
                await conn.execute(f"INSERT INTO {SCHEMA}.orders VALUES (2, 80)")
                await emails.send({"order": 2}, connection=conn)
                raise RuntimeError("payment declined")
        except RuntimeError:
            pass
        print("jobs waiting:", (await emails.stats()).visible)  # 1: order 2 never existed

        # the inbox: the mailer's own write and the ack commit together
        (job,) = await emails.receive(wait=5)
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO {SCHEMA}.emails VALUES (%s) ON CONFLICT DO NOTHING",
                (job.json()["order"],),
            )
            await job.ack(connection=conn)
        s = await emails.stats()
        cur = await conn.execute(f"SELECT count(*) FROM {SCHEMA}.emails")
        print(f"e-mails recorded: {(await cur.fetchone() or [0])[0]}, acked: {s.acked}")

        # idempotency records can join the transaction too: the claim commits with the effect
        store = broker.idempotency("mailer", ttl=86_400)
        async with conn.transaction():
            claim = await store.claim("order-1-receipt", connection=conn)
            print("first claim:", "won" if claim is not None else "duplicate")
        async with conn.transaction():
            again = await store.claim("order-1-receipt", connection=conn)
            print("second claim:", "won" if again is not None else "duplicate")
        await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
        await conn.commit()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "postgresql://localhost/postgres"))
