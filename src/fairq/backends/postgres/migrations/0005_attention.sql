-- fairq on PostgreSQL, migration 5: attention domains (keys, tenants, signals, slices).
-- The rules are backends/attention_policy.py's; see TABLES.md for who locks what.

CREATE TABLE {schema}.att_domains (
    id           serial PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    config       jsonb NOT NULL,
    created_at   float8 NOT NULL,
    turn_counter bigint NOT NULL DEFAULT 0,
    processed    bigint NOT NULL DEFAULT 0,
    republished  bigint NOT NULL DEFAULT 0,
    blocked      bigint NOT NULL DEFAULT 0,
    rate_limited bigint NOT NULL DEFAULT 0,
    empty        bigint NOT NULL DEFAULT 0,
    parked       bigint NOT NULL DEFAULT 0,
    reconciled   bigint NOT NULL DEFAULT 0,
    discarded    jsonb NOT NULL DEFAULT '{}',
    clear_sum    float8 NOT NULL DEFAULT 0,
    clear_count  bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

CREATE TABLE {schema}.att_keys (
    domain_id     int NOT NULL,
    key           text NOT NULL,
    queue         text NOT NULL,
    tenant        text NOT NULL,
    plan          text NOT NULL,
    state         text NOT NULL DEFAULT 'active',
    parked        bool NOT NULL DEFAULT false,
    pending       int NOT NULL DEFAULT 0,
    active        int NOT NULL DEFAULT 0,
    tokens        float8,
    tokens_at     float8 NOT NULL,
    backlog_since float8,
    processed     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (domain_id, key)
) WITH (fillfactor = 70);

CREATE TABLE {schema}.att_tenants (
    domain_id int NOT NULL,
    tenant    text NOT NULL,
    turn      bigint NOT NULL DEFAULT 0,
    ready     int NOT NULL DEFAULT 0,
    since     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (domain_id, tenant)
) WITH (fillfactor = 70);
CREATE INDEX att_tenants_turn ON {schema}.att_tenants (domain_id, turn, since) WHERE ready > 0;

CREATE TABLE {schema}.att_signals (
    id        bigserial PRIMARY KEY,
    domain_id int NOT NULL,
    tenant    text NOT NULL,
    key       text NOT NULL,
    due       float8 NOT NULL,
    ready     bool NOT NULL
);
CREATE INDEX att_signals_ready ON {schema}.att_signals (domain_id, tenant, id) WHERE ready;
CREATE INDEX att_signals_delayed ON {schema}.att_signals (domain_id, due) WHERE NOT ready;
CREATE INDEX att_signals_key ON {schema}.att_signals (domain_id, key);

CREATE TABLE {schema}.att_slices (
    token       text PRIMARY KEY,
    domain_id   int NOT NULL,
    key         text NOT NULL,
    lease_until float8 NOT NULL
);
CREATE INDEX att_slices_lease ON {schema}.att_slices (domain_id, lease_until);

-- what the attention policy needs of a work queue: visible messages (counted up to cap,
-- the most a decision compares with), the earliest delayed or leased one coming back,
-- and the depth
CREATE FUNCTION {schema}.att_view(qname text, now float8, cap int)
RETURNS TABLE (visible int, waiting_due float8, depth bigint) LANGUAGE plpgsql STABLE AS $$
DECLARE q {schema}.queues;
BEGIN
    SELECT * INTO q FROM {schema}.queues WHERE name = qname;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::int, NULL::float8, 0::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT
        (SELECT count(*)::int FROM (SELECT 1 FROM {schema}.messages m
            WHERE m.queue_id = q.id AND (m.blocked OR m.avail_at <= now) LIMIT cap) v),
        {schema}.next_due(ARRAY[qname], now),
        (SELECT coalesce(sum(c.depth), 0)::bigint FROM {schema}.counts c WHERE c.queue_id = q.id);
END $$;
