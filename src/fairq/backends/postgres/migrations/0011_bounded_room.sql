-- fairq on PostgreSQL, migration 11: a bounded queue's room counts no message whose last
-- lease has run out. Such a message is leaving for the dead-letter queue (max_attempts),
-- but until a receive or stats moved it, make_room counted it in the queue's depth: a
-- send to a full queue was refused (or, with overflow=block, waited its whole timeout)
-- for a message that was already gone, and drop_oldest dead-lettered it with reason
-- "overflow" instead of "max_attempts". make_room now first parks the queue's hot leases
-- that ran out and moves the exhausted ones, as a receive does.

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
    -- leases that ran out: parked (a hot one), and those at their last attempt moved to
    -- the dead-letter queue, before they are counted as taking room
    IF EXISTS (SELECT 1 FROM {schema}.leases l WHERE l.queue_id = q.id AND l.until <= now) THEN
        PERFORM {schema}.park(q, now);
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.messages m WHERE m.final AND m.avail_at <= now) THEN
        PERFORM {schema}.sweep_final(now);
    END IF;
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
        WHERE m.queue_id = q.id AND NOT m.final
          AND (m.blocked OR (m.avail_at <= now AND (m.lease IS NULL OR m.until <= now)))
        ORDER BY m.id LIMIT need FOR UPDATE SKIP LOCKED);
    IF cardinality(victims) < need THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ429', MESSAGE = q.name,
            DETAIL = json_build_object('max_length', q.max_length, 'overflow', 'drop_oldest',
                                       'detail', 'no visible message can be dropped')::text;
    END IF;
    PERFORM {schema}.dead_letter_rows(q, victims, 'overflow', NULL, now);
END $$;
