-- fairq on PostgreSQL, migration 14: a nack may say why the attempt failed. When the nack
-- dead-letters the message (its last allowed attempt), that text becomes the dead letter's
-- fairq.detail, as a rejection's reason does (a Worker passes its handler's exception).
-- The five-argument nack of migration 9 stays for callers that give no reason, and runs
-- this one.

CREATE OR REPLACE FUNCTION {schema}.nack(qname text, now float8, mid bigint, tok bigint,
                                         delay float8, detail text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queues := {schema}.queue(qname);
    r {schema}.messages := {schema}.current_lease(q, mid, tok, now);
BEGIN
    PERFORM {schema}.bump(q.id, nacked => 1);
    IF q.max_attempts IS NOT NULL AND r.attempt >= q.max_attempts THEN
        PERFORM {schema}.dead_letter_rows(q, ARRAY[mid], 'max_attempts', detail, now);
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

CREATE OR REPLACE FUNCTION {schema}.nack(qname text, now float8, mid bigint, tok bigint,
                                         delay float8)
RETURNS void LANGUAGE sql AS $$
    SELECT {schema}.nack(qname, now, mid, tok, delay, NULL::text)
$$;
