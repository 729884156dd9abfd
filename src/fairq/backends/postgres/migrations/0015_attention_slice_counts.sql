-- fairq on PostgreSQL, migration 15: a slice's acks count in the slice's own row only.
-- Since migration 12 each batch of a slice's acks (attention.progress) also added to its
-- key's processed, in the ack's transaction, which commits with the full WAL flush: the
-- key's row stayed locked until the flush was done, so the acks of a key's concurrent
-- slices queued on that one row (and so did takes and ends of the key, holding the
-- domain's row meanwhile). A tenant whose share runs as many slices of one key lost the
-- most to that wait: with 8 slices at once, weight 2 handled 1.6-1.7x the messages of
-- weight 1 in its 2x of the worker time (Redis: 2.0x). Now the acks add to the slice's
-- `counted` alone (one row per slice, which only that slice's acks and its end touch); the
-- slice's end — or the sweep, once its token expired — adds to the key and the domain in
-- one step, and key_stats adds the running slices' counted to their key's processed. The
-- acks of a slice that has ended already (its token expired) still count for the key and
-- the domain at once (att_count).

-- slices running while this migration runs counted their acks so far in their key's row
-- too (migration 12); their end now adds what they handled to the key, and key_stats adds
-- running slices' counted to it: take those acks out of the key's row, or they would
-- count twice. (Processes of the older version still running count in the key's row as
-- before: stop them before the upgrade, docs/postgres.md.)
UPDATE {schema}.att_keys k SET processed = k.processed - l.counted
FROM (SELECT domain_id, key, sum(counted) AS counted FROM {schema}.att_slices
      GROUP BY domain_id, key) l
WHERE l.domain_id = k.domain_id AND l.key = k.key AND l.counted <> 0;

-- n acked messages of slice tok (of key k in domain dname) counted: in the slice's row while
-- it runs; when it has ended already, for the key and the domain now (the domain's row
-- locked first, as takes and ends lock it before a key's)
CREATE OR REPLACE FUNCTION {schema}.att_count(dname text, tok text, k text, n int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE dom int;
BEGIN
    IF n <= 0 THEN
        RETURN;
    END IF;
    UPDATE {schema}.att_slices SET counted = counted + n WHERE token = tok;
    IF FOUND THEN
        RETURN;
    END IF;
    UPDATE {schema}.att_domains SET processed = processed + n WHERE name = dname
    RETURNING id INTO dom;
    IF FOUND THEN
        UPDATE {schema}.att_keys SET processed = processed + n
        WHERE domain_id = dom AND key = k;
    END IF;
END $$;

-- the end of a slice (migration 12's), with the key counted here: what it handled, or, for
-- an expired slice, what its acks counted on the way
CREATE OR REPLACE FUNCTION {schema}.att_end_slice(
    dom int, tok text, handled int, retry_at float8, now float8, expired bool,
    OUT live bool, OUT woke bool, OUT dues float8[]
) LANGUAGE plpgsql AS $$
DECLARE
    s record; k record; cfg jsonb; p jsonb;
    held float8; cost float8; seen bool;
    n_visible int; n_waiting float8; n_active int; n_pending int; b_since float8;
    at_due float8; counter text; n_counted int;
BEGIN
    live := false; woke := false; dues := ARRAY[]::float8[];
    SELECT l.key, l.tenant, l.charged, l.taken_at, l.counted, x.estimate AS t_est,
           d.estimate AS d_est, d.config
    INTO s
    FROM {schema}.att_slices l JOIN {schema}.att_domains d ON d.id = l.domain_id
    LEFT JOIN {schema}.att_tenants x ON x.domain_id = l.domain_id AND x.tenant = l.tenant
    WHERE l.token = tok AND l.domain_id = dom
    FOR UPDATE OF l;  -- its counted is final: a concurrent progress waits, then finds it gone
    seen := FOUND;
    IF NOT seen THEN  -- expired and ended by the sweep, with what it had counted
        RETURN;
    END IF;
    -- the domain and the key count every message once: what an expired slice counted on
    -- the way, else all it handled
    IF expired THEN
        n_counted := s.counted;
    ELSE
        n_counted := handled;
    END IF;
    IF n_counted <> 0 THEN
        UPDATE {schema}.att_domains SET processed = processed + n_counted WHERE id = dom;
    END IF;
    -- the key's count too: the slice's acks counted on the way only in its row
    IF NOT expired THEN
        n_counted := greatest(handled, s.counted);
    END IF;
    -- the key's lock first, as a publish takes it
    SELECT kk.key, kk.queue, kk.tenant, kk.plan, kk.state, kk.pending, kk.active,
           kk.backlog_since
    INTO k FROM {schema}.att_keys kk WHERE kk.domain_id = dom AND kk.key = s.key FOR UPDATE;
    seen := FOUND;
    DELETE FROM {schema}.att_slices WHERE token = tok;
    IF NOT seen OR NOT FOUND THEN
        live := seen;
        RETURN;
    END IF;
    live := true;
    cfg := s.config;
    p := {schema}.att_plan(cfg, k.plan);
    IF s.tenant IS NOT NULL AND s.taken_at IS NOT NULL AND NOT expired THEN
        held := now - s.taken_at;
        -- slice_cost: seconds held (charge = 'time'), or messages handled
        IF coalesce(cfg ->> 'charge', 'time') = 'messages' THEN
            cost := greatest(0, handled)::float8;
        ELSE
            cost := greatest(0::float8, held);
        END IF;
        -- att_charge's three writes, but on_end on the tenant's vt as the policy computes
        -- it, (vt - charged) + cost / weight: att_charge's vt + ((0 - charged) + cost /
        -- weight) can differ in the last bit, and an equal vt is a tie the turn breaks
        UPDATE {schema}.att_tenants x
        SET vt = (x.vt - s.charged) + cost / coalesce((p ->> 'weight')::float8, 1),
            estimate = {schema}.att_next_estimate(s.t_est, cost)
        WHERE x.domain_id = dom AND x.tenant = s.tenant;
        UPDATE {schema}.att_domains SET estimate = {schema}.att_next_estimate(s.d_est, cost)
        WHERE id = dom;
        INSERT INTO {schema}.att_usage AS u (domain_id, bucket, tenant, busy, slices, messages)
        VALUES (dom, floor(now / 5::float8)::bigint, s.tenant, greatest(0::float8, held), 1,
                handled)                                            -- usage_bucket
        ON CONFLICT (domain_id, bucket, tenant) DO UPDATE SET busy = u.busy + excluded.busy,
            slices = u.slices + 1, messages = u.messages + excluded.messages;
    END IF;
    n_active := k.active - 1;
    n_pending := k.pending;
    b_since := k.backlog_since;
    SELECT v.visible, v.waiting_due INTO n_visible, n_waiting
    FROM {schema}.att_view(k.queue, now, (p ->> 'max_messages')::int + 1) v;
    n_visible := coalesce(n_visible, 0);
    IF n_visible > 0 THEN
        n_waiting := NULL;
    END IF;
    -- on_slice_end
    IF k.state NOT IN ('disabled', 'removed', 'paused', 'maintenance')
       AND n_pending + n_active < (p ->> 'max_concurrency')::int THEN
        IF retry_at IS NOT NULL AND n_visible > 0 THEN
            at_due := retry_at; counter := 'rate_limited';
        ELSIF n_visible > 0 THEN
            at_due := now; counter := 'republished';
        ELSIF n_waiting IS NOT NULL AND n_pending = 0 AND n_active = 0 THEN
            at_due := n_waiting; counter := 'republished';
        END IF;
    END IF;
    IF at_due IS NOT NULL THEN
        IF counter = 'rate_limited' THEN
            UPDATE {schema}.att_domains SET rate_limited = rate_limited + 1 WHERE id = dom;
        ELSE
            UPDATE {schema}.att_domains SET republished = republished + 1 WHERE id = dom;
        END IF;
        IF NOT {schema}.att_signal(dom, k.tenant, k.key, at_due, now) THEN
            dues := dues || at_due;
        END IF;
        n_pending := n_pending + 1;
        woke := true;
    END IF;
    -- note_backlog: when the key's backlog started; its clear time when it ends
    IF n_visible > 0 OR n_waiting IS NOT NULL THEN
        b_since := coalesce(b_since, now);
    ELSIF b_since IS NOT NULL THEN
        UPDATE {schema}.att_domains SET clear_sum = clear_sum + (now - b_since),
            clear_count = clear_count + 1 WHERE id = dom;
        b_since := NULL;
    END IF;
    UPDATE {schema}.att_keys SET pending = n_pending, active = n_active, backlog_since = b_since,
        processed = processed + n_counted
    WHERE domain_id = dom AND key = k.key;
END $$;
