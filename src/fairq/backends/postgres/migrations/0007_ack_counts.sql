-- fairq on PostgreSQL, migration 7: an ack of a plain (not FIFO) queue counts its messages
-- in ONE upsert of its counters row (depth down and acked up together; migration 1 made
-- two, one row update more per ack statement on the hot path).

CREATE OR REPLACE FUNCTION {schema}.ack(qname text, now float8, ids bigint[], leases bigint[])
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
        PERFORM count(*) FROM {schema}.remove(q, done);  -- counts depth, moves FIFO heads
        k := cardinality(done);
        IF k > 0 THEN
            PERFORM {schema}.bump(q.id, acked => k);
        END IF;
    ELSE
        WITH gone AS (
            DELETE FROM {schema}.messages m USING unnest(ids, leases) AS u(id, l)
            WHERE m.queue_id = q.id AND m.id = u.id AND m.lease = u.l AND m.avail_at > now
            RETURNING m.id
        ) SELECT array_agg(gone.id) INTO done FROM gone;
        k := coalesce(cardinality(done), 0);
        IF k > 0 THEN
            PERFORM {schema}.bump(q.id, depth => -k, acked => k);
        END IF;
    END IF;
    IF k > 0 AND q.max_length IS NOT NULL THEN
        PERFORM {schema}.wake('q:' || q.name);  -- a blocked sender may fit now
    END IF;
    IF k = cardinality(ids) THEN
        RETURN '{}';
    END IF;
    RETURN ARRAY(SELECT i FROM generate_subscripts(ids, 1) i
                 WHERE done IS NULL OR NOT (ids[i] = ANY (done)));
END $$;

-- CREATE OR REPLACE drops the function's settings: the same as migration 1 gave it
ALTER FUNCTION {schema}.ack(text, float8, bigint[], bigint[])
    SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET jit = off;
