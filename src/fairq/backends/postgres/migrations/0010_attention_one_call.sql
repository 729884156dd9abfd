-- fairq on PostgreSQL, migration 10: a slice's end as one statement. Before, an end was a
-- transaction of about ten statements sent one by one from Python, all of them under the
-- lock of the domain's row (taken first, by att_begin): under load the takes and ends of a
-- domain queued behind sessions idle in transaction, waiting for the client's next
-- statement. att_end is the whole end in one call, so the row is held for the server's
-- time alone. The decision it needs, attention_policy.on_slice_end (and the arithmetic of
-- slice_cost, on_end, next_estimate, usage_bucket), is mirrored here as Redis mirrors it in
-- scripts/lib/attention.lua; tests/postgres/test_attention_plpgsql.py runs the same
-- histories on the memory backend (the Python reference) and here, and compares.

-- attention_policy.plan_of: the key's plan, else the domain's default one
CREATE FUNCTION {schema}.att_plan(cfg jsonb, plan text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(cfg -> 'plans' -> plan, cfg -> 'plans' -> (cfg ->> 'default_plan'))
$$;

-- attention_policy.next_estimate (ESTIMATE_WEIGHT = 0.2)
CREATE FUNCTION {schema}.att_next_estimate(old float8, cost float8) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN old IS NULL THEN cost ELSE old + 0.2::float8 * (cost - old) END
$$;

-- the end of the slice of token tok in domain dom, whose row the caller holds locked
-- (attention_policy, rule 3 (f)): count what it handled, charge its tenant the real cost
-- (a slice that expired keeps its estimate: its cost is unknown), free its token, re-signal
-- its key as on_slice_end says (retry_at: when its bucket allows more), keep the key's
-- backlog_since and the domain's clear time. live: there was such a slice of this domain;
-- woke: a signal was written (the caller sends the domain's wake-up); dues: the due times of
-- the delayed signals written. Locks the key's row before any tenant row, as a publish does.
CREATE FUNCTION {schema}.att_end_slice(
    dom int, tok text, handled int, retry_at float8, now float8, expired bool,
    OUT live bool, OUT woke bool, OUT dues float8[]
) LANGUAGE plpgsql AS $$
DECLARE
    s record; k record; cfg jsonb; p jsonb;
    held float8; cost float8; seen bool;
    n_visible int; n_waiting float8; n_active int; n_pending int; b_since float8;
    at_due float8; counter text; sig bigint;
BEGIN
    live := false; woke := false; dues := ARRAY[]::float8[];
    SELECT l.key, l.tenant, l.charged, l.taken_at, x.estimate AS t_est, d.estimate AS d_est,
           d.config
    INTO s
    FROM {schema}.att_slices l JOIN {schema}.att_domains d ON d.id = l.domain_id
    LEFT JOIN {schema}.att_tenants x ON x.domain_id = l.domain_id AND x.tenant = l.tenant
    WHERE l.token = tok AND l.domain_id = dom;
    seen := FOUND;
    IF handled <> 0 THEN
        UPDATE {schema}.att_domains SET processed = processed + handled WHERE id = dom;
    END IF;
    IF NOT seen THEN
        RETURN;
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
        PERFORM {schema}.att_charge(
            dom, s.tenant,
            (0::float8 - s.charged) + cost / coalesce((p ->> 'weight')::float8, 1),  -- on_end
            {schema}.att_next_estimate(s.t_est, cost),
            {schema}.att_next_estimate(s.d_est, cost),
            floor(now / 5::float8)::bigint,                                       -- usage_bucket
            greatest(0::float8, held), handled);
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
        -- a signal at the tail of the key's tenant, or delayed until due
        INSERT INTO {schema}.att_signals (domain_id, tenant, key, due, ready)
        VALUES (dom, k.tenant, k.key, at_due, at_due <= now) RETURNING id INTO sig;
        n_pending := n_pending + 1;
        IF at_due <= now THEN
            PERFORM {schema}.att_ready(dom, k.tenant, sig, 1);
        ELSE
            dues := dues || at_due;
        END IF;
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
        processed = processed + handled
    WHERE domain_id = dom AND key = k.key;
END $$;

-- a slice's end as ONE statement: the domain's row locked and swept (att_begin: due
-- signals join their tenants, expired slices end), then att_end_slice. No row if there is
-- no such domain; else live (the slice was live: false if it had expired and was ended
-- without its charge), woke and dues as att_end_slice's, over the expired slices too.
-- flush = false: the commit does not wait for the WAL flush (slice tokens are leases).
CREATE FUNCTION {schema}.att_end(dname text, tok text, handled int, retry_at float8,
                                 now float8, flush bool)
RETURNS TABLE (live bool, woke bool, dues float8[]) LANGUAGE plpgsql AS $$
DECLARE d record; r record; x text; any_woke bool := false; all_dues float8[] := '{}';
BEGIN
    SELECT b.id, b.expired INTO d FROM {schema}.att_begin(dname, now, flush) b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOREACH x IN ARRAY d.expired LOOP
        SELECT * INTO r FROM {schema}.att_end_slice(d.id, x, 0, NULL, now, true);
        any_woke := any_woke OR r.woke;
        all_dues := all_dues || r.dues;
    END LOOP;
    SELECT * INTO r FROM {schema}.att_end_slice(d.id, tok, handled, retry_at, now, false);
    any_woke := any_woke OR r.woke;
    all_dues := all_dues || r.dues;
    IF any_woke THEN
        PERFORM {schema}.wake('a:' || dname);
    END IF;
    RETURN QUERY SELECT r.live, any_woke, all_dues;
END $$;
