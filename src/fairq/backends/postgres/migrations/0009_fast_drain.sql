-- fairq on PostgreSQL, migration 9: a drain that writes far less per message.
--
-- Hot leases. Until now a lease moved its message in the delivery index (avail_at, the
-- key of messages_ready, became the lease's end): a new row version, two index entries
-- and ~540 bytes of WAL per message, for a row the consumer then deletes. Now a lease of
-- a plain queue writes only columns no index covers (attempt, lease and the new `until`),
-- so PostgreSQL updates the row in place on its page (a HOT update: no index entry, ~80
-- bytes of WAL, since the changed columns sit together before the body); the row keeps
-- its place in messages_ready, where receives step over it (`until` > now). One row per
-- receive in `leases` lists the messages it leased hot, by lease end, so whatever must
-- find hot leases finds them by an index: a lease that ran out is "parked" (avail_at set
-- to its end, as before: it is redelivered in the order it became visible again), the
-- earliest lease end wakes long polls (next_due), stats count them. Leases stay as they
-- were ("parked" at once: avail_at = until) for FIFO queues, a message's last allowed
-- attempt (the dead-letter sweep finds those through messages_final), and beyond
-- hot_limit() hot leases per queue (so a receive never steps over more than that).
-- counts.hot counts a queue's hot leases.
--
-- The table is rebuilt with `until` before the body (the WAL of an in-place update logs
-- only the bytes between the unchanged prefix and suffix of the row) and fillfactor 50
-- (room on each page for its rows' next version).
--
-- Also: bump() in PL/pgSQL (a LANGUAGE sql function that writes is parsed and planned at
-- every call: 0.17 ms of its 0.2); ack_batch() reports whether it noted a wake-up, so the
-- common ack costs no second round trip (ack() stays, for code of before); receive() and
-- ack_batch() read the queue's row in place, and receive() updates leased rows through
-- their ctid (locked by the pick: it cannot move).

-- -- the messages table, rebuilt -------------------------------------------------------------
DROP FUNCTION {schema}.current_lease({schema}.queues, bigint, bigint, float8);
DROP FUNCTION {schema}.remove({schema}.queues, bigint[]);
ALTER TABLE {schema}.messages RENAME TO messages_v8;
ALTER TABLE {schema}.messages_v8 DROP CONSTRAINT messages_pkey;
DROP INDEX {schema}.messages_ready, {schema}.messages_blocked, {schema}.messages_final;

-- A message is visible when it is not blocked, avail_at <= now and it has no current
-- lease (lease IS NULL or until <= now). A lease sets lease (its token) and until (its
-- end); a "hot" lease leaves avail_at as it was (avail_at < until), a parked one sets
-- avail_at = until. Delayed: lease IS NULL AND avail_at > now. blocked: behind its FIFO
-- group's head. final: leased at its last allowed attempt (always parked).
CREATE TABLE {schema}.messages (
    queue_id int NOT NULL,
    id       bigint NOT NULL,
    priority smallint NOT NULL DEFAULT 0,
    avail_at float8 NOT NULL,
    attempt  int NOT NULL DEFAULT 0,
    lease    bigint,
    until    float8,
    final    bool NOT NULL DEFAULT false,
    blocked  bool NOT NULL DEFAULT false,
    grp      text,
    attrs    jsonb,
    body     bytea NOT NULL,
    PRIMARY KEY (queue_id, id)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 1);
INSERT INTO {schema}.messages
    (queue_id, id, priority, avail_at, attempt, lease, until, final, blocked, grp, attrs, body)
SELECT queue_id, id, priority, avail_at, attempt, lease,
       CASE WHEN lease IS NOT NULL THEN avail_at END, final, blocked, grp, attrs, body
FROM {schema}.messages_v8;
DROP TABLE {schema}.messages_v8;
CREATE INDEX messages_ready ON {schema}.messages (queue_id, priority DESC, avail_at, id)
    WHERE NOT blocked;
CREATE INDEX messages_blocked ON {schema}.messages (queue_id, grp, id) WHERE blocked;
CREATE INDEX messages_final ON {schema}.messages (avail_at) WHERE final;

ALTER TABLE {schema}.counts ADD COLUMN hot bigint NOT NULL DEFAULT 0;

-- one row per receive that leased messages hot: their token, lease end and ids. Deleted
-- by the ack that acks all of them, or once the lease ended (park(): the ones still
-- leased hot are parked), or with the queue.
CREATE TABLE {schema}.leases (
    queue_id int NOT NULL,
    until    float8 NOT NULL,
    token    bigint NOT NULL,
    ids      bigint[] NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1);
CREATE INDEX leases_due ON {schema}.leases (queue_id, until);

-- -- functions --------------------------------------------------------------------------
-- the most hot leases a queue keeps (past it, leases are parked): what a receive may
-- have to step over in messages_ready
CREATE FUNCTION {schema}.hot_limit() RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT 1000 $$;

CREATE OR REPLACE FUNCTION {schema}.bump(
    q int, depth bigint DEFAULT 0, sent bigint DEFAULT 0, acked bigint DEFAULT 0,
    nacked bigint DEFAULT 0, redelivered bigint DEFAULT 0, dead_lettered bigint DEFAULT 0,
    expired bigint DEFAULT 0, discarded bigint DEFAULT 0
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.counts AS c
        (queue_id, shard, depth, sent, acked, nacked, redelivered, dead_lettered, expired,
         discarded)
    VALUES (q, pg_backend_pid() % 64, bump.depth, bump.sent, bump.acked, bump.nacked,
            bump.redelivered, bump.dead_lettered, bump.expired, bump.discarded)
    ON CONFLICT (queue_id, shard) DO UPDATE SET
        depth = c.depth + excluded.depth, sent = c.sent + excluded.sent,
        acked = c.acked + excluded.acked, nacked = c.nacked + excluded.nacked,
        redelivered = c.redelivered + excluded.redelivered,
        dead_lettered = c.dead_lettered + excluded.dead_lettered,
        expired = c.expired + excluded.expired, discarded = c.discarded + excluded.discarded;
END $$;

CREATE FUNCTION {schema}.bump_hot(q int, n bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF n <> 0 THEN
        INSERT INTO {schema}.counts AS c (queue_id, shard, hot)
        VALUES (q, pg_backend_pid() % 64, n)
        ON CONFLICT (queue_id, shard) DO UPDATE SET hot = c.hot + excluded.hot;
    END IF;
END $$;

-- park the hot leases of q that have ended (avail_at := until: visible again, in the
-- order of their lease ends), and with all_rows every hot lease of q; the number parked
CREATE FUNCTION {schema}.park(q {schema}.queues, now float8, all_rows bool DEFAULT false)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    k int := 0;
    rows_done int;
    parked int;
BEGIN
    LOOP
        WITH due AS (
            SELECT l.ctid AS t, l.token, l.ids FROM {schema}.leases l
            WHERE l.queue_id = q.id AND (all_rows OR l.until <= now)
            ORDER BY l.until LIMIT 100 FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM {schema}.leases l USING due WHERE l.ctid = due.t
        ), moved AS (
            UPDATE {schema}.messages m SET avail_at = m.until
            FROM (SELECT d.token, unnest(d.ids) AS mid FROM due d) x
            WHERE m.queue_id = q.id AND m.id = x.mid AND m.lease = x.token
              AND m.avail_at < m.until
            RETURNING 1
        ) SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM moved)
          INTO rows_done, parked;
        PERFORM {schema}.bump_hot(q.id, -parked);
        k := k + parked;
        EXIT WHEN rows_done < 100;
    END LOOP;
    RETURN k;
END $$;

-- delete messages of q in any state, keeping counters and FIFO heads right; the rows
-- are returned (in id order) for whoever moves them on
CREATE FUNCTION {schema}.remove(q {schema}.queues, ids bigint[])
RETURNS SETOF {schema}.messages LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.messages;
    k int := 0;
    hot int := 0;
    g record;
    left_n int;
    grps text[] := '{}';
    heads bool[] := '{}';
BEGIN
    FOR r IN
        WITH gone AS (
            DELETE FROM {schema}.messages m WHERE m.queue_id = q.id AND m.id = ANY (ids)
            RETURNING m.*
        ) SELECT * FROM gone ORDER BY gone.id
    LOOP
        k := k + 1;
        IF r.lease IS NOT NULL AND r.avail_at < r.until THEN
            hot := hot + 1;
        END IF;
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
    PERFORM {schema}.bump_hot(q.id, -hot);
    FOR g IN
        SELECT u.g AS grp, count(*)::int AS n, bool_or(u.h) AS head_gone
        FROM unnest(grps, heads) AS u(g, h) GROUP BY 1 ORDER BY 1
    LOOP
        UPDATE {schema}.fifo_groups f SET n = f.n - g.n
        WHERE f.queue_id = q.id AND f.grp = g.grp
        RETURNING f.n INTO left_n;
        IF left_n IS NULL OR left_n <= 0 THEN
            DELETE FROM {schema}.fifo_groups f WHERE f.queue_id = q.id AND f.grp = g.grp;
        ELSIF g.head_gone THEN
            UPDATE {schema}.messages m SET blocked = false
            WHERE m.queue_id = q.id AND m.id = (
                SELECT x.id FROM {schema}.messages x
                WHERE x.queue_id = q.id AND x.grp = g.grp AND x.blocked ORDER BY x.id LIMIT 1);
            PERFORM {schema}.wake('q:' || q.name);
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION {schema}.current_lease(q {schema}.queues, mid bigint, tok bigint, now float8)
RETURNS {schema}.messages LANGUAGE plpgsql AS $$
DECLARE r {schema}.messages;
BEGIN
    SELECT * INTO r FROM {schema}.messages m
    WHERE m.queue_id = q.id AND m.id = mid AND m.lease = tok AND m.until > now FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ410', MESSAGE = 'lease lost';
    END IF;
    RETURN r;
END $$;

-- make room for n new messages in a bounded queue, or raise FQ429 (QueueFull)
CREATE OR REPLACE FUNCTION {schema}.make_room(q {schema}.queues, n int, now float8)
RETURNS void LANGUAGE plpgsql AS $$
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
        SELECT m.id FROM {schema}.messages m
        WHERE m.queue_id = q.id
          AND (m.blocked OR (m.avail_at <= now AND (m.lease IS NULL OR m.until <= now)))
        ORDER BY m.id LIMIT need FOR UPDATE SKIP LOCKED);
    IF cardinality(victims) < need THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ429', MESSAGE = q.name,
            DETAIL = json_build_object('max_length', q.max_length, 'overflow', 'drop_oldest',
                                       'detail', 'no visible message can be dropped')::text;
    END IF;
    PERFORM {schema}.dead_letter_rows(q, victims, 'overflow', NULL, now);
END $$;

-- lease up to n visible messages in delivery order. Past-retention messages are moved
-- first (a primary-key probe says whether there are any), leases that ran out at their
-- last attempt by sweep_final and hot leases that ran out are parked (index probes say
-- whether there are any), so the common case is ONE statement: pick the candidates (SKIP
-- LOCKED; hot leases are stepped over), lease them, record the hot ones, return them; a
-- leftover exhausted one is moved, and we go on
CREATE OR REPLACE FUNCTION {schema}.receive(qname text, now float8, n int, vt float8)
RETURNS TABLE (id bigint, body bytea, attrs text, attempt int, priority smallint, grp text,
               lease bigint, ord int)
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues;
    token bigint := ((random() * 4611686018427387903)::bigint) | 1;
    lease_end float8;
    cutoff bigint;
    room int;  -- how many of these leases may be hot
    finals_due bool;
    too_old bool;
    hot_due bool;
    got int := 0;
    leased int;
    dead bigint[];
BEGIN
    SELECT * INTO q FROM {schema}.queues x WHERE x.name = qname;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ404', MESSAGE = qname;
    END IF;
    lease_end := now + coalesce(vt, q.visibility_timeout);
    cutoff := floor((now - q.retention) * 1000)::bigint << 16;
    -- a lease need not wait for the WAL flush: a server crash that forgets it makes the
    -- message visible again, as if the lease had run out (at-least-once holds; the
    -- consumer's ack then finds its lease gone). ?durable_leases=on waits for the flush.
    IF coalesce(current_setting('fairq.durable_leases', true), '') <> 'on' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- what needs doing first, in one statement (three index probes) with the room for hot
    -- leases (FIFO queues: none)
    SELECT EXISTS (SELECT 1 FROM {schema}.messages m WHERE m.final AND m.avail_at <= now),
           EXISTS (SELECT 1 FROM {schema}.messages m WHERE m.queue_id = q.id AND m.id < cutoff),
           EXISTS (SELECT 1 FROM {schema}.leases l WHERE l.queue_id = q.id AND l.until <= now),
           CASE WHEN q.fifo THEN 0 ELSE {schema}.hot_limit() - coalesce(
               (SELECT sum(c.hot) FROM {schema}.counts c WHERE c.queue_id = q.id), 0) END
    INTO finals_due, too_old, hot_due, room;
    IF finals_due THEN
        PERFORM {schema}.sweep_final(now);
    END IF;
    IF too_old THEN
        PERFORM {schema}.expire_old(q, now);
    END IF;
    IF hot_due THEN
        PERFORM {schema}.park(q, now);
    END IF;
    LOOP
        RETURN QUERY
        WITH picked AS (
            SELECT m.ctid AS t FROM {schema}.messages m
            WHERE m.queue_id = q.id AND NOT m.blocked AND m.avail_at <= now
              AND (m.lease IS NULL OR m.avail_at >= m.until)  -- not leased hot
              AND NOT (m.lease IS NOT NULL AND m.attempt >= coalesce(q.max_attempts, 2147483647))
            ORDER BY m.priority DESC, m.avail_at, m.id
            LIMIT n - got FOR UPDATE SKIP LOCKED
        ), c AS (
            SELECT p.t, (row_number() OVER ())::int AS o FROM picked p
        ), u AS (
            UPDATE {schema}.messages m
            SET attempt = m.attempt + 1, lease = token, until = lease_end,
                final = (q.max_attempts IS NOT NULL AND m.attempt + 1 >= q.max_attempts),
                avail_at = CASE WHEN got + c.o > room OR (q.max_attempts IS NOT NULL
                                     AND m.attempt + 1 >= q.max_attempts)
                                THEN lease_end ELSE m.avail_at END
            FROM c WHERE m.ctid = c.t
            RETURNING m.id, m.body, m.attrs::text AS attrs, m.attempt, m.priority, m.grp,
                      c.o, m.avail_at < m.until AS hot
        ), counted AS (  -- always runs (it writes), in the same statement
            INSERT INTO {schema}.counts AS k (queue_id, shard, redelivered, hot)
            SELECT q.id, pg_backend_pid() % 64, count(*) FILTER (WHERE u.attempt > 1),
                   count(*) FILTER (WHERE u.hot)
            FROM u HAVING count(*) FILTER (WHERE u.attempt > 1 OR u.hot) > 0
            ON CONFLICT (queue_id, shard) DO UPDATE
                SET redelivered = k.redelivered + excluded.redelivered, hot = k.hot + excluded.hot
        ), recorded AS (
            INSERT INTO {schema}.leases (queue_id, until, token, ids)
            SELECT q.id, lease_end, token, array_agg(u.id) FROM u WHERE u.hot
            HAVING count(*) > 0
        )
        SELECT u.id, u.body, u.attrs, u.attempt, u.priority, u.grp, token, got + u.o FROM u;
        GET DIAGNOSTICS leased = ROW_COUNT;
        got := got + leased;
        EXIT WHEN got >= n OR q.max_attempts IS NULL;
        -- fewer than asked: an exhausted lease in the way (its sweep_final not yet run)?
        dead := ARRAY(
            SELECT m.id FROM {schema}.messages m
            WHERE m.queue_id = q.id AND NOT m.blocked AND m.avail_at <= now
              AND m.lease IS NOT NULL AND m.until <= now AND m.attempt >= q.max_attempts
            ORDER BY m.id LIMIT 100 FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(dead) = 0;
        PERFORM {schema}.dead_letter_rows(q, dead, 'max_attempts', NULL, now);
    END LOOP;
END $$;

-- delete the messages of current leases: the 1-based positions of the receipts that are
-- not current, and whether a wake-up was noted (see wake() in migration 1)
CREATE FUNCTION {schema}.ack_batch(qname text, now float8, ids bigint[], leases bigint[],
                                   OUT lost int[], OUT woke bool)
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues;
    done bigint[];
    k int;
    hot int;
BEGIN
    SELECT * INTO q FROM {schema}.queues x WHERE x.name = qname;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ404', MESSAGE = qname;
    END IF;
    woke := false;
    IF q.fifo THEN
        done := ARRAY(
            SELECT m.id FROM {schema}.messages m JOIN unnest(ids, leases) AS u(id, l)
                ON m.id = u.id AND m.lease = u.l
            WHERE m.queue_id = q.id AND m.until > now FOR UPDATE OF m);
        PERFORM count(*) FROM {schema}.remove(q, done);  -- counts depth, moves FIFO heads
        k := cardinality(done);
        IF k > 0 THEN
            PERFORM {schema}.bump(q.id, acked => k);
            woke := true;  -- remove() woke the queue if a head moved
        END IF;
    ELSE
        WITH gone AS (
            DELETE FROM {schema}.messages m USING unnest(ids, leases) AS u(id, l)
            WHERE m.queue_id = q.id AND m.id = u.id AND m.lease = u.l AND m.until > now
            RETURNING m.id, m.lease, m.until, m.avail_at < m.until AS hot
        ), by_receive AS (
            SELECT g.lease, g.until, count(*) AS n, array_agg(g.id) AS acked
            FROM gone g WHERE g.hot GROUP BY 1, 2
        ), finished AS (  -- a receive's hot leases all acked here: its record goes too
            DELETE FROM {schema}.leases l USING by_receive b
            WHERE l.queue_id = q.id AND l.until = b.until AND l.token = b.lease
              AND cardinality(l.ids) = b.n
        ), shrunk AS (  -- some of them: the record keeps the others
            UPDATE {schema}.leases l
            SET ids = ARRAY(SELECT i FROM unnest(l.ids) AS i WHERE i <> ALL (b.acked))
            FROM by_receive b
            WHERE l.queue_id = q.id AND l.until = b.until AND l.token = b.lease
              AND cardinality(l.ids) > b.n
        ) SELECT array_agg(g.id), count(*) FILTER (WHERE g.hot) INTO done, hot FROM gone g;
        k := coalesce(cardinality(done), 0);
        IF k > 0 THEN
            INSERT INTO {schema}.counts AS c (queue_id, shard, depth, acked, hot)
            VALUES (q.id, pg_backend_pid() % 64, -k, k, -hot)
            ON CONFLICT (queue_id, shard) DO UPDATE
                SET depth = c.depth + excluded.depth, acked = c.acked + excluded.acked,
                    hot = c.hot + excluded.hot;
        END IF;
    END IF;
    IF k > 0 AND q.max_length IS NOT NULL THEN
        PERFORM {schema}.wake('q:' || q.name);  -- a blocked sender may fit now
        woke := true;
    END IF;
    IF k = cardinality(ids) THEN
        lost := '{}';
    ELSE
        lost := ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                      WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
    END IF;
END $$;

-- ack() as before migration 9 (a fairq process still running the code of before, during
-- an upgrade, acks with it)
CREATE OR REPLACE FUNCTION {schema}.ack(qname text, now float8, ids bigint[], leases bigint[])
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE r int[];
BEGIN
    SELECT a.lost INTO r FROM {schema}.ack_batch(qname, now, ids, leases) a;
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION {schema}.nack(qname text, now float8, mid bigint, tok bigint,
                                         delay float8)
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
    UPDATE {schema}.messages m
    SET avail_at = now + delay, lease = NULL, until = NULL, final = false
    WHERE m.queue_id = q.id AND m.id = mid;
    IF r.avail_at < r.until THEN
        PERFORM {schema}.bump_hot(q.id, -1);
    END IF;
    PERFORM {schema}.wake('q:' || q.name);
END $$;

CREATE OR REPLACE FUNCTION {schema}.reject(qname text, now float8, mid bigint, tok bigint,
                                           detail text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    r {schema}.messages := {schema}.current_lease(q, mid, tok, now);
BEGIN
    PERFORM {schema}.dead_letter_rows(q, ARRAY[r.id], 'rejected', detail, now);
END $$;

-- a new end for current leases (parked: a lease extended is no longer hot); the 1-based
-- positions of the receipts that are not current
CREATE OR REPLACE FUNCTION {schema}.extend(
    qname text, now float8, ids bigint[], leases bigint[], seconds float8
) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
    hot int;
BEGIN
    WITH cur AS (
        SELECT m.ctid AS t, m.avail_at < m.until AS hot FROM {schema}.messages m
        JOIN unnest(ids, leases) AS x(id, l) ON m.id = x.id AND m.lease = x.l
        WHERE m.queue_id = q.id AND m.until > now FOR UPDATE OF m
    ), u AS (
        UPDATE {schema}.messages m SET avail_at = now + seconds, until = now + seconds
        FROM cur WHERE m.ctid = cur.t
        RETURNING m.id, cur.hot
    ) SELECT array_agg(u.id), count(*) FILTER (WHERE u.hot) INTO done, hot FROM u;
    PERFORM {schema}.bump_hot(q.id, -hot);
    RETURN ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                 WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
END $$;

CREATE OR REPLACE FUNCTION {schema}.release(qname text, now float8, ids bigint[],
                                            leases bigint[])
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
    hot int;
BEGIN
    WITH cur AS (
        SELECT m.ctid AS t, m.avail_at < m.until AS hot FROM {schema}.messages m
        JOIN unnest(ids, leases) AS x(id, l) ON m.id = x.id AND m.lease = x.l
        WHERE m.queue_id = q.id AND m.until > now FOR UPDATE OF m
    ), u AS (
        UPDATE {schema}.messages m
        SET avail_at = now, lease = NULL, until = NULL, attempt = m.attempt - 1, final = false
        FROM cur WHERE m.ctid = cur.t
        RETURNING m.id, cur.hot
    ) SELECT array_agg(u.id), count(*) FILTER (WHERE u.hot) INTO done, hot FROM u;
    IF done IS NOT NULL THEN
        PERFORM {schema}.bump_hot(q.id, -hot);
        PERFORM {schema}.wake('q:' || q.name);
    END IF;
    RETURN ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                 WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
END $$;

-- dead-letter what is past retention and not in flight (in-flight: when its lease ends)
CREATE OR REPLACE FUNCTION {schema}.expire_old(q {schema}.queues, now float8) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    cutoff bigint := floor((now - q.retention) * 1000)::bigint << 16;
    victims bigint[];
    k int := 0;
BEGIN
    LOOP
        victims := ARRAY(
            SELECT m.id FROM {schema}.messages m
            WHERE m.queue_id = q.id AND m.id < cutoff AND (m.lease IS NULL OR m.until <= now)
            ORDER BY m.id LIMIT 1000 FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(victims) = 0;
        k := k + {schema}.dead_letter_rows(q, victims, 'expired', NULL, now);
    END LOOP;
    RETURN k;
END $$;

CREATE OR REPLACE FUNCTION {schema}.stats(qname text, now float8)
RETURNS TABLE (visible bigint, delayed bigint, in_flight bigint, oldest float8, sent bigint,
               acked bigint, nacked bigint, redelivered bigint, dead_lettered bigint,
               expired bigint, discarded bigint)
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    f bigint; l bigint;
    first bigint;
BEGIN
    PERFORM {schema}.sweep_final(now);
    PERFORM {schema}.expire_old(q, now);
    PERFORM {schema}.park(q, now);  -- hot leases that ended: visible, not in flight
    -- parked leases and delayed messages: the part of messages_ready past now
    SELECT coalesce(sum(w.leased), 0), coalesce(sum(w.later), 0) INTO f, l
    FROM generate_series(0, q.max_priority) AS p(prio), LATERAL (
        SELECT count(*) FILTER (WHERE m.lease IS NOT NULL) AS leased,
               count(*) FILTER (WHERE m.lease IS NULL) AS later
        FROM {schema}.messages m
        WHERE m.queue_id = q.id AND NOT m.blocked AND m.priority = p.prio
          AND m.avail_at > now) w;
    SELECT min(m.id) INTO first FROM {schema}.messages m WHERE m.queue_id = q.id;
    RETURN QUERY
    SELECT coalesce(sum(c.depth), 0)::bigint - f - coalesce(sum(c.hot), 0)::bigint - l, l,
           f + coalesce(sum(c.hot), 0)::bigint,
           CASE WHEN first IS NULL THEN 0.0
                ELSE greatest(0.0, now - (first >> 16) / 1000.0) END,
           coalesce(sum(c.sent), 0)::bigint, coalesce(sum(c.acked), 0)::bigint,
           coalesce(sum(c.nacked), 0)::bigint, coalesce(sum(c.redelivered), 0)::bigint,
           coalesce(sum(c.dead_lettered), 0)::bigint, coalesce(sum(c.expired), 0)::bigint,
           coalesce(sum(c.discarded), 0)::bigint
    FROM {schema}.counts c WHERE c.queue_id = q.id;
END $$;

CREATE OR REPLACE FUNCTION {schema}.purge(qname text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    k int;
    hot int;
BEGIN
    WITH gone AS (
        DELETE FROM {schema}.messages m WHERE m.queue_id = q.id
        RETURNING m.lease IS NOT NULL AND m.avail_at < m.until AS hot
    ) SELECT count(*), count(*) FILTER (WHERE gone.hot) INTO k, hot FROM gone;
    DELETE FROM {schema}.fifo_groups f WHERE f.queue_id = q.id;
    DELETE FROM {schema}.leases l WHERE l.queue_id = q.id;
    IF k > 0 THEN
        PERFORM {schema}.bump(q.id, depth => -k);
        PERFORM {schema}.bump_hot(q.id, -hot);
    END IF;
    PERFORM {schema}.wake('q:' || q.name);
    RETURN k;
END $$;

-- move up to lim messages with ids above after, oldest first, to toname or back to each
-- one's source queue; (moved, last id looked at, or NULL when nothing is left)
CREATE OR REPLACE FUNCTION {schema}.redrive(qname text, toname text, now float8, lim int,
                                            after bigint)
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
            WHERE m.queue_id = q.id AND m.id > after
              AND (m.blocked OR (m.avail_at <= now AND (m.lease IS NULL OR m.until <= now)))
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

-- the earliest time one of these queues has a delayed message or a lease coming due
CREATE OR REPLACE FUNCTION {schema}.next_due(qnames text[], now float8) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT least(
        (SELECT min(w.due) FROM {schema}.queues q
         CROSS JOIN LATERAL generate_series(0, q.max_priority) AS p(prio)
         CROSS JOIN LATERAL (
            SELECT m.avail_at AS due FROM {schema}.messages m
            WHERE m.queue_id = q.id AND NOT m.blocked AND m.priority = p.prio
              AND m.avail_at > now
            ORDER BY m.avail_at LIMIT 1) w
         WHERE q.name = ANY (qnames)),
        (SELECT min(h.until) FROM {schema}.queues q
         CROSS JOIN LATERAL (  -- the earliest receive with a hot lease still on
            SELECT l.until FROM {schema}.leases l
            WHERE l.queue_id = q.id AND l.until > now AND EXISTS (
                SELECT 1 FROM unnest(l.ids) AS i(mid)
                JOIN {schema}.messages m ON m.queue_id = l.queue_id AND m.id = i.mid
                WHERE m.lease = l.token AND m.avail_at < m.until)
            ORDER BY l.until LIMIT 1) h
         WHERE q.name = ANY (qnames)))
$$;

-- what the attention policy needs of a work queue: visible messages (counted up to cap,
-- the most a decision compares with), the earliest delayed or leased one coming back,
-- and the depth
CREATE OR REPLACE FUNCTION {schema}.att_view(qname text, now float8, cap int)
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
            WHERE m.queue_id = q.id
              AND (m.blocked OR (m.avail_at <= now AND (m.lease IS NULL OR m.until <= now)))
            LIMIT cap) v),
        {schema}.next_due(ARRAY[qname], now),
        (SELECT coalesce(sum(c.depth), 0)::bigint FROM {schema}.counts c WHERE c.queue_id = q.id);
END $$;

-- a work queue's visible messages (the backlog of TenantStats): its depth less what is
-- delayed or leased (FIFO followers count, as in stats()); hot leases that ended but are
-- not parked yet are visible
CREATE OR REPLACE FUNCTION {schema}.att_visible(qid int, max_priority int, now float8)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT (SELECT coalesce(sum(c.depth) - sum(c.hot), 0) FROM {schema}.counts c
            WHERE c.queue_id = qid)
         - (SELECT count(*) FROM generate_series(0, max_priority) AS p(prio)
            CROSS JOIN LATERAL (SELECT 1 FROM {schema}.messages m
                WHERE m.queue_id = qid AND NOT m.blocked AND m.priority = p.prio
                  AND m.avail_at > now) w)
         + (SELECT count(*) FROM {schema}.leases l
            CROSS JOIN LATERAL unnest(l.ids) AS x(mid)
            JOIN {schema}.messages m ON m.queue_id = qid AND m.id = x.mid
                 AND m.lease = l.token AND m.avail_at < m.until
            WHERE l.queue_id = qid AND l.until <= now)
$$;

-- CREATE OR REPLACE drops a function's settings: those of migration 1, and no sequential
-- scan where a leased row is updated through its ctid (a planner that believes the table
-- empty would otherwise scan it whole instead of a TID scan)
ALTER FUNCTION {schema}.receive(text, float8, int, float8)
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {schema}.ack_batch(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.extend(text, float8, bigint[], bigint[], float8)
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {schema}.release(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {schema}.park({schema}.queues, float8, bool)
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.next_due(text[], float8) SET enable_bitmapscan = off SET jit = off;
