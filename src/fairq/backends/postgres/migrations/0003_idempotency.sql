-- fairq on PostgreSQL, migration 3: idempotency keys and version gates.

-- one record per (namespace, key); the PRIMARY KEY decides a claim race
-- (INSERT ... ON CONFLICT DO UPDATE ... WHERE expired). An expired record counts as absent.
CREATE TABLE {schema}.idempotency (
    namespace   text NOT NULL,
    key         text NOT NULL,
    token       text NOT NULL,
    state       smallint NOT NULL,    -- 0 running (claimed), 1 completed
    fingerprint text,
    result      bytea,
    expires_at  float8 NOT NULL,
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 80);
CREATE INDEX idempotency_expiry ON {schema}.idempotency (expires_at);

-- the greatest version seen per entity: an integer, or a real (an event time)
CREATE TABLE {schema}.versions (
    namespace  text NOT NULL,
    entity     text NOT NULL,
    version    numeric NOT NULL,
    is_int     bool NOT NULL,
    updated_at float8 NOT NULL,
    PRIMARY KEY (namespace, entity)
) WITH (fillfactor = 80);
