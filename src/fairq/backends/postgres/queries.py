"""The SQL of the PostgreSQL backend's hot paths, named, for one schema.

Queue operations are PL/pgSQL functions (``migrations/0001_queues.sql``): each seam call
is ONE statement — one round trip, one implicit transaction — on a pooled autocommit
connection, or one statement inside the caller's transaction (``connection=``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Queries"]


@dataclass(frozen=True, slots=True)
class Queries:
    """Every statement, with the schema filled in."""

    s: str  # the quoted schema name

    @classmethod
    def for_schema(cls, schema: str) -> Queries:
        return cls('"' + schema.replace('"', '""') + '"')

    # -- queues ----------------------------------------------------------------------------
    @property
    def send(self) -> str:
        return (
            f"SELECT {self.s}.send(%s, %s, %b::bytea[], %s::jsonb[], %s::float8[], %s::int[], "
            "%s::text[], %s::text[])"
        )

    @property
    def receive(self) -> str:
        return f"SELECT * FROM {self.s}.receive(%s, %s, %s, %s)"

    @property
    def ack(self) -> str:
        return f"SELECT lost, woke FROM {self.s}.ack_batch(%s, %s, %s::bigint[], %s::bigint[])"

    @property
    def nack(self) -> str:
        return f"SELECT {self.s}.nack(%s, %s, %s, %s, %s, %s::text)"

    @property
    def reject(self) -> str:
        return f"SELECT {self.s}.reject(%s, %s, %s, %s, %s)"

    @property
    def extend(self) -> str:
        return f"SELECT {self.s}.extend(%s, %s, %s::bigint[], %s::bigint[], %s)"

    @property
    def release(self) -> str:
        return f"SELECT {self.s}.release(%s, %s, %s::bigint[], %s::bigint[])"

    @property
    def stats(self) -> str:
        return f"SELECT * FROM {self.s}.stats(%s, %s)"

    @property
    def purge(self) -> str:
        return f"SELECT {self.s}.purge(%s)"

    @property
    def redrive(self) -> str:
        return f"SELECT * FROM {self.s}.redrive(%s, %s, %s, %s, %s)"

    @property
    def peek(self) -> str:
        return (
            f"SELECT m.id, m.body, m.attrs::text, m.attempt, m.priority, m.grp "
            f"FROM {self.s}.messages m JOIN {self.s}.queues q ON q.id = m.queue_id "
            "WHERE q.name = %s ORDER BY m.id LIMIT %s"
        )

    @property
    def next_due(self) -> str:
        return f"SELECT {self.s}.next_due(%s::text[], %s)"

    @property
    def queue_row(self) -> str:
        return f"SELECT id, config FROM {self.s}.queues WHERE name = %s"

    @property
    def queue_names(self) -> str:
        return f"SELECT name FROM {self.s}.queues WHERE left(name, length(%s)) = %s ORDER BY name"

    # -- topics ----------------------------------------------------------------------------
    @property
    def publish_copies(self) -> str:
        return (
            f"SELECT {self.s}.publish_copies(%s, %s, %s::text[], %s::int[], %b::bytea[], "
            "%s::jsonb[], %s::float8[])"
        )
