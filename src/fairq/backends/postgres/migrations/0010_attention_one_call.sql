-- fairq on PostgreSQL, migration 10: a slice's take and its end as one statement each.
-- Before, an end was a transaction of about ten statements sent one by one from Python, a
-- take of three (and its BEGIN and COMMIT), all under the lock of the domain's row (taken
-- first, by att_begin): under load the takes and ends of a domain queued behind sessions
-- idle in transaction, waiting for the client's next statement. att_take and att_end do
-- the whole step in one call, so the row is held for the server's time alone. The
-- decisions they need — attention_policy.on_signal and on_slice_end, with the arithmetic
-- of refill, next_permit, estimate, on_take, slice_cost, on_end, next_estimate and
-- usage_bucket — are mirrored here as Redis mirrors them in scripts/lib/attention.lua;
-- tests/postgres/test_attention_plpgsql.py runs the same histories on the memory backend
-- (the Python reference) and here, and compares.

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

-- a signal for key k of tenant ten: at the tail of the tenant now (due <= now: ready,
-- att_ready), or delayed until due. Returns whether it is ready.
CREATE FUNCTION {schema}.att_signal(dom int, ten text, k text, due float8, now float8)
RETURNS bool LANGUAGE plpgsql AS $$
DECLARE sig bigint;
BEGIN
    INSERT INTO {schema}.att_signals (domain_id, tenant, key, due, ready)
    VALUES (dom, ten, k, due, due <= now) RETURNING id INTO sig;
    IF due <= now THEN
        PERFORM {schema}.att_ready(dom, ten, sig, 1);
        RETURN true;
    END IF;
    RETURN false;
END $$;

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
    at_due float8; counter text;
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

-- attention_policy.next_permit: when the bucket (now holding `tokens`) holds half a
-- worthwhile slice again, in whole messages; PERMIT_MARGIN (1 µs) past the exact refill
CREATE FUNCTION {schema}.att_next_permit(tokens float8, now float8, p jsonb) RETURNS float8
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE rate float8 := (p ->> 'rate')::float8; want float8; permit float8;
BEGIN
    want := greatest(1::float8, least(
        coalesce((p ->> 'burst')::float8, greatest(1::float8, rate)),
        (p ->> 'max_messages')::float8));
    permit := greatest(1::float8, ceil(want / 2::float8));
    IF tokens >= permit THEN
        RETURN now;
    END IF;
    RETURN now + (permit - tokens) / rate + 1e-6::float8;
END $$;

-- a take as ONE statement: the domain's row locked and swept (att_begin; expired slices
-- end through att_end_slice), then signals taken (att_pick) and decided until one yields a
-- slice (at most 256): attention_policy.on_signal (rule 3, steps (a)-(d)) with refill,
-- next_permit, estimate and on_take, mirrored here; the decision written by att_decided.
-- tok: the token the slice gets. Returns no row if there is no such domain; else key,
-- queue and plan (the plan's JSON) of the slice taken (NULL: none), woke (a signal was
-- written, the wake-up is noted) and dues (the delayed signals written).
CREATE FUNCTION {schema}.att_take(dname text, now float8, flush bool, tok text)
RETURNS TABLE (s_key text, s_queue text, s_plan jsonb, woke bool, dues float8[])
LANGUAGE plpgsql AS $$
DECLARE
    d record; r record; e record; x text; cfg jsonb; p jsonb; cap int;
    any_woke bool := false; all_dues float8[] := '{}';
    maxc int; maxm int; rate float8; bucket float8;
    pending int; active int; visible int; waiting float8; tokens float8; tokens_at float8;
    is_parked bool; since float8; action text; resignal float8; fan_out bool;
    charged float8; new_clock float8; got text;
BEGIN
    SELECT b.id, b.config, b.expired INTO d FROM {schema}.att_begin(dname, now, flush) b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOREACH x IN ARRAY d.expired LOOP
        SELECT * INTO e FROM {schema}.att_end_slice(d.id, x, 0, NULL, now, true);
        any_woke := any_woke OR e.woke;
        all_dues := all_dues || e.dues;
    END LOOP;
    cfg := d.config;
    SELECT max((v ->> 'max_messages')::int) + 1 INTO cap FROM jsonb_each(cfg -> 'plans') j(n, v);
    FOR i IN 1..256 LOOP
        SELECT * INTO r FROM {schema}.att_pick(d.id, now, cap);
        IF NOT FOUND THEN
            EXIT;
        END IF;
        IF r.k_queue IS NULL THEN  -- the key is gone: the signal is spent, the turn too
            PERFORM {schema}.att_served(d.id, r.tenant, NULL, 0);
            CONTINUE;
        END IF;
        p := {schema}.att_plan(cfg, r.k_plan);
        maxc := (p ->> 'max_concurrency')::int;
        maxm := (p ->> 'max_messages')::int;
        rate := (p ->> 'rate')::float8;
        pending := r.k_pending - 1;  -- without the signal being decided
        active := r.k_active;
        is_parked := r.k_parked;
        since := r.k_backlog_since;
        tokens_at := r.k_tokens_at;
        visible := coalesce(r.visible, 0);
        waiting := CASE WHEN visible > 0 THEN NULL ELSE r.waiting_due END;
        -- refill: the bucket's level now (infinite without a rate)
        tokens := coalesce(r.k_tokens, 'Infinity'::float8);
        IF rate IS NULL THEN
            tokens := 'Infinity'::float8;
        ELSE
            bucket := coalesce((p ->> 'burst')::float8, greatest(1::float8, rate));
            tokens := least(bucket, tokens + greatest(0::float8, now - tokens_at) * rate);
        END IF;
        -- on_signal
        resignal := NULL; fan_out := false; charged := 0; new_clock := NULL; got := NULL;
        IF r.k_state IN ('disabled', 'removed') THEN
            action := 'drop';
        ELSIF r.k_state IN ('paused', 'maintenance') THEN
            action := 'park';
        ELSIF active >= maxc THEN
            action := 'block';
            IF pending + active < maxc THEN
                resignal := now;
            END IF;
        ELSIF visible = 0 THEN
            action := 'empty';
            IF waiting IS NOT NULL AND pending = 0 AND active = 0 THEN
                resignal := waiting;
            END IF;
        ELSIF tokens < 1 THEN
            action := 'rate_limited';
            resignal := {schema}.att_next_permit(tokens, now, p);
        ELSE
            action := 'slice';
            fan_out := visible > maxm AND pending + active + 1 < maxc AND tokens >= maxm + 1;
        END IF;
        -- what it does (attention._take_signal before this migration)
        IF action = 'drop' THEN
            UPDATE {schema}.att_domains SET discarded = jsonb_set(discarded,
                ARRAY[r.k_state], to_jsonb(coalesce((discarded ->> r.k_state)::bigint, 0) + 1))
            WHERE id = d.id;
        ELSIF action = 'park' THEN
            is_parked := true;
            UPDATE {schema}.att_domains SET parked = parked + 1 WHERE id = d.id;
        ELSIF action = 'block' THEN
            UPDATE {schema}.att_domains SET blocked = blocked + 1 WHERE id = d.id;
        ELSIF action = 'empty' THEN
            UPDATE {schema}.att_domains SET empty = empty + 1 WHERE id = d.id;
            IF resignal IS NULL THEN  -- note_backlog
                IF waiting IS NOT NULL THEN
                    since := coalesce(since, now);
                ELSIF since IS NOT NULL THEN
                    UPDATE {schema}.att_domains SET clear_sum = clear_sum + (now - since),
                        clear_count = clear_count + 1 WHERE id = d.id;
                    since := NULL;
                END IF;
            END IF;
        ELSIF action = 'rate_limited' THEN
            UPDATE {schema}.att_domains SET rate_limited = rate_limited + 1 WHERE id = d.id;
            tokens_at := now;
        END IF;
        IF resignal IS NOT NULL THEN
            IF NOT {schema}.att_signal(d.id, r.k_tenant, r.key, resignal, now) THEN
                all_dues := all_dues || resignal;
            END IF;
            pending := pending + 1;
            any_woke := true;
        END IF;
        IF action = 'slice' THEN
            -- on_take, with estimate: the tenant's own, else the domain's, else nothing
            charged := coalesce(r.estimate, r.domain_estimate, 0::float8)
                       / coalesce((p ->> 'weight')::float8, 1);
            new_clock := greatest(r.clock, r.vt);
            active := active + 1;
            tokens_at := now;
            IF fan_out THEN
                PERFORM {schema}.att_signal(d.id, r.k_tenant, r.key, now, now);
                pending := pending + 1;
                any_woke := true;
            END IF;
            got := tok;
        END IF;
        IF action NOT IN ('slice', 'rate_limited') THEN
            tokens := coalesce(r.k_tokens, 'Infinity'::float8);  -- the row's, unchanged
        END IF;
        PERFORM {schema}.att_decided(d.id, r.tenant, new_clock, charged, got,
            now + coalesce((cfg ->> 'slice_lease')::float8, 30), now, r.key, r.k_tenant,
            r.k_plan, r.k_state, is_parked, pending, active,
            CASE WHEN tokens = 'Infinity'::float8 THEN NULL ELSE tokens END, tokens_at, since);
        IF got IS NOT NULL THEN
            IF any_woke THEN
                PERFORM {schema}.wake('a:' || dname);
            END IF;
            RETURN QUERY SELECT r.key, r.k_queue, p, any_woke, all_dues;
            RETURN;
        END IF;
    END LOOP;
    IF any_woke THEN
        PERFORM {schema}.wake('a:' || dname);
    END IF;
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::jsonb, any_woke, all_dues;
END $$;

-- the sweep (replacing migration 8's): a delayed signal that came due joins the TAIL of its
-- tenant's ready signals, as on the memory backend and Redis — it gets a new id, which is
-- the ready signals' order (att_pick takes the smallest) — in the order they came due;
-- the tenant's `since` (its tie-break, att_ready) stays the signal's first id, as the
-- reference's sequence number of the signal that made the tenant ready. Before, a due
-- signal kept its id and went ahead of the tenant's signals made ready after it was
-- written. Returns the tokens of slices whose lease ran out, for the caller to end.
CREATE OR REPLACE FUNCTION {schema}.att_sweep(dom int, now float8) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    FOR r IN
        SELECT g.id, g.tenant FROM {schema}.att_signals g
        WHERE g.domain_id = dom AND NOT g.ready AND g.due <= now
        ORDER BY g.due, g.id FOR UPDATE
    LOOP
        UPDATE {schema}.att_signals
        SET ready = true, id = nextval(pg_get_serial_sequence('{schema}.att_signals', 'id'))
        WHERE id = r.id;
        PERFORM {schema}.att_ready(dom, r.tenant, r.id, 1);
    END LOOP;
    RETURN QUERY SELECT l.token FROM {schema}.att_slices l
        WHERE l.domain_id = dom AND l.lease_until <= now ORDER BY l.lease_until;
END $$;
