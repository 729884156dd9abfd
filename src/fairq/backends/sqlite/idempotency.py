"""The SQLite backend's idempotency keys and version gates, each inside one transaction.

``fairq_idempotency`` has one row per (namespace, key), its PRIMARY KEY being the
uniqueness that decides a race: a claim is one ``INSERT ... ON CONFLICT DO UPDATE ...
WHERE expired`` — it inserts a new row, takes over an expired one, or changes nothing, and
the row count says which. The write lock of ``BEGIN IMMEDIATE`` makes that atomic across
every connection and process on the file. PostgreSQL runs the same statements (with
``RETURNING``); ``fairq_versions`` is the same idea for versions, the upsert's WHERE
keeping only a greater one.
"""

from __future__ import annotations

from ...model.idempotency import IdempotencyRecord, Version
from .txn import Txn

RUNNING, COMPLETED = 0, 1

_CLAIM = (
    "INSERT INTO fairq_idempotency (namespace, key, token, state, fingerprint, result, "
    "expires_at) VALUES (?, ?, ?, 0, ?, NULL, ?) "
    "ON CONFLICT (namespace, key) DO UPDATE SET token = excluded.token, state = 0, "
    "fingerprint = excluded.fingerprint, result = NULL, expires_at = excluded.expires_at "
    "WHERE fairq_idempotency.expires_at <= ? "
    "OR (fairq_idempotency.state = 0 AND substr(fairq_idempotency.token, 1, 1) = '@' "
    "AND substr(excluded.token, 1, 1) = '@' "
    "AND substr(fairq_idempotency.token, 19) = substr(excluded.token, 19))"
)  # the same holder's running claim (model.idempotency.same_holder)
_RECORD = (
    "SELECT state, expires_at, fingerprint, result FROM fairq_idempotency "
    "WHERE namespace = ? AND key = ? AND expires_at > ?"
)
_ADVANCE = (
    "INSERT INTO fairq_versions (namespace, entity, version, updated_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (namespace, entity) DO UPDATE SET version = excluded.version, "
    "updated_at = excluded.updated_at WHERE excluded.version > fairq_versions.version"
)


def _record(t: Txn, namespace: str, key: str) -> IdempotencyRecord | None:
    row = t.conn.execute(_RECORD, (namespace, key, t.now)).fetchone()
    if row is None:
        return None
    return IdempotencyRecord(
        key, "completed" if row[0] == COMPLETED else "running", row[1], row[2], row[3]
    )


def claim(
    t: Txn, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
) -> IdempotencyRecord | None:
    cur = t.conn.execute(_CLAIM, (namespace, key, token, fingerprint, t.now + lease, t.now))
    if cur.rowcount == 1:
        return None
    return _record(t, namespace, key)


def complete_claim(
    t: Txn, namespace: str, key: str, token: str, result: bytes | None, ttl: float
) -> bool:
    cur = t.conn.execute(
        "UPDATE fairq_idempotency SET state = 1, result = ?, expires_at = ? "
        "WHERE namespace = ? AND key = ? AND token = ?",
        (result, t.now + ttl, namespace, key, token),
    )
    if cur.rowcount == 1:
        return True
    # not ours: fine only if nobody has the key (our expired row was swept away)
    cur = t.conn.execute(
        "INSERT INTO fairq_idempotency (namespace, key, token, state, result, expires_at) "
        "VALUES (?, ?, ?, 1, ?, ?) ON CONFLICT (namespace, key) DO NOTHING",
        (namespace, key, token, result, t.now + ttl),
    )
    return cur.rowcount == 1


def release_claim(t: Txn, namespace: str, key: str, token: str) -> bool:
    cur = t.conn.execute(
        "DELETE FROM fairq_idempotency WHERE namespace = ? AND key = ? AND token = ? AND state = 0",
        (namespace, key, token),
    )
    return cur.rowcount == 1


def extend_claim(t: Txn, namespace: str, key: str, token: str, lease: float) -> bool:
    cur = t.conn.execute(
        "INSERT INTO fairq_idempotency (namespace, key, token, state, expires_at) "
        "VALUES (?, ?, ?, 0, ?) ON CONFLICT (namespace, key) DO UPDATE SET "
        "expires_at = excluded.expires_at "
        "WHERE fairq_idempotency.token = excluded.token AND fairq_idempotency.state = 0",
        (namespace, key, token, t.now + lease),
    )
    return cur.rowcount == 1


def idempotency_record(t: Txn, namespace: str, key: str) -> IdempotencyRecord | None:
    return _record(t, namespace, key)


def forget_claim(t: Txn, namespace: str, key: str) -> bool:
    live = _record(t, namespace, key) is not None
    t.conn.execute(
        "DELETE FROM fairq_idempotency WHERE namespace = ? AND key = ?", (namespace, key)
    )
    return live


def drop_expired(t: Txn) -> None:
    """Delete expired records (they already count as absent; this only frees the space)."""
    t.conn.execute("DELETE FROM fairq_idempotency WHERE expires_at <= ?", (t.now,))


def advance_version(t: Txn, namespace: str, entity: str, version: Version) -> bool:
    cur = t.conn.execute(_ADVANCE, (namespace, entity, version, t.now))
    return cur.rowcount == 1


def current_version(t: Txn, namespace: str, entity: str) -> Version | None:
    row = t.conn.execute(
        "SELECT version FROM fairq_versions WHERE namespace = ? AND entity = ?",
        (namespace, entity),
    ).fetchone()
    if row is None:
        return None
    version: Version = row[0]
    return version


# -- counters kept for another engine (Backend.add_counts) ------------------------------------
_ADD = (
    "INSERT INTO fairq_counts (scope, name, value) VALUES (?, ?, ?) "
    "ON CONFLICT (scope, name) DO UPDATE SET value = value + excluded.value"
)


def add_counts(t: Txn, scope: str, counts: dict[str, int]) -> None:
    t.conn.executemany(_ADD, [(scope, name, n) for name, n in counts.items() if n])


def read_counts(t: Txn, scope: str) -> dict[str, int]:
    rows = t.conn.execute("SELECT name, value FROM fairq_counts WHERE scope = ?", (scope,))
    return dict(rows.fetchall())


def drop_counts(t: Txn, scope: str) -> None:
    t.conn.execute("DELETE FROM fairq_counts WHERE scope = ?", (scope,))
