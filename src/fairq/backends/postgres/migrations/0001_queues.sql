-- fairq on PostgreSQL, migration 1: queues and messages.
-- The schema and NOTIFY channel placeholders (in braces) are filled in when a migration is
-- applied (see migrate.py); TABLES.md describes every table.

CREATE TABLE {schema}.meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO {schema}.meta (key, value) VALUES ('config_version', 0);

-- message ids: milliseconds << 16, kept ahead of time by next_ids()
CREATE SEQUENCE {schema}.message_ids AS bigint;

CREATE TABLE {schema}.queues (
    id                 serial PRIMARY KEY,
    name               text NOT NULL UNIQUE,
    config             jsonb NOT NULL,        -- QueueConfig.to_dict()
    created_at         float8 NOT NULL,
    -- the options the SQL functions need, copied out of config
    visibility_timeout float8 NOT NULL,
    max_attempts       int,
    dead_letter        text,
    retention          float8 NOT NULL,
    max_length         int,
    overflow           text NOT NULL,
    fifo               bool NOT NULL,
    max_priority       int NOT NULL,
    dedup_window       float8 NOT NULL
);

-- counters, sharded by backend (64 shards) so concurrent transactions rarely queue on one row;
-- a queue's numbers are the sums over its shards (depth: messages stored)
CREATE TABLE {schema}.counts (
    queue_id      int NOT NULL,
    shard         int NOT NULL,
    depth         bigint NOT NULL DEFAULT 0,
    sent          bigint NOT NULL DEFAULT 0,
    acked         bigint NOT NULL DEFAULT 0,
    nacked        bigint NOT NULL DEFAULT 0,
    redelivered   bigint NOT NULL DEFAULT 0,
    dead_lettered bigint NOT NULL DEFAULT 0,
    expired       bigint NOT NULL DEFAULT 0,
    discarded     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue_id, shard)
) WITH (fillfactor = 50);  -- room for HOT updates: counters change on every operation

-- A message is visible when avail_at <= now and it is not blocked. A lease sets avail_at
-- to the end of the lease (lease = its token); an expired lease is visible again with no
-- write. Delayed: lease IS NULL and avail_at > now. blocked: behind its FIFO group's head.
-- final: leased at its last allowed attempt (found by the sweep when the lease runs out).
CREATE TABLE {schema}.messages (
    queue_id int NOT NULL,
    id       bigint NOT NULL,
    priority smallint NOT NULL DEFAULT 0,
    avail_at float8 NOT NULL,
    attempt  int NOT NULL DEFAULT 0,
    lease    bigint,
    final    bool NOT NULL DEFAULT false,
    blocked  bool NOT NULL DEFAULT false,
    grp      text,
    body     bytea NOT NULL,
    attrs    jsonb,
    PRIMARY KEY (queue_id, id)
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 1);

CREATE INDEX messages_ready ON {schema}.messages (queue_id, priority DESC, avail_at, id)
    WHERE NOT blocked;
CREATE INDEX messages_blocked ON {schema}.messages (queue_id, grp, id) WHERE blocked;
CREATE INDEX messages_final ON {schema}.messages (avail_at) WHERE final;

-- FIFO groups with messages: n counts them; the row is the lock a send and an ack of
-- the same group take, so a group's head is always known
CREATE TABLE {schema}.fifo_groups (
    queue_id int NOT NULL,
    grp      text NOT NULL,
    n        int NOT NULL,
    PRIMARY KEY (queue_id, grp)
) WITH (fillfactor = 70);

CREATE TABLE {schema}.dedup (
    queue_id   int NOT NULL,
    dedup_id   text NOT NULL,
    msg_id     bigint NOT NULL,
    expires_at float8 NOT NULL,
    PRIMARY KEY (queue_id, dedup_id)
);
CREATE INDEX dedup_expiry ON {schema}.dedup (expires_at);

-- -- functions ---------------------------------------------------------------------------
-- Every function takes `now` (seconds since the epoch) from the caller: the broker's clock.

CREATE FUNCTION {schema}.next_ids(now float8, n int) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    base bigint := floor(now * 1000)::bigint << 16;
    v bigint;
    out bigint[];
BEGIN
    v := nextval('{schema}.message_ids');
    IF v < base THEN
        -- the sequence is behind the clock: move it, one session at a time, forward only
        PERFORM pg_advisory_lock(1718774386, '{schema}.message_ids'::regclass::oid::int);
        v := nextval('{schema}.message_ids');
        IF v < base THEN
            PERFORM setval('{schema}.message_ids', base + n);
            out := ARRAY(SELECT generate_series(base + 1, base + n));
        END IF;
        PERFORM pg_advisory_unlock(1718774386, '{schema}.message_ids'::regclass::oid::int);
        IF out IS NOT NULL THEN
            RETURN out;
        END IF;
    END IF;
    IF n = 1 THEN
        RETURN ARRAY[v];
    END IF;
    RETURN v || ARRAY(SELECT nextval('{schema}.message_ids') FROM generate_series(2, n));
END $$;

-- Wake-ups. NOTIFY takes a global lock from the commit's start to its end, WAL flush
-- included, so writers that NOTIFY commit one at a time. On fairq's own pooled connections
-- (fairq.defer_wakes=on) wake() only notes the tag in the session; flush_wakes(), sent in
-- the same round trip right after the write committed, NOTIFYs in a transaction of its
-- own that does not wait for the flush. On a caller's connection (the outbox) the NOTIFY
-- stays in the caller's transaction: it goes out exactly when that commits.
CREATE FUNCTION {schema}.wake(tag text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('fairq.defer_wakes', true) = 'on' THEN
        PERFORM set_config('fairq.wakes',
            coalesce(current_setting('fairq.wakes', true), '') || tag || chr(30), false);
    ELSE
        PERFORM pg_notify('{channel}', tag);
    END IF;
END $$;

CREATE FUNCTION {schema}.flush_wakes() RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    pending text := coalesce(current_setting('fairq.wakes', true), '');
    tag text;
    k int := 0;
BEGIN
    IF pending = '' THEN
        RETURN 0;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM set_config('fairq.wakes', '', false);
    FOR tag IN SELECT DISTINCT x FROM unnest(string_to_array(pending, chr(30))) x WHERE x <> ''
    LOOP
        PERFORM pg_notify('{channel}', tag);
        k := k + 1;
    END LOOP;
    RETURN k;
END $$;

CREATE FUNCTION {schema}.bump(
    q int, depth bigint DEFAULT 0, sent bigint DEFAULT 0, acked bigint DEFAULT 0,
    nacked bigint DEFAULT 0, redelivered bigint DEFAULT 0, dead_lettered bigint DEFAULT 0,
    expired bigint DEFAULT 0, discarded bigint DEFAULT 0
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO {schema}.counts AS c
        (queue_id, shard, depth, sent, acked, nacked, redelivered, dead_lettered, expired,
         discarded)
    VALUES (q, pg_backend_pid() % 64, depth, sent, acked, nacked, redelivered, dead_lettered,
            expired, discarded)
    ON CONFLICT (queue_id, shard) DO UPDATE SET
        depth = c.depth + excluded.depth, sent = c.sent + excluded.sent,
        acked = c.acked + excluded.acked, nacked = c.nacked + excluded.nacked,
        redelivered = c.redelivered + excluded.redelivered,
        dead_lettered = c.dead_lettered + excluded.dead_lettered,
        expired = c.expired + excluded.expired, discarded = c.discarded + excluded.discarded
$$;

CREATE FUNCTION {schema}.queue(qname text) RETURNS {schema}.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE q {schema}.queues;
BEGIN
    SELECT * INTO q FROM {schema}.queues WHERE name = qname;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ404', MESSAGE = qname;
    END IF;
    RETURN q;
END $$;

-- a dead-letter queue that was deleted comes back with the defaults of one
CREATE FUNCTION {schema}.ensure_dlq(qname text, now float8) RETURNS {schema}.queues
LANGUAGE plpgsql AS $$
DECLARE q {schema}.queues;
BEGIN
    SELECT * INTO q FROM {schema}.queues WHERE name = qname;
    IF FOUND THEN
        RETURN q;
    END IF;
    INSERT INTO {schema}.queues (name, config, created_at, visibility_timeout, max_attempts,
        dead_letter, retention, max_length, overflow, fifo, max_priority, dedup_window)
    VALUES (qname, jsonb_build_object('visibility_timeout', 30.0, 'max_attempts', NULL,
        'dead_letter', NULL, 'retention', 1209600.0, 'max_length', NULL, 'overflow', 'reject',
        'fifo', false, 'max_priority', 0, 'dedup_window', 300.0, 'freshness_slo', NULL),
        now, 30.0, NULL, NULL, 1209600.0, NULL, 'reject', false, 0, 300.0)
    ON CONFLICT (name) DO NOTHING;
    UPDATE {schema}.meta SET value = value + 1 WHERE key = 'config_version';
    SELECT * INTO q FROM {schema}.queues WHERE name = qname;
    RETURN q;
END $$;

CREATE FUNCTION {schema}.dl_attrs(
    a jsonb, reason text, source text, mid bigint, attempts int, detail text
) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT (coalesce(a, '{}'::jsonb) - 'fairq.detail')
        || jsonb_build_object('fairq.reason', reason, 'fairq.source', source,
                              'fairq.attempts', attempts::text)
        || CASE WHEN a ? 'fairq.original_id' THEN '{}'::jsonb
                ELSE jsonb_build_object('fairq.original_id', lpad(to_hex(mid), 16, '0')) END
        || CASE WHEN detail IS NOT NULL AND detail <> '' AND detail <> reason
                THEN jsonb_build_object('fairq.detail', left(detail, 1000))
                ELSE '{}'::jsonb END
$$;

-- store new messages in q (no bound checked here): FIFO heads, counters, wake-up
CREATE FUNCTION {schema}.store(
    q {schema}.queues, now float8, ids bigint[], bodies bytea[], attrs jsonb[],
    delays float8[], prios int[], grps text[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k int := cardinality(ids);
    heads bigint[] := '{}';
    g record;
    got int;
BEGIN
    IF k = 0 THEN
        RETURN;
    END IF;
    IF NOT q.fifo THEN
        INSERT INTO {schema}.messages (queue_id, id, priority, avail_at, grp, body, attrs)
        SELECT q.id, u.id, coalesce(u.p, 0), now + coalesce(u.d, 0), u.g, u.b, u.a
        FROM unnest(ids, bodies, attrs, delays, prios, grps) AS u(id, b, a, d, p, g);
    ELSE
        FOR g IN
            SELECT coalesce(u.g, 'default') AS grp, count(*)::int AS n, min(u.id) AS first
            FROM unnest(ids, grps) AS u(id, g) GROUP BY 1 ORDER BY 1
        LOOP
            INSERT INTO {schema}.fifo_groups AS f (queue_id, grp, n) VALUES (q.id, g.grp, g.n)
            ON CONFLICT (queue_id, grp) DO UPDATE SET n = f.n + excluded.n
            RETURNING f.n INTO got;
            IF got = g.n THEN
                heads := heads || g.first;  -- the group was empty: its first one leads
            END IF;
        END LOOP;
        INSERT INTO {schema}.messages
            (queue_id, id, priority, avail_at, grp, body, attrs, blocked)
        SELECT q.id, u.id, coalesce(u.p, 0), now + coalesce(u.d, 0), coalesce(u.g, 'default'),
               u.b, u.a, NOT (u.id = ANY (heads))
        FROM unnest(ids, bodies, attrs, delays, prios, grps) AS u(id, b, a, d, p, g);
    END IF;
    PERFORM {schema}.bump(q.id, depth => k, sent => k);
    PERFORM {schema}.wake('q:' || q.name);
END $$;

-- delete messages of q in any state, keeping counters and FIFO heads right; the rows
-- are returned (in id order) for whoever moves them on
CREATE FUNCTION {schema}.remove(q {schema}.queues, ids bigint[])
RETURNS SETOF {schema}.messages LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.messages;
    k int := 0;
    g record;
    left_n int;
    grps text[] := '{}';
    heads bool[] := '{}';
BEGIN
    FOR r IN
        WITH gone AS (
            DELETE FROM {schema}.messages m WHERE m.queue_id = q.id AND m.id = ANY (ids)
            RETURNING m.*
        ) SELECT * FROM gone ORDER BY id
    LOOP
        k := k + 1;
        IF q.fifo AND r.grp IS NOT NULL THEN
            grps := grps || r.grp;
            heads := heads || NOT r.blocked;
        END IF;
        RETURN NEXT r;
    END LOOP;
    IF k = 0 THEN
        RETURN;
    END IF;
    PERFORM {schema}.bump(q.id, depth => -k);
    FOR g IN
        SELECT u.g AS grp, count(*)::int AS n, bool_or(u.h) AS head_gone
        FROM unnest(grps, heads) AS u(g, h) GROUP BY 1 ORDER BY 1
    LOOP
        UPDATE {schema}.fifo_groups SET n = n - g.n WHERE queue_id = q.id AND grp = g.grp
        RETURNING n INTO left_n;
        IF left_n IS NULL OR left_n <= 0 THEN
            DELETE FROM {schema}.fifo_groups WHERE queue_id = q.id AND grp = g.grp;
        ELSIF g.head_gone THEN
            UPDATE {schema}.messages SET blocked = false
            WHERE queue_id = q.id AND id = (
                SELECT id FROM {schema}.messages
                WHERE queue_id = q.id AND grp = g.grp AND blocked ORDER BY id LIMIT 1);
            PERFORM {schema}.wake('q:' || q.name);
        END IF;
    END LOOP;
END $$;

-- move messages of q to its dead-letter queue (or discard them), with their reason
CREATE FUNCTION {schema}.dead_letter_rows(
    q {schema}.queues, ids bigint[], reason text, detail text, now float8
) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    dlq {schema}.queues;
    b bytea[]; a jsonb[]; p int[]; g text[];
    k int;
BEGIN
    IF q.dead_letter IS NOT NULL THEN
        dlq := {schema}.ensure_dlq(q.dead_letter, now);
    END IF;
    SELECT array_agg(r.body ORDER BY r.id),
           array_agg({schema}.dl_attrs(r.attrs, reason, q.name, r.id, r.attempt, detail)
                     ORDER BY r.id),
           array_agg(least(r.priority, coalesce(dlq.max_priority, 0)) ORDER BY r.id),
           array_agg(r.grp ORDER BY r.id)
      INTO b, a, p, g
      FROM {schema}.remove(q, ids) AS r;
    k := coalesce(cardinality(b), 0);
    IF k = 0 THEN
        RETURN 0;
    END IF;
    IF reason = 'expired' THEN
        PERFORM {schema}.bump(q.id, expired => k);
    END IF;
    IF q.dead_letter IS NULL THEN
        PERFORM {schema}.bump(q.id, discarded => k);
        RETURN k;
    END IF;
    PERFORM {schema}.bump(q.id, dead_lettered => k);
    PERFORM {schema}.store(dlq, now, {schema}.next_ids(now, k), b, a,
                           array_fill(0.0::float8, ARRAY[k]), p, g);
    RETURN k;
END $$;

-- leases that ran out at their last attempt: to the dead-letter queue (a few at a time)
CREATE FUNCTION {schema}.sweep_final(now float8) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    r record;
    q {schema}.queues;
    k int := 0;
BEGIN
    FOR r IN
        SELECT f.queue_id, array_agg(f.id ORDER BY f.id) AS ids FROM (
            SELECT queue_id, id FROM {schema}.messages
            WHERE final AND avail_at <= now ORDER BY avail_at LIMIT 100
            FOR UPDATE SKIP LOCKED) f
        GROUP BY f.queue_id
    LOOP
        SELECT * INTO q FROM {schema}.queues WHERE id = r.queue_id;
        k := k + {schema}.dead_letter_rows(q, r.ids, 'max_attempts', NULL, now);
    END LOOP;
    RETURN k;
END $$;

-- make room for n new messages in a bounded queue, or raise FQ429 (QueueFull)
CREATE FUNCTION {schema}.make_room(q {schema}.queues, n int, now float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    depth bigint;
    need bigint;
    victims bigint[];
BEGIN
    IF q.max_length IS NULL OR n = 0 THEN
        RETURN;
    END IF;
    IF n > q.max_length THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ429', MESSAGE = q.name,
            DETAIL = json_build_object('max_length', q.max_length, 'overflow', 'reject',
                                       'detail', 'the batch is larger than max_length')::text;
    END IF;
    PERFORM 1 FROM {schema}.queues WHERE id = q.id FOR UPDATE;  -- one sender at a time
    SELECT coalesce(sum(c.depth), 0) INTO depth FROM {schema}.counts c WHERE c.queue_id = q.id;
    need := depth + n - q.max_length;
    IF need <= 0 THEN
        RETURN;
    END IF;
    IF q.overflow <> 'drop_oldest' THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ429', MESSAGE = q.name,
            DETAIL = json_build_object('max_length', q.max_length, 'overflow', q.overflow,
                                       'detail', '')::text;
    END IF;
    victims := ARRAY(
        SELECT id FROM {schema}.messages
        WHERE queue_id = q.id AND (blocked OR avail_at <= now)
        ORDER BY id LIMIT need FOR UPDATE SKIP LOCKED);
    IF cardinality(victims) < need THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ429', MESSAGE = q.name,
            DETAIL = json_build_object('max_length', q.max_length, 'overflow', 'drop_oldest',
                                       'detail', 'no visible message can be dropped')::text;
    END IF;
    PERFORM {schema}.dead_letter_rows(q, victims, 'overflow', NULL, now);
END $$;

CREATE FUNCTION {schema}.check_priorities(q {schema}.queues, prios int[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE p int;
BEGIN
    SELECT max(x) INTO p FROM unnest(prios) x;
    IF p > q.max_priority THEN
        SELECT x INTO p FROM unnest(prios) x WHERE x > q.max_priority LIMIT 1;
        RAISE EXCEPTION USING ERRCODE = 'FQ422', MESSAGE = format(
            'priority %s is above queue %L''s max_priority %s', p, q.name, q.max_priority);
    END IF;
END $$;

-- ids for every envelope (the first message's id for a duplicate)
CREATE FUNCTION {schema}.send(
    qname text, now float8, bodies bytea[], attrs jsonb[], delays float8[], prios int[],
    grps text[], dedups text[]
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    n int := cardinality(bodies);
    ids bigint[];
    answer bigint[];
    fresh int[] := '{}';
    hit bigint;
    j int;
BEGIN
    IF prios IS NOT NULL THEN
        PERFORM {schema}.check_priorities(q, prios);
    END IF;
    ids := {schema}.next_ids(now, n);
    IF dedups IS NULL THEN
        PERFORM {schema}.make_room(q, n, now);
        PERFORM {schema}.store(q, now, ids, bodies, attrs, delays, prios, grps);
        RETURN ids;
    END IF;
    answer := ids;
    FOR i IN 1..n LOOP
        IF dedups[i] IS NOT NULL THEN
            j := array_position(dedups, dedups[i]);
            IF j < i THEN
                answer[i] := answer[j];  -- a duplicate within the batch
                CONTINUE;
            END IF;
            hit := NULL;
            IF q.dedup_window > 0 THEN
                INSERT INTO {schema}.dedup AS d (queue_id, dedup_id, msg_id, expires_at)
                VALUES (q.id, dedups[i], ids[i], now + q.dedup_window)
                ON CONFLICT (queue_id, dedup_id) DO UPDATE
                    SET msg_id = excluded.msg_id, expires_at = excluded.expires_at
                    WHERE d.expires_at <= now
                RETURNING d.msg_id INTO hit;
                IF hit IS NULL THEN
                    SELECT d.msg_id INTO hit FROM {schema}.dedup d
                    WHERE d.queue_id = q.id AND d.dedup_id = dedups[i];
                    answer[i] := hit;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        fresh := fresh || i;
    END LOOP;
    PERFORM {schema}.make_room(q, cardinality(fresh), now);
    PERFORM {schema}.store(q, now,
        ARRAY(SELECT ids[i] FROM unnest(fresh) i), ARRAY(SELECT bodies[i] FROM unnest(fresh) i),
        ARRAY(SELECT attrs[i] FROM unnest(fresh) i), ARRAY(SELECT delays[i] FROM unnest(fresh) i),
        ARRAY(SELECT prios[i] FROM unnest(fresh) i), ARRAY(SELECT grps[i] FROM unnest(fresh) i));
    RETURN answer;
END $$;

-- lease up to n visible messages in delivery order. Past-retention messages are moved
-- first (a primary-key probe says whether there are any) and leases that ran out at their
-- last attempt by sweep_final, so the common case is ONE statement: pick the candidates
-- (SKIP LOCKED), lease them, return them; a leftover exhausted one is moved, and we go on
CREATE FUNCTION {schema}.receive(qname text, now float8, n int, vt float8)
RETURNS TABLE (id bigint, body bytea, attrs text, attempt int, priority smallint, grp text,
               lease bigint, ord int)
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    token bigint := ((random() * 4611686018427387903)::bigint) | 1;
    until float8 := now + coalesce(vt, q.visibility_timeout);
    cutoff bigint := floor((now - q.retention) * 1000)::bigint << 16;
    got int := 0;
    leased int;
    dead bigint[];
BEGIN
    -- a lease need not wait for the WAL flush: a server crash that forgets it makes the
    -- message visible again, as if the lease had run out (at-least-once holds; the
    -- consumer's ack then finds its lease gone). ?durable_leases=on waits for the flush.
    IF coalesce(current_setting('fairq.durable_leases', true), '') <> 'on' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM {schema}.sweep_final(now);
    IF EXISTS (SELECT 1 FROM {schema}.messages m WHERE m.queue_id = q.id AND m.id < cutoff) THEN
        PERFORM {schema}.expire_old(q, now);
    END IF;
    LOOP
        RETURN QUERY
        WITH picked AS (
            SELECT m.id FROM {schema}.messages m
            WHERE m.queue_id = q.id AND NOT m.blocked AND m.avail_at <= now
              AND NOT (m.lease IS NOT NULL AND m.attempt >= coalesce(q.max_attempts, 2147483647))
            ORDER BY m.priority DESC, m.avail_at, m.id
            LIMIT n - got FOR UPDATE SKIP LOCKED
        ), c AS (
            SELECT p.id, (row_number() OVER ())::int AS o FROM picked p
        ), u AS (
            UPDATE {schema}.messages m
            SET avail_at = until, attempt = m.attempt + 1, lease = token,
                final = (q.max_attempts IS NOT NULL AND m.attempt + 1 >= q.max_attempts)
            FROM c WHERE m.queue_id = q.id AND m.id = c.id
            RETURNING m.id, m.body, m.attrs::text AS attrs, m.attempt, m.priority, m.grp,
                      c.o
        ), redelivered AS (  -- always runs (it writes), in the same statement
            INSERT INTO {schema}.counts AS k (queue_id, shard, redelivered)
            SELECT q.id, pg_backend_pid() % 64, count(*) FROM u WHERE u.attempt > 1
            HAVING count(*) > 0
            ON CONFLICT (queue_id, shard) DO UPDATE
                SET redelivered = k.redelivered + excluded.redelivered
        )
        SELECT u.id, u.body, u.attrs, u.attempt, u.priority, u.grp, token, got + u.o FROM u;
        GET DIAGNOSTICS leased = ROW_COUNT;
        got := got + leased;
        EXIT WHEN got >= n OR q.max_attempts IS NULL;
        -- fewer than asked: an exhausted lease in the way (its sweep_final not yet run)?
        dead := ARRAY(
            SELECT m.id FROM {schema}.messages m
            WHERE m.queue_id = q.id AND NOT m.blocked AND m.avail_at <= now
              AND m.lease IS NOT NULL AND m.attempt >= q.max_attempts
            ORDER BY m.id LIMIT 100 FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(dead) = 0;
        PERFORM {schema}.dead_letter_rows(q, dead, 'max_attempts', NULL, now);
    END LOOP;
END $$;

-- delete the messages of current leases; the 1-based positions of receipts not current
CREATE FUNCTION {schema}.ack(qname text, now float8, ids bigint[], leases bigint[])
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
    k int;
BEGIN
    IF q.fifo THEN
        done := ARRAY(
            SELECT m.id FROM {schema}.messages m JOIN unnest(ids, leases) AS u(id, l)
                ON m.id = u.id AND m.lease = u.l
            WHERE m.queue_id = q.id AND m.avail_at > now FOR UPDATE OF m);
        PERFORM count(*) FROM {schema}.remove(q, done);
        k := cardinality(done);
    ELSE
        WITH gone AS (
            DELETE FROM {schema}.messages m USING unnest(ids, leases) AS u(id, l)
            WHERE m.queue_id = q.id AND m.id = u.id AND m.lease = u.l AND m.avail_at > now
            RETURNING m.id
        ) SELECT array_agg(gone.id) INTO done FROM gone;
        k := coalesce(cardinality(done), 0);
        IF k > 0 THEN
            PERFORM {schema}.bump(q.id, depth => -k);
        END IF;
    END IF;
    IF k > 0 THEN
        PERFORM {schema}.bump(q.id, acked => k);
        IF q.max_length IS NOT NULL THEN
            PERFORM {schema}.wake('q:' || q.name);  -- a blocked sender may fit now
        END IF;
    END IF;
    IF k = cardinality(ids) THEN
        RETURN '{}';
    END IF;
    RETURN ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                 WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
END $$;

CREATE FUNCTION {schema}.current_lease(q {schema}.queues, mid bigint, tok bigint, now float8)
RETURNS {schema}.messages LANGUAGE plpgsql AS $$
DECLARE r {schema}.messages;
BEGIN
    SELECT * INTO r FROM {schema}.messages m
    WHERE m.queue_id = q.id AND m.id = mid AND m.lease = tok AND m.avail_at > now FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ410', MESSAGE = 'lease lost';
    END IF;
    RETURN r;
END $$;

CREATE FUNCTION {schema}.nack(qname text, now float8, mid bigint, tok bigint, delay float8)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    r {schema}.messages := {schema}.current_lease(q, mid, tok, now);
BEGIN
    PERFORM {schema}.bump(q.id, nacked => 1);
    IF q.max_attempts IS NOT NULL AND r.attempt >= q.max_attempts THEN
        PERFORM {schema}.dead_letter_rows(q, ARRAY[mid], 'max_attempts', NULL, now);
        RETURN;
    END IF;
    UPDATE {schema}.messages SET avail_at = now + delay, lease = NULL, final = false
    WHERE queue_id = q.id AND id = mid;
    PERFORM {schema}.wake('q:' || q.name);
END $$;

CREATE FUNCTION {schema}.reject(qname text, now float8, mid bigint, tok bigint, detail text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    r {schema}.messages := {schema}.current_lease(q, mid, tok, now);
BEGIN
    PERFORM {schema}.dead_letter_rows(q, ARRAY[r.id], 'rejected', detail, now);
END $$;

CREATE FUNCTION {schema}.extend(
    qname text, now float8, ids bigint[], leases bigint[], seconds float8
) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
BEGIN
    WITH u AS (
        UPDATE {schema}.messages m SET avail_at = now + seconds
        FROM unnest(ids, leases) AS x(id, l)
        WHERE m.queue_id = q.id AND m.id = x.id AND m.lease = x.l AND m.avail_at > now
        RETURNING m.id
    ) SELECT array_agg(u.id) INTO done FROM u;
    RETURN ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                 WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
END $$;

CREATE FUNCTION {schema}.release(qname text, now float8, ids bigint[], leases bigint[])
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
BEGIN
    WITH u AS (
        UPDATE {schema}.messages m
        SET avail_at = now, lease = NULL, attempt = m.attempt - 1, final = false
        FROM unnest(ids, leases) AS x(id, l)
        WHERE m.queue_id = q.id AND m.id = x.id AND m.lease = x.l AND m.avail_at > now
        RETURNING m.id
    ) SELECT array_agg(u.id) INTO done FROM u;
    IF done IS NOT NULL THEN
        PERFORM {schema}.wake('q:' || q.name);
    END IF;
    RETURN ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                 WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
END $$;

-- dead-letter what is past retention and not in flight (in-flight: when its lease ends)
CREATE FUNCTION {schema}.expire_old(q {schema}.queues, now float8) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    cutoff bigint := floor((now - q.retention) * 1000)::bigint << 16;
    victims bigint[];
    k int := 0;
BEGIN
    LOOP
        victims := ARRAY(
            SELECT id FROM {schema}.messages
            WHERE queue_id = q.id AND id < cutoff AND (lease IS NULL OR avail_at <= now)
            ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(victims) = 0;
        k := k + {schema}.dead_letter_rows(q, victims, 'expired', NULL, now);
    END LOOP;
    RETURN k;
END $$;

CREATE FUNCTION {schema}.stats(qname text, now float8)
RETURNS TABLE (visible bigint, delayed bigint, in_flight bigint, oldest float8, sent bigint,
               acked bigint, nacked bigint, redelivered bigint, dead_lettered bigint,
               expired bigint, discarded bigint)
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    d bigint; f bigint; l bigint;
    first bigint;
BEGIN
    PERFORM {schema}.sweep_final(now);
    PERFORM {schema}.expire_old(q, now);
    SELECT coalesce(sum(w.leased), 0), coalesce(sum(w.later), 0) INTO f, l
    FROM generate_series(0, q.max_priority) AS p(prio), LATERAL (
        SELECT count(*) FILTER (WHERE m.lease IS NOT NULL) AS leased,
               count(*) FILTER (WHERE m.lease IS NULL) AS later
        FROM {schema}.messages m
        WHERE m.queue_id = q.id AND NOT m.blocked AND m.priority = p.prio
          AND m.avail_at > now) w;
    SELECT min(m.id) INTO first FROM {schema}.messages m WHERE m.queue_id = q.id;
    RETURN QUERY
    SELECT coalesce(sum(c.depth), 0)::bigint - f - l, l, f,
           CASE WHEN first IS NULL THEN 0.0
                ELSE greatest(0.0, now - (first >> 16) / 1000.0) END,
           coalesce(sum(c.sent), 0)::bigint, coalesce(sum(c.acked), 0)::bigint,
           coalesce(sum(c.nacked), 0)::bigint, coalesce(sum(c.redelivered), 0)::bigint,
           coalesce(sum(c.dead_lettered), 0)::bigint, coalesce(sum(c.expired), 0)::bigint,
           coalesce(sum(c.discarded), 0)::bigint
    FROM {schema}.counts c WHERE c.queue_id = q.id;
END $$;

CREATE FUNCTION {schema}.purge(qname text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    k int;
BEGIN
    DELETE FROM {schema}.messages WHERE queue_id = q.id;
    GET DIAGNOSTICS k = ROW_COUNT;
    DELETE FROM {schema}.fifo_groups WHERE queue_id = q.id;
    IF k > 0 THEN
        PERFORM {schema}.bump(q.id, depth => -k);
    END IF;
    PERFORM {schema}.wake('q:' || q.name);
    RETURN k;
END $$;

-- move up to lim messages with ids above after, oldest first, to toname or back to each
-- one's source queue; (moved, last id looked at, or NULL when nothing is left)
CREATE FUNCTION {schema}.redrive(qname text, toname text, now float8, lim int, after bigint)
RETURNS TABLE (moved int, last bigint) LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    fixed {schema}.queues;
    t {schema}.queues;
    r record;
    seen int;
    top bigint;
    k int := 0;
    b bytea[]; a jsonb[]; p int[]; g text[];
    cand_ids bigint[]; cand_targets text[];
BEGIN
    IF toname IS NOT NULL THEN
        fixed := {schema}.queue(toname);
    END IF;
    SELECT count(*), max(c.id), array_agg(c.id), array_agg(c.target)
      INTO seen, top, cand_ids, cand_targets
      FROM (SELECT m.id, coalesce(toname, m.attrs ->> 'fairq.source') AS target
            FROM {schema}.messages m
            WHERE m.queue_id = q.id AND m.id > after AND (m.blocked OR m.avail_at <= now)
            ORDER BY m.id LIMIT lim FOR UPDATE SKIP LOCKED) c;
    FOR r IN SELECT u.target, array_agg(u.id ORDER BY u.id) AS ids
             FROM unnest(cand_ids, cand_targets) AS u(id, target)
             WHERE u.target IS NOT NULL AND u.target <> q.name GROUP BY u.target ORDER BY 1
    LOOP
        SELECT * INTO t FROM {schema}.queues WHERE name = r.target;
        CONTINUE WHEN NOT FOUND;  -- its source queue is gone: it stays
        SELECT array_agg(x.body ORDER BY x.id),
               array_agg(x.attrs - 'fairq.reason' - 'fairq.source' - 'fairq.attempts'
                         - 'fairq.detail' ORDER BY x.id),
               array_agg(least(x.priority, t.max_priority) ORDER BY x.id),
               array_agg(x.grp ORDER BY x.id)
          INTO b, a, p, g
          FROM {schema}.remove(q, r.ids) AS x;
        IF b IS NOT NULL THEN
            PERFORM {schema}.store(t, now, {schema}.next_ids(now, cardinality(b)), b, a,
                                   array_fill(0.0::float8, ARRAY[cardinality(b)]), p, g);
            k := k + cardinality(b);
        END IF;
    END LOOP;
    RETURN QUERY SELECT k, CASE WHEN seen = lim THEN top ELSE NULL END;
END $$;

-- the earliest time one of these queues has a delayed or leased message coming back
CREATE FUNCTION {schema}.next_due(qnames text[], now float8) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT min(w.due) FROM {schema}.queues q
    CROSS JOIN LATERAL generate_series(0, q.max_priority) AS p(prio)
    CROSS JOIN LATERAL (
        SELECT m.avail_at AS due FROM {schema}.messages m
        WHERE m.queue_id = q.id AND NOT m.blocked AND m.priority = p.prio AND m.avail_at > now
        ORDER BY m.avail_at LIMIT 1) w
    WHERE q.name = ANY (qnames)
$$;

CREATE FUNCTION {schema}.drop_expired_dedup(now float8) RETURNS int LANGUAGE plpgsql AS $$
DECLARE k int;
BEGIN
    DELETE FROM {schema}.dedup WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {schema}.dedup WHERE expires_at <= now LIMIT 1000));
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN k;
END $$;

-- A queue's table churns faster than ANALYZE can follow: statistics taken when it was
-- empty make the planner sort every visible message after a bitmap scan instead of walking
-- messages_ready in order, or hash-join a whole queue to find 100 receipts. These
-- functions only ever want index walks and nested loops over the primary key, so they say
-- so; and no JIT, which costs more than these statements ever run (measured: receive of
-- 100 from a 10,000-deep queue 8.8 ms -> 1.3 ms; ack of 100, 4.3 ms -> under 1 ms).
ALTER FUNCTION {schema}.receive(text, float8, int, float8)
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.ack(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.extend(text, float8, bigint[], bigint[], float8)
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.release(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.send(text, float8, bytea[], jsonb[], float8[], int[], text[], text[])
    SET jit = off;
ALTER FUNCTION {schema}.next_due(text[], float8) SET enable_bitmapscan = off SET jit = off;
