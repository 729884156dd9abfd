-- fairq on PostgreSQL, migration 12: a slice counts its acked messages as it goes. The
-- worker acks a slice's handled messages in batches while the slice runs; each batch now
-- also adds what it acked to the key's processed and to the slice's `counted`, in one
-- transaction (attention.progress). Before, processed was written only by the slice's end,
-- so a worker killed mid-slice (kill -9) left everything its slice had handled and acked
-- out of processed for ever. att_end_slice now counts, for the key, only what the slice
-- did not count on the way, and for the domain all it handled; a slice whose token
-- expired adds its `counted` to the domain's processed, and the late end of such a slice
-- counts nothing (before, it added to the domain's count but not its key's).

ALTER TABLE {schema}.att_slices ADD COLUMN IF NOT EXISTS counted int NOT NULL DEFAULT 0;

-- the end of the slice of token tok in domain dom, whose row the caller holds locked
-- (attention_policy, rule 3 (f)): count what it handled, charge its tenant the real cost
-- (a slice that expired keeps its estimate: its cost is unknown), free its token, re-signal
-- its key as on_slice_end says (retry_at: when its bucket allows more), keep the key's
-- backlog_since and the domain's clear time. live: there was such a slice of this domain;
-- woke: a signal was written (the caller sends the domain's wake-up); dues: the due times of
-- the delayed signals written. Locks the key's row before any tenant row, as a publish does.
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
    -- the domain counts every message once: what an expired slice counted on the way, else
    -- all it handled; its key has the counted ones already
    IF expired THEN
        n_counted := s.counted;
    ELSE
        n_counted := handled;
    END IF;
    IF n_counted <> 0 THEN
        UPDATE {schema}.att_domains SET processed = processed + n_counted WHERE id = dom;
    END IF;
    IF expired THEN
        n_counted := 0;
    ELSE
        n_counted := greatest(0, handled - s.counted);  -- what the key has not counted yet
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
