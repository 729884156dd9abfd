-- fairq on PostgreSQL, migration 13: a stale receipt is lost even beside the current one
-- of the same message. ack_batch, extend and release told the receipts they did not act on
-- by message id alone, so a call carrying a message's expired receipt and its current one
-- (a worker's timed-out handler and the redelivered one finishing in the same pass, whose
-- acks go as one call) acted once, through the current lease, and reported both as done:
-- the stale one was never LeaseLost. They now compare (id, lease) pairs.

-- the 1-based positions of the receipts (ids[i], leases[i]) not among the pairs done; with
-- hash joins on (the callers turn them off for their own statements), or 5,000 receipts
-- took a second of nested loops
CREATE OR REPLACE FUNCTION {schema}.not_done(ids bigint[], leases bigint[], done bigint[],
                                             done_l bigint[])
RETURNS int[] LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(r.i::int ORDER BY r.i), '{}')
    FROM unnest(ids, leases) WITH ORDINALITY AS r(id, l, i)
    WHERE NOT EXISTS (SELECT 1 FROM unnest(done, done_l) AS d(id, l)
                      WHERE d.id = r.id AND d.l = r.l)
$$;
ALTER FUNCTION {schema}.not_done(bigint[], bigint[], bigint[], bigint[])
    SET enable_hashjoin = on SET enable_mergejoin = on;

CREATE OR REPLACE FUNCTION {schema}.ack_batch(qname text, now float8, ids bigint[],
                                              leases bigint[],
                                              OUT lost int[], OUT woke bool)
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues;
    done bigint[];
    done_l bigint[];  -- the lease of each of done
    k int;
    hot int;
BEGIN
    SELECT * INTO q FROM {schema}.queues x WHERE x.name = qname;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ404', MESSAGE = qname;
    END IF;
    woke := false;
    IF q.fifo THEN
        SELECT array_agg(c.id), array_agg(c.lease) INTO done, done_l FROM (
            SELECT m.id, m.lease FROM {schema}.messages m JOIN unnest(ids, leases) AS u(id, l)
                ON m.id = u.id AND m.lease = u.l
            WHERE m.queue_id = q.id AND m.until > now FOR UPDATE OF m) c;
        done := coalesce(done, '{}');
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
        ) SELECT array_agg(g.id), array_agg(g.lease), count(*) FILTER (WHERE g.hot)
          INTO done, done_l, hot FROM gone g;
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
        lost := {schema}.not_done(ids, leases, done, done_l);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION {schema}.extend(
    qname text, now float8, ids bigint[], leases bigint[], seconds float8
) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
    done_l bigint[];
    hot int;
BEGIN
    WITH cur AS (
        SELECT m.ctid AS t, m.lease AS l, m.avail_at < m.until AS hot FROM {schema}.messages m
        JOIN unnest(ids, leases) AS x(id, l) ON m.id = x.id AND m.lease = x.l
        WHERE m.queue_id = q.id AND m.until > now FOR UPDATE OF m
    ), u AS (
        UPDATE {schema}.messages m SET avail_at = now + seconds, until = now + seconds
        FROM cur WHERE m.ctid = cur.t
        RETURNING m.id, cur.l, cur.hot
    ) SELECT array_agg(u.id), array_agg(u.l), count(*) FILTER (WHERE u.hot)
      INTO done, done_l, hot FROM u;
    PERFORM {schema}.bump_hot(q.id, -hot);
    IF cardinality(done) = cardinality(ids) THEN  -- all of them: nothing to look for
        RETURN '{}';
    END IF;
    RETURN {schema}.not_done(ids, leases, done, done_l);
END $$;

CREATE OR REPLACE FUNCTION {schema}.release(qname text, now float8, ids bigint[],
                                            leases bigint[])
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    done bigint[];
    done_l bigint[];
    hot int;
BEGIN
    WITH cur AS (
        SELECT m.ctid AS t, m.lease AS l, m.avail_at < m.until AS hot FROM {schema}.messages m
        JOIN unnest(ids, leases) AS x(id, l) ON m.id = x.id AND m.lease = x.l
        WHERE m.queue_id = q.id AND m.until > now FOR UPDATE OF m
    ), u AS (
        UPDATE {schema}.messages m
        SET avail_at = now, lease = NULL, until = NULL, attempt = m.attempt - 1, final = false
        FROM cur WHERE m.ctid = cur.t
        RETURNING m.id, cur.l, cur.hot
    ) SELECT array_agg(u.id), array_agg(u.l), count(*) FILTER (WHERE u.hot)
      INTO done, done_l, hot FROM u;
    IF done IS NOT NULL THEN
        PERFORM {schema}.bump_hot(q.id, -hot);
        PERFORM {schema}.wake('q:' || q.name);
    END IF;
    IF cardinality(done) = cardinality(ids) THEN  -- all of them: nothing to look for
        RETURN '{}';
    END IF;
    RETURN {schema}.not_done(ids, leases, done, done_l);
END $$;

-- CREATE OR REPLACE drops a function's settings: those of migration 9 again
ALTER FUNCTION {schema}.ack_batch(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
ALTER FUNCTION {schema}.extend(text, float8, bigint[], bigint[], float8)
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {schema}.release(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET enable_seqscan = off SET jit = off;
