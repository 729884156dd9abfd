-- fairq on PostgreSQL, migration 8: attention scheduled in worker time (SPEC §5 rule 4,
-- attention_policy's scheduler: start-time fair queueing over tenants in virtual time).
-- Per domain a virtual clock and a slice-cost estimate, per tenant its virtual time and
-- estimate, per running slice the tenant it charged, how much, and when it was taken; the
-- tenants' usage over the last minute in 5 s buckets. The decisions stay in Python
-- (attention_policy); the functions below are the scheduler's steps as one statement each.

ALTER TABLE {schema}.att_domains
    ADD COLUMN vclock   float8 NOT NULL DEFAULT 0,  -- virtual time last served (SFQ's clock)
    ADD COLUMN estimate float8;                     -- what a slice costs here; NULL: unknown
ALTER TABLE {schema}.att_tenants
    ADD COLUMN vt       float8 NOT NULL DEFAULT 0,  -- cost used, over the plans' weights
    ADD COLUMN estimate float8;                     -- what its slice costs; NULL: unknown
ALTER TABLE {schema}.att_slices
    ADD COLUMN tenant   text,                       -- the tenant charged at take
    ADD COLUMN charged  float8 NOT NULL DEFAULT 0,  -- its estimate, corrected at the end
    ADD COLUMN taken_at float8;                     -- when it was taken (its cost in time)

-- the next tenant: the smallest (vt, turn) with a ready signal, one probe of this index
DROP INDEX {schema}.att_tenants_turn;
CREATE INDEX att_tenants_vt ON {schema}.att_tenants (domain_id, vt, turn, since)
    WHERE ready > 0;

-- each tenant's ended slices in 5 s buckets (TenantStats over the last minute); buckets
-- older than the window are deleted by tenant_stats and the reconciler
CREATE TABLE {schema}.att_usage (
    domain_id int NOT NULL,
    bucket    bigint NOT NULL,                      -- floor(time / 5 s)
    tenant    text NOT NULL,
    busy      float8 NOT NULL DEFAULT 0,            -- seconds its slices held a worker
    slices    bigint NOT NULL DEFAULT 0,
    messages  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (domain_id, bucket, tenant)
) WITH (fillfactor = 70);

-- n more ready signals for a tenant (the first of them: signal sig). A tenant that had
-- none starts at attention_policy.eligible_vt: greatest(its vt, the domain's clock), so
-- idleness earns no credit; a new tenant starts at the clock.
CREATE FUNCTION {schema}.att_ready(dom int, ten text, sig bigint, n int) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO {schema}.att_tenants AS x (domain_id, tenant, ready, since, vt)
    VALUES (dom, ten, n, sig, (SELECT d.vclock FROM {schema}.att_domains d WHERE d.id = dom))
    ON CONFLICT (domain_id, tenant) DO UPDATE SET
        ready = x.ready + excluded.ready,
        since = CASE WHEN x.ready = 0 THEN excluded.since ELSE x.since END,
        vt = CASE WHEN x.ready = 0 THEN greatest(x.vt, excluded.vt) ELSE x.vt END
$$;

-- the sweep of a take, an end, a stats call (the domain's row is locked by the caller):
-- delayed signals that came due join their tenants; returns the tokens of slices whose
-- lease ran out, for the caller to end
CREATE FUNCTION {schema}.att_sweep(dom int, now float8) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    FOR r IN
        WITH due AS (
            UPDATE {schema}.att_signals SET ready = true WHERE id IN (
                SELECT g.id FROM {schema}.att_signals g
                WHERE g.domain_id = dom AND NOT g.ready AND g.due <= now
                ORDER BY g.due FOR UPDATE)
            RETURNING id, tenant)
        SELECT tenant, min(id) AS first, count(*)::int AS n FROM due GROUP BY tenant
        ORDER BY min(id)
    LOOP
        PERFORM {schema}.att_ready(dom, r.tenant, r.first, r.n);
    END LOOP;
    RETURN QUERY SELECT l.token FROM {schema}.att_slices l
        WHERE l.domain_id = dom AND l.lease_until <= now ORDER BY l.lease_until;
END $$;

-- the scheduler's choice (attention_policy.order), for a take holding the domain's row:
-- the tenant with a ready signal and the smallest (vt, turn, since) — an index probe,
-- however many tenants and keys — and its oldest ready signal, which is deleted; then the
-- signal's key, locked, and its work queue as att_view sees it (visible counted up to
-- cap). Returns no row when no signal is ready; the key's columns are NULL if the key is
-- gone. The tenant's ready count is left as it is until att_decided (the signal still
-- counts until the take has decided, so a re-signal of the same key in between is no
-- return from idle).
CREATE FUNCTION {schema}.att_pick(dom int, now float8, cap int)
RETURNS TABLE (tenant text, vt float8, estimate float8, clock float8, domain_estimate float8,
               signal bigint, key text, k_queue text, k_tenant text, k_plan text,
               k_state text, k_parked bool, k_pending int, k_active int, k_tokens float8,
               k_tokens_at float8, k_backlog_since float8, visible int, waiting_due float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE t record; s record;
BEGIN
    LOOP
        SELECT x.tenant, x.vt, x.estimate INTO t FROM {schema}.att_tenants x
        WHERE x.domain_id = dom AND x.ready > 0 ORDER BY x.vt, x.turn, x.since LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        DELETE FROM {schema}.att_signals g WHERE g.id = (
            SELECT h.id FROM {schema}.att_signals h
            WHERE h.domain_id = dom AND h.tenant = t.tenant AND h.ready ORDER BY h.id LIMIT 1)
        RETURNING g.id, g.key INTO s;
        IF FOUND THEN
            PERFORM 1 FROM {schema}.att_keys kk
                WHERE kk.domain_id = dom AND kk.key = s.key FOR UPDATE;
            RETURN QUERY SELECT t.tenant, t.vt, t.estimate, d.vclock, d.estimate, s.id, s.key,
                kk.queue, kk.tenant, kk.plan, kk.state, kk.parked, kk.pending, kk.active,
                kk.tokens, kk.tokens_at, kk.backlog_since, v.visible, v.waiting_due
                FROM {schema}.att_domains d
                LEFT JOIN {schema}.att_keys kk ON kk.domain_id = dom AND kk.key = s.key
                LEFT JOIN LATERAL {schema}.att_view(kk.queue, now, cap) v ON kk.key IS NOT NULL
                WHERE d.id = dom;
            RETURN;
        END IF;
        -- a count out of step (a ready count with no ready signal): mend it, look again
        UPDATE {schema}.att_tenants x SET ready = 0
        WHERE x.domain_id = dom AND x.tenant = t.tenant;
    END LOOP;
END $$;

-- a take decided what the signal att_pick gave does: the tenant gets the domain's next
-- turn (equal virtual times go round robin) and, for a slice, is charged `charged` and the
-- clock moves to `clock` (attention_policy.on_take); NULL clock: no slice, no charge
CREATE FUNCTION {schema}.att_served(dom int, ten text, clock float8, charged float8)
RETURNS void LANGUAGE sql AS $$
    WITH d AS (
        UPDATE {schema}.att_domains SET turn_counter = turn_counter + 1,
            vclock = coalesce(clock, vclock)
        WHERE id = dom RETURNING turn_counter)
    UPDATE {schema}.att_tenants x SET ready = greatest(x.ready - 1, 0), turn = d.turn_counter,
        vt = x.vt + charged
    FROM d WHERE x.domain_id = dom AND x.tenant = ten
$$;

-- a take decided what the signal att_pick gave does, in one statement: the slice (if
-- tok is not NULL: its token lease, the tenant charged, the amount, when), the key's row
-- as the decision left it, and att_served
CREATE FUNCTION {schema}.att_decided(
    dom int, ten text, clock float8, charged float8, tok text, lease_until float8,
    now float8, k text, k_tenant text, k_plan text, k_state text, k_parked bool,
    k_pending int, k_active int, k_tokens float8, k_tokens_at float8, k_backlog_since float8
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO {schema}.att_slices (token, domain_id, key, lease_until, tenant, charged,
                                     taken_at)
    SELECT tok, dom, k, lease_until, ten, charged, now WHERE tok IS NOT NULL;
    UPDATE {schema}.att_keys SET tenant = k_tenant, plan = k_plan, state = k_state,
        parked = k_parked, pending = k_pending, active = k_active, tokens = k_tokens,
        tokens_at = k_tokens_at, backlog_since = k_backlog_since
    WHERE domain_id = dom AND key = k;
    SELECT {schema}.att_served(dom, ten, clock, charged);
$$;

-- a slice ended (the domain's row locked by the caller): its real cost replaces what was
-- charged at take (vt moves by `delta`, attention_policy.on_end), the estimates become
-- next_estimate's (computed by the caller from what att_pick and the slice row said), and
-- the usage history counts the slice in bucket `bucket`
CREATE FUNCTION {schema}.att_charge(
    dom int, ten text, delta float8, tenant_estimate float8, domain_estimate float8,
    bucket bigint, busy float8, handled bigint
) RETURNS void LANGUAGE sql AS $$
    UPDATE {schema}.att_tenants SET vt = vt + delta, estimate = tenant_estimate
    WHERE domain_id = dom AND tenant = ten;
    UPDATE {schema}.att_domains SET estimate = domain_estimate WHERE id = dom;
    INSERT INTO {schema}.att_usage AS u (domain_id, bucket, tenant, busy, slices, messages)
    VALUES (dom, bucket, ten, busy, 1, handled)
    ON CONFLICT (domain_id, bucket, tenant) DO UPDATE SET busy = u.busy + excluded.busy,
        slices = u.slices + 1, messages = u.messages + excluded.messages
$$;

-- a work queue's visible messages (the backlog of TenantStats): its depth less what is
-- delayed or leased (FIFO followers count, as in stats())
CREATE FUNCTION {schema}.att_visible(qid int, max_priority int, now float8) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT coalesce(sum(c.depth), 0) FROM {schema}.counts c WHERE c.queue_id = qid)
         - (SELECT count(*) FROM generate_series(0, max_priority) AS p(prio)
            CROSS JOIN LATERAL (SELECT 1 FROM {schema}.messages m
                WHERE m.queue_id = qid AND NOT m.blocked AND m.priority = p.prio
                  AND m.avail_at > now) w)
$$;

-- the start of a take, an end, a stats call: the domain's row locked (one scheduler
-- decision at a time per domain) and swept (att_sweep), in one round trip; no row if
-- there is no such domain. flush = false: this transaction commits without waiting for the
-- WAL flush (a take's or an end's: slice tokens are leases, as receive()'s are)
CREATE FUNCTION {schema}.att_begin(dname text, now float8, flush bool)
RETURNS TABLE (id int, config jsonb, expired text[]) LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
    IF NOT flush THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT x.id, x.config INTO d FROM {schema}.att_domains x WHERE x.name = dname FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT d.id, d.config, ARRAY(SELECT {schema}.att_sweep(d.id, now));
END $$;

-- a slice's receive as ONE statement (no transaction of its own around it): the live
-- slice's work queue, then receive() of it. The first row's status says what happened:
-- 'ok' (the rows follow; none if the queue is empty), 'lost' (no live slice of this
-- token), 'gone' (no such domain), 'noqueue' (the work queue was deleted), 'rate' (the
-- key's plan has a rate: the caller takes the transactional path, which keeps the bucket)
CREATE FUNCTION {schema}.att_receive(tok text, dname text, now float8, n int, vt float8)
RETURNS TABLE (status text, id bigint, body bytea, attrs text, attempt int,
               priority smallint, grp text, lease bigint, ord int, queue text)
LANGUAGE plpgsql AS $$
DECLARE k record;
BEGIN
    SELECT kk.queue, coalesce(d.config -> 'plans' -> kk.plan,
                              d.config -> 'plans' -> (d.config ->> 'default_plan')) AS plan
    INTO k
    FROM {schema}.att_slices s JOIN {schema}.att_domains d ON d.id = s.domain_id
    JOIN {schema}.att_keys kk ON kk.domain_id = s.domain_id AND kk.key = s.key
    WHERE s.token = tok AND d.name = dname AND s.lease_until > now;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM {schema}.att_domains x WHERE x.name = dname) THEN
            RETURN QUERY SELECT 'lost', NULL::bigint, NULL::bytea, NULL::text, NULL::int,
                NULL::smallint, NULL::text, NULL::bigint, NULL::int, NULL::text;
        ELSE
            RETURN QUERY SELECT 'gone', NULL::bigint, NULL::bytea, NULL::text, NULL::int,
                NULL::smallint, NULL::text, NULL::bigint, NULL::int, NULL::text;
        END IF;
        RETURN;
    END IF;
    IF k.plan ->> 'rate' IS NOT NULL THEN
        RETURN QUERY SELECT 'rate', NULL::bigint, NULL::bytea, NULL::text, NULL::int,
            NULL::smallint, NULL::text, NULL::bigint, NULL::int, k.queue;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = k.queue) THEN
        RETURN QUERY SELECT 'noqueue', NULL::bigint, NULL::bytea, NULL::text, NULL::int,
            NULL::smallint, NULL::text, NULL::bigint, NULL::int, k.queue;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ok', NULL::bigint, NULL::bytea, NULL::text, NULL::int,
        NULL::smallint, NULL::text, NULL::bigint, NULL::int, k.queue;
    RETURN QUERY SELECT 'ok', r.id, r.body, r.attrs, r.attempt, r.priority, r.grp, r.lease,
        r.ord, k.queue FROM {schema}.receive(k.queue, now, n, vt) r;
END $$;
