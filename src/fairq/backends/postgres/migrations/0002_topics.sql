-- fairq on PostgreSQL, migration 2: topics and subscriptions.

-- version: bumped by every change of the topic's subscriptions; a publisher holds the row
-- FOR SHARE, a subscribe FOR UPDATE, so a publish never misses a subscription made before it
CREATE TABLE {schema}.topics (
    id         serial PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    config     jsonb NOT NULL,
    created_at float8 NOT NULL,
    version    bigint NOT NULL DEFAULT 0
);

CREATE TABLE {schema}.topic_counts (
    topic_id  int NOT NULL,
    shard     int NOT NULL,
    published bigint NOT NULL DEFAULT 0,
    copies    bigint NOT NULL DEFAULT 0,
    unmatched bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, shard)
) WITH (fillfactor = 50);

-- a subscription IS a queue (queues.id = queue_id), fed by its topic
CREATE TABLE {schema}.subscriptions (
    topic_id   int NOT NULL,
    name       text NOT NULL,
    queue_id   int NOT NULL,
    filter     jsonb,
    routing    text,
    push       text,
    created_at float8 NOT NULL,
    PRIMARY KEY (topic_id, name)
);
CREATE INDEX subscriptions_queue ON {schema}.subscriptions (queue_id);

CREATE TABLE {schema}.topic_dedup (
    topic_id      int NOT NULL,
    dedup_id      text NOT NULL,
    msg_id        bigint NOT NULL,
    subscriptions jsonb NOT NULL,
    expires_at    float8 NOT NULL,
    PRIMARY KEY (topic_id, dedup_id)
);
CREATE INDEX topic_dedup_expiry ON {schema}.topic_dedup (expires_at);

-- processes with ephemeral listeners (Topic.listen) renew their row; a publish NOTIFYs
-- its messages only while a live row exists for the topic
CREATE TABLE {schema}.listeners (
    topic   text NOT NULL,
    session text NOT NULL,
    until   float8 NOT NULL,
    PRIMARY KEY (topic, session)
);

-- broadcasts too large for a NOTIFY payload (8000 bytes): the NOTIFY names the row
CREATE TABLE {schema}.broadcasts (
    id      bigserial PRIMARY KEY,
    at      float8 NOT NULL,
    payload bytea NOT NULL
);

-- store one publish's copies: copy i goes to queue qnames[i] and is publication pubs[i];
-- every queue's room is made (or QueueFull raised, undoing everything) as it is stored;
-- returns the ids of the n publications
CREATE FUNCTION {schema}.publish_copies(
    now float8, n int, qnames text[], pubs int[], bodies bytea[], attrs jsonb[],
    delays float8[]
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    r record;
    q {schema}.queues;
    k int;
BEGIN
    FOR r IN
        SELECT u.qn, array_agg(u.pub ORDER BY u.o) AS idx
        FROM unnest(qnames, pubs) WITH ORDINALITY AS u(qn, pub, o)
        GROUP BY u.qn ORDER BY u.qn
    LOOP
        q := {schema}.queue(r.qn);
        k := cardinality(r.idx);
        PERFORM {schema}.make_room(q, k, now);
        PERFORM {schema}.store(q, now, {schema}.next_ids(now, k),
            ARRAY(SELECT bodies[i] FROM unnest(r.idx) i),
            ARRAY(SELECT attrs[i] FROM unnest(r.idx) i),
            ARRAY(SELECT delays[i] FROM unnest(r.idx) i),
            NULL, NULL);
    END LOOP;
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    RETURN {schema}.next_ids(now, n);
END $$;
