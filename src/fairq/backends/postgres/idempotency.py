"""The PostgreSQL backend's idempotency keys and version gates (and the named counters
another engine keeps here): each method one statement
(``INSERT ... ON CONFLICT ... WHERE``, its row count saying who won) or a short
transaction. Under READ COMMITTED a conflicting insert waits for the other transaction
and re-checks the WHERE against the committed row, so of N concurrent claims of one key
exactly one inserts; serialization failures and deadlocks are retried by the pool.

``claim`` can run in the caller's transaction (the inbox, SPEC §11): the record then
commits with the caller's own writes, or vanishes with their rollback.
"""

from __future__ import annotations

from decimal import Decimal

from ...model.idempotency import IdempotencyRecord, Version
from .connection import Cursor

__all__ = ["claim", "complete_claim", "record", "sweep"]


async def record(
    cur: Cursor, s: str, namespace: str, key: str, now: float
) -> IdempotencyRecord | None:
    await cur.execute(
        f"SELECT state, expires_at, fingerprint, result FROM {s}.idempotency "
        "WHERE namespace = %s AND key = %s AND expires_at > %s",
        (namespace, key, now),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return IdempotencyRecord(
        key,
        "completed" if row[0] == 1 else "running",
        float(row[1]),
        row[2],
        None if row[3] is None else bytes(row[3]),
    )


async def claim(
    cur: Cursor,
    s: str,
    namespace: str,
    key: str,
    token: str,
    lease: float,
    fingerprint: str | None,
    now: float,
) -> IdempotencyRecord | None:
    await cur.execute(
        f"INSERT INTO {s}.idempotency AS i (namespace, key, token, state, fingerprint, result, "
        "expires_at) VALUES (%s, %s, %s, 0, %s, NULL, %s) "
        "ON CONFLICT (namespace, key) DO UPDATE SET token = excluded.token, state = 0, "
        "fingerprint = excluded.fingerprint, result = NULL, expires_at = excluded.expires_at "
        "WHERE i.expires_at <= %s OR (i.state = 0 AND substr(i.token, 1, 1) = '@' "
        "AND substr(excluded.token, 1, 1) = '@' "
        "AND substr(i.token, 19) = substr(excluded.token, 19))",  # model.idempotency.same_holder
        (namespace, key, token, fingerprint, now + lease, now),
    )
    if cur.rowcount == 1:
        return None
    found = await record(cur, s, namespace, key, now)
    if found is None:  # expired between the two statements: a race with a clock edge
        return await claim(cur, s, namespace, key, token, lease, fingerprint, now)
    return found


async def claim_done(
    cur: Cursor,
    s: str,
    namespace: str,
    key: str,
    token: str,
    ttl: float,
    fingerprint: str | None,
    now: float,
) -> IdempotencyRecord | None:
    """The inbox's claim: record the key as completed (until ``now + ttl``) in the caller's
    transaction if it has no live record; a concurrent one waits for this transaction and
    then finds the key done (or free again after a rollback)."""
    await cur.execute(
        f"INSERT INTO {s}.idempotency AS i (namespace, key, token, state, fingerprint, result, "
        "expires_at) VALUES (%s, %s, %s, 1, %s, NULL, %s) "
        "ON CONFLICT (namespace, key) DO UPDATE SET token = excluded.token, state = 1, "
        "fingerprint = excluded.fingerprint, result = NULL, expires_at = excluded.expires_at "
        "WHERE i.expires_at <= %s",
        (namespace, key, token, fingerprint, now + ttl, now),
    )
    if cur.rowcount == 1:
        return None
    found = await record(cur, s, namespace, key, now)
    if found is None:
        return await claim_done(cur, s, namespace, key, token, ttl, fingerprint, now)
    return found


async def complete_claim(
    cur: Cursor,
    s: str,
    namespace: str,
    key: str,
    token: str,
    result: bytes | None,
    ttl: float,
    now: float,
) -> bool:
    await cur.execute(
        f"UPDATE {s}.idempotency SET state = 1, result = %s, expires_at = %s "
        "WHERE namespace = %s AND key = %s AND token = %s",
        (result, now + ttl, namespace, key, token),
    )
    if cur.rowcount == 1:
        return True
    # not ours: fine only if nobody has the key (our expired row was swept away)
    await cur.execute(
        f"INSERT INTO {s}.idempotency AS i (namespace, key, token, state, result, expires_at) "
        "VALUES (%s, %s, %s, 1, %s, %s) ON CONFLICT (namespace, key) DO NOTHING",
        (namespace, key, token, result, now + ttl),
    )
    return cur.rowcount == 1


async def release_claim(
    cur: Cursor, s: str, namespace: str, key: str, token: str, done: bool = False
) -> bool:
    """Drop a running claim's record (``done``: an inbox claim's, recorded completed)."""
    await cur.execute(
        f"DELETE FROM {s}.idempotency WHERE namespace = %s AND key = %s AND token = %s "
        "AND state = %s",
        (namespace, key, token, 1 if done else 0),
    )
    return cur.rowcount == 1


async def extend_claim(
    cur: Cursor, s: str, namespace: str, key: str, token: str, lease: float, now: float
) -> bool:
    await cur.execute(
        f"INSERT INTO {s}.idempotency AS i (namespace, key, token, state, expires_at) "
        "VALUES (%s, %s, %s, 0, %s) ON CONFLICT (namespace, key) DO UPDATE SET "
        "expires_at = excluded.expires_at WHERE i.token = excluded.token AND i.state = 0",
        (namespace, key, token, now + lease),
    )
    return cur.rowcount == 1


async def forget(cur: Cursor, s: str, namespace: str, key: str, now: float) -> bool:
    await cur.execute(
        f"DELETE FROM {s}.idempotency WHERE namespace = %s AND key = %s RETURNING expires_at",
        (namespace, key),
    )
    row = await cur.fetchone()
    return row is not None and float(row[0]) > now


async def sweep(cur: Cursor, s: str, now: float) -> None:
    """Delete up to 1,000 expired records (they already count as absent)."""
    await cur.execute(
        f"DELETE FROM {s}.idempotency WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.idempotency "
        "WHERE expires_at <= %s LIMIT 1000))",
        (now,),
    )


async def advance_version(
    cur: Cursor, s: str, namespace: str, entity: str, version: Version, now: float
) -> bool:
    await cur.execute(
        f"INSERT INTO {s}.versions AS v (namespace, entity, version, is_int, updated_at) "
        "VALUES (%s, %s, %s::numeric, %s, %s) ON CONFLICT (namespace, entity) DO UPDATE SET "
        "version = excluded.version, is_int = excluded.is_int, updated_at = excluded.updated_at "
        "WHERE excluded.version > v.version",
        (
            namespace,
            entity,
            str(version) if isinstance(version, int) else repr(float(version)),
            isinstance(version, int),
            now,
        ),
    )
    return cur.rowcount == 1


async def current_version(cur: Cursor, s: str, namespace: str, entity: str) -> Version | None:
    await cur.execute(
        f"SELECT version, is_int FROM {s}.versions WHERE namespace = %s AND entity = %s",
        (namespace, entity),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    value: Decimal = row[0]
    return int(value) if row[1] else float(value)


# -- counters kept for other engines ---------------------------------------------------------
async def add_counts(cur: Cursor, s: str, scope: str, counts: dict[str, int]) -> None:
    """Add to the scope's counters in one statement (names sorted: concurrent adds take the
    rows' locks in one order, so they never deadlock)."""
    names = sorted(n for n, v in counts.items() if v)
    if not names:
        return
    await cur.execute(
        f"INSERT INTO {s}.store_counts AS c (scope, name, n) "
        "SELECT %s, name, n FROM unnest(%s::text[], %s::bigint[]) AS u(name, n) "
        "ON CONFLICT (scope, name) DO UPDATE SET n = c.n + excluded.n",
        (scope, names, [int(counts[n]) for n in names]),
    )


async def read_counts(cur: Cursor, s: str, scope: str) -> dict[str, int]:
    await cur.execute(f"SELECT name, n FROM {s}.store_counts WHERE scope = %s", (scope,))
    return {name: int(n) for name, n in await cur.fetchall()}


async def drop_counts(cur: Cursor, s: str, scope: str) -> None:
    await cur.execute(f"DELETE FROM {s}.store_counts WHERE scope = %s", (scope,))
