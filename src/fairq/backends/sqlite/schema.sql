-- fairq's SQLite schema, version 14. Every statement is idempotent (IF NOT EXISTS), so
-- txn.apply_schema brings a file of any older version up to date by running this file
-- again (plus any non-additive step it names), then records fairq_meta.schema_version.
--   version 1: queues and messages
--   version 2: topics, subscriptions, topic deduplication
--   version 3: idempotency keys and version gates
--   version 4: attention domains (keys, signals, tenants, slices)
--   version 5: waiting rooms
--   version 6: bodies shared by a publish's copies (fairq_bodies, fairq_messages.body_ref)
--   version 7: counters kept for other engines (fairq_counts: RabbitMQ's ?store=)
--   version 8: attention in worker time (virtual times, estimates, slice charges, usage)
--   version 9: sends counted later (fairq_queues.sent_upto), so a send writes no queue row
--   version 10: small receives and acks counted later (below), writing no queue row
--   version 11: attention slices count their acked messages as they go (counted)
--   version 12: one-message sends land in fairq_inbox (one B-tree page), moved on later;
--               a small ack of a receive not counted yet sets lease = -1 (one page)
--   version 13: a small receive of a queue without priorities leases its rows in place
--               (below: two B-tree pages, not three), its queue named in fairq_lazy
--   version 14: a big receive whose rows are one run of ids leases them in state 3, in no
--               partial index, its run named in fairq_runs (below)
--
-- A message is in one of three states (and a fourth while a big receive holds it):
--   0 ready     visible now; ix_ready holds the delivery order (priority, availability, id)
--   1 waiting   delayed (lease IS NULL) or leased (lease = token of the current delivery);
--               ix_waiting holds when each comes due
--   2 blocked   in a FIFO queue, behind the head of its group (ix_fifo)
--   3 leased    by a receive of LAZY_BELOW or more rows of a non-FIFO queue whose ids are
--               one run lo..hi (version 14): counted at once, its lease's end as avail_at,
--               but in no partial index (no ix_ready entry moved into ix_waiting, none for
--               its ack to delete), the run named in fairq_runs. messages.settle moves every
--               such row to state 1 (its end its due time), before anything but a receive
--               or an ack reads rows or moves a lease, and every second or so
-- What is not counted yet takes two more forms. A receive of a few messages of a non-FIFO
-- queue writes no queue row: of a queue without priorities (max_priority 0) it leases its
-- rows in place (version 13): they stay in state 0, priority 0, with the lease's end kept as
-- avail_at = end - LEASED_OFFSET (messages.py; below -1, below every ready row's avail_at,
-- and a later end above an earlier one), so a row's ix_ready entry moves to just before its
-- queue's head, on the page the receive writes anyway, and no ix_waiting entry is written;
-- the queue is named in fairq_lazy, which is how these rows are found again. Of any other
-- non-FIFO queue it keeps the rows in state 1 with the lease's end negated (avail_at < -1).
-- An ack of a few marks its rows acked: a row whose receive was not counted either only
-- takes lease = -1 (version 12: one B-tree page, the row), any other gets avail_at = -1 and
-- lease NULL (two: the row and ix_waiting; left by a fairq before 12: avail_at = -0.5).
-- messages.settle counts all of them (and deletes acked rows) a few hundred at a time,
-- before anything reads a queue's counters or rows or moves a leased row otherwise, after
-- which every lease is in state 1 with its end as avail_at. Due times are avail_at >= 0 in
-- state 1, -avail_at below -1 in state 1, and avail_at + LEASED_OFFSET of a row leased in
-- place (messages.NEXT_DUE). Every reader of state 0 that runs before settle (a receive,
-- the long poll's look) takes only avail_at >= 0.
-- Message ids grow with send time (milliseconds << 16 | counter): the id is the send
-- time, and rowid order is age order (ix_queue gives a queue's oldest message).

CREATE TABLE IF NOT EXISTS fairq_meta (
    key   TEXT PRIMARY KEY,
    value
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS fairq_queues (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    config        TEXT NOT NULL,            -- JSON of QueueConfig
    created_at    REAL NOT NULL,
    visible       INTEGER NOT NULL DEFAULT 0,   -- states 0 and 2 (but see sent_upto)
    delayed       INTEGER NOT NULL DEFAULT 0,   -- state 1, not leased
    in_flight     INTEGER NOT NULL DEFAULT 0,   -- state 1, leased
    sent          INTEGER NOT NULL DEFAULT 0,
    acked         INTEGER NOT NULL DEFAULT 0,
    nacked        INTEGER NOT NULL DEFAULT 0,
    redelivered   INTEGER NOT NULL DEFAULT 0,
    dead_lettered INTEGER NOT NULL DEFAULT 0,
    expired       INTEGER NOT NULL DEFAULT 0,
    discarded     INTEGER NOT NULL DEFAULT 0,
    -- 9: the queue's messages with ids above sent_upto are not counted yet in sent and
    -- visible (a send writes only its message row); Txn.fold counts them, before any of
    -- them is deleted and before the counters are read (txn.ADDED_COLUMNS: older files)
    sent_upto     INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS fairq_messages (
    id        INTEGER PRIMARY KEY,
    queue_id  INTEGER NOT NULL,
    state     INTEGER NOT NULL,
    priority  INTEGER NOT NULL,
    avail_at  REAL NOT NULL,     -- ready: when it became visible; waiting: when it comes due
    attempt   INTEGER NOT NULL,  -- deliveries so far
    lease     INTEGER,           -- token of the current lease, NULL when not leased
    grp       TEXT,
    body_ref  INTEGER,           -- fairq_bodies.id of a body shared by a topic's copies
    body      BLOB,              -- the body, unless body_ref names a shared one
    attrs     BLOB               -- JSON object; NULL when there are none
);

CREATE INDEX IF NOT EXISTS fairq_ix_ready
    ON fairq_messages (queue_id, priority DESC, avail_at) WHERE state = 0;
CREATE INDEX IF NOT EXISTS fairq_ix_waiting
    ON fairq_messages (avail_at) WHERE state = 1;
CREATE INDEX IF NOT EXISTS fairq_ix_queue
    ON fairq_messages (queue_id);
CREATE INDEX IF NOT EXISTS fairq_ix_fifo
    ON fairq_messages (queue_id, grp) WHERE state = 2;

-- version 12: the inbox. The common send (one visible message of priority 0, no group, no
-- deduplication, to a queue that is neither FIFO nor bounded) appends a row here, to a table
-- with no index: one B-tree page a commit, where a row of fairq_messages writes three (the
-- row, ix_ready, ix_queue). Every transaction that does anything but send moves the whole
-- inbox into fairq_messages first (Txn.drain: one INSERT ... SELECT and one DELETE), and so
-- does a send transaction once its connection has left _INBOX_ROWS (writer.py) rows here, so
-- the inbox stays small; nothing but Txn.drain and the long poll's look (__init__.py's
-- _NOTHING_TO_RECEIVE) reads it. A row keeps its message's id, queue and send time, so it
-- is counted (sent_upto), ordered and aged as if it had been stored in fairq_messages.
CREATE TABLE IF NOT EXISTS fairq_inbox (
    id       INTEGER PRIMARY KEY,
    queue_id INTEGER NOT NULL,
    avail_at REAL NOT NULL,
    body     BLOB,
    attrs    BLOB
);

-- version 13: the queues that may hold rows leased in place (state 0, avail_at < -1, above):
-- a small receive adds its queue once (INSERT OR IGNORE: no page written when it is there),
-- messages.settle visits each and empties the table
CREATE TABLE IF NOT EXISTS fairq_lazy (
    queue_id INTEGER PRIMARY KEY
) WITHOUT ROWID;

-- version 14: the leases in state 3 (above), one row per receive: its lease token, the run
-- of ids it leased and when the lease ends. Nothing but messages.settle deletes a row here
-- (an ack leaves it: settle finds no row of a run acked whole, one range probe); next_due
-- takes the earliest end, so a lease that ends before anyone settles is swept on time
CREATE TABLE IF NOT EXISTS fairq_runs (
    lease INTEGER PRIMARY KEY,
    lo    INTEGER NOT NULL,
    hi    INTEGER NOT NULL,
    until REAL NOT NULL
);

-- the message at the head of each FIFO group (ready, delayed or leased)
CREATE TABLE IF NOT EXISTS fairq_fifo_heads (
    queue_id INTEGER NOT NULL,
    grp      TEXT NOT NULL,
    msg_id   INTEGER NOT NULL,
    PRIMARY KEY (queue_id, grp)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS fairq_dedup (
    queue_id   INTEGER NOT NULL,
    dedup_id   TEXT NOT NULL,
    msg_id     INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (queue_id, dedup_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS fairq_ix_dedup_expiry ON fairq_dedup (expires_at);

-- version 2: publish/subscribe ------------------------------------------------------------
CREATE TABLE IF NOT EXISTS fairq_topics (
    id         INTEGER PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    config     TEXT NOT NULL,           -- JSON of TopicConfig
    created_at REAL NOT NULL,
    published  INTEGER NOT NULL DEFAULT 0,
    copies     INTEGER NOT NULL DEFAULT 0,
    unmatched  INTEGER NOT NULL DEFAULT 0
);

-- a subscription IS a queue (fairq_queues.id = queue_id), fed by its topic
CREATE TABLE IF NOT EXISTS fairq_subscriptions (
    topic_id   INTEGER NOT NULL,
    name       TEXT NOT NULL,
    queue_id   INTEGER NOT NULL,
    filter     TEXT,                    -- JSON filter policy, NULL: no filter
    routing    TEXT,                    -- AMQP topic pattern, NULL: every routing key
    push       TEXT,                    -- endpoint URL of a push subscription
    created_at REAL NOT NULL,
    PRIMARY KEY (topic_id, name)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS fairq_ix_subscription_queue ON fairq_subscriptions (queue_id);

CREATE TABLE IF NOT EXISTS fairq_topic_dedup (
    topic_id      INTEGER NOT NULL,
    dedup_id      TEXT NOT NULL,
    msg_id        INTEGER NOT NULL,
    subscriptions TEXT NOT NULL,        -- JSON list of the subscriptions that got a copy
    expires_at    REAL NOT NULL,
    PRIMARY KEY (topic_id, dedup_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS fairq_ix_topic_dedup_expiry ON fairq_topic_dedup (expires_at);

-- version 3: idempotency ------------------------------------------------------------------
-- one record per (namespace, key); the PRIMARY KEY is the uniqueness a claim race is
-- decided by (INSERT ... ON CONFLICT DO UPDATE ... WHERE expired). An expired record counts
-- as absent: claims take it over, reads skip it, the periodic clean-up deletes it.
CREATE TABLE IF NOT EXISTS fairq_idempotency (
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    token       TEXT NOT NULL,          -- the claim that holds (or completed) the key
    state       INTEGER NOT NULL,       -- 0 running (claimed), 1 completed
    fingerprint TEXT,                   -- what the work is (the HTTP request hash)
    result      BLOB,                   -- the completed work's result, tagged (see idempotency.py)
    expires_at  REAL NOT NULL,          -- running: end of the lease; completed: end of the ttl
    PRIMARY KEY (namespace, key)
);

CREATE INDEX IF NOT EXISTS fairq_ix_idempotency_expiry ON fairq_idempotency (expires_at);

-- the greatest version seen per entity; version is an integer or a real (an event time)
CREATE TABLE IF NOT EXISTS fairq_versions (
    namespace  TEXT NOT NULL,
    entity     TEXT NOT NULL,
    version    NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, entity)
) WITHOUT ROWID;

-- version 4: attention domains ------------------------------------------------------------
CREATE TABLE IF NOT EXISTS fairq_att_domains (
    id           INTEGER PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    config       TEXT NOT NULL,                 -- JSON of AttentionConfig
    created_at   REAL NOT NULL,
    turn_counter INTEGER NOT NULL DEFAULT 0,    -- the last turn handed to a tenant
    vclock       REAL NOT NULL DEFAULT 0,       -- 8: virtual time last served (SFQ's clock)
    estimate     REAL,                          -- 8: what a slice costs here; NULL: unknown
    processed    INTEGER NOT NULL DEFAULT 0,
    republished  INTEGER NOT NULL DEFAULT 0,
    blocked      INTEGER NOT NULL DEFAULT 0,
    rate_limited INTEGER NOT NULL DEFAULT 0,
    empty        INTEGER NOT NULL DEFAULT 0,
    parked       INTEGER NOT NULL DEFAULT 0,
    reconciled   INTEGER NOT NULL DEFAULT 0,
    discarded    TEXT NOT NULL DEFAULT '{}',    -- JSON: state -> signals dropped
    clear_sum    REAL NOT NULL DEFAULT 0,       -- seconds from backlog to empty, summed
    clear_count  INTEGER NOT NULL DEFAULT 0
);

-- one row per key: its policy, counts of pending signals and running slices, and bucket
CREATE TABLE IF NOT EXISTS fairq_att_keys (
    domain_id     INTEGER NOT NULL,
    key           TEXT NOT NULL,
    queue         TEXT NOT NULL,                -- the work queue's name
    tenant        TEXT NOT NULL,
    plan          TEXT NOT NULL,
    state         TEXT NOT NULL DEFAULT 'active',
    parked        INTEGER NOT NULL DEFAULT 0,
    pending       INTEGER NOT NULL DEFAULT 0,
    active        INTEGER NOT NULL DEFAULT 0,
    tokens        REAL,                         -- bucket level at tokens_at; NULL: full
    tokens_at     REAL NOT NULL,
    backlog_since REAL,
    processed     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (domain_id, key)
) WITHOUT ROWID;

-- tenants share the workers (attention_policy's scheduler): the one with a ready signal
-- and the lowest virtual time goes next; equal virtual times by turn (least recently served)
CREATE TABLE IF NOT EXISTS fairq_att_tenants (
    domain_id INTEGER NOT NULL,
    tenant    TEXT NOT NULL,
    turn      INTEGER NOT NULL DEFAULT 0,
    ready     INTEGER NOT NULL DEFAULT 0,       -- signals due now
    since     INTEGER NOT NULL DEFAULT 0,       -- signal that made it ready (ties of turn)
    vt        REAL NOT NULL DEFAULT 0,          -- 8: virtual time (cost used, over weights)
    estimate  REAL,                             -- 8: what its slice costs; NULL: unknown
    PRIMARY KEY (domain_id, tenant)
) WITHOUT ROWID;

-- signals: ready ones FIFO per tenant (id order), delayed ones by due time
CREATE TABLE IF NOT EXISTS fairq_att_signals (
    id        INTEGER PRIMARY KEY,
    domain_id INTEGER NOT NULL,
    tenant    TEXT NOT NULL,
    key       TEXT NOT NULL,
    due       REAL NOT NULL,
    ready     INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS fairq_att_ix_ready
    ON fairq_att_signals (domain_id, tenant, id) WHERE ready = 1;
CREATE INDEX IF NOT EXISTS fairq_att_ix_delayed ON fairq_att_signals (due) WHERE ready = 0;
CREATE INDEX IF NOT EXISTS fairq_att_ix_key ON fairq_att_signals (domain_id, key);

-- running slices: each holds one concurrency token of its key, as a lease
CREATE TABLE IF NOT EXISTS fairq_att_slices (
    token       TEXT PRIMARY KEY,
    domain_id   INTEGER NOT NULL,
    key         TEXT NOT NULL,
    lease_until REAL NOT NULL,
    tenant      TEXT,                           -- 8: the tenant charged at take
    charged     REAL NOT NULL DEFAULT 0,        -- 8: its estimated cost, corrected at the end
    taken_at    REAL,                           -- 8: when it was taken (its cost in time)
    counted     INTEGER NOT NULL DEFAULT 0      -- 11: acked messages counted on the way
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS fairq_att_ix_lease ON fairq_att_slices (lease_until);

-- version 5: waiting rooms ----------------------------------------------------------------
-- a room is one row of numbers (see backends/room_policy.py): positions are arithmetic on
-- it — place minus admission cursor — so no statement ever counts the fans ahead
CREATE TABLE IF NOT EXISTS fairq_rooms (
    id             INTEGER PRIMARY KEY,
    name           TEXT NOT NULL UNIQUE,
    config         TEXT NOT NULL,           -- JSON of RoomConfig
    rate           REAL NOT NULL,           -- the live admit rate (set_rate)
    kid            TEXT NOT NULL,           -- key id of the room's tokens
    key_seed       BLOB,                    -- generated root secret; NULL: processes pass one
    created_at     REAL NOT NULL,
    joined         INTEGER NOT NULL DEFAULT 0,  -- the last arrival number handed out
    drawn_at       REAL,                    -- when the pre-queue was drawn (the opening)
    pre_queue      INTEGER NOT NULL DEFAULT 0,  -- fans 1..pre_queue joined before opening
    draw_seed      BLOB,                    -- the draw's key (fairq.draw), once drawn
    head           INTEGER NOT NULL DEFAULT 0,  -- places 1..head are admitted
    expired_upto   INTEGER NOT NULL DEFAULT 0,  -- places 1..expired_upto: tokens lapsed or used
    used           INTEGER NOT NULL DEFAULT 0,
    used_live      INTEGER NOT NULL DEFAULT 0,  -- used tokens at places after expired_upto
    credit         REAL NOT NULL DEFAULT 0,     -- admissions earned, not yet made
    credit_at      REAL,
    meas_sum       REAL NOT NULL DEFAULT 0,     -- decayed count of admissions (measured rate)
    meas_at        REAL,
    meas_since     REAL,
    admitter       TEXT,                    -- the admitter lease: holder, end, fencing number
    admitter_until REAL NOT NULL DEFAULT 0,
    fence          INTEGER NOT NULL DEFAULT 0,
    sold_out_at    REAL,
    told_sold_out  INTEGER NOT NULL DEFAULT 0,
    closed_at      REAL
);

-- one row per fan: "one ticket per fan id"; the ticket carries seq, so status reads no row
CREATE TABLE IF NOT EXISTS fairq_room_fans (
    room_id INTEGER NOT NULL,
    fan     TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    PRIMARY KEY (room_id, fan)
) WITHOUT ROWID;

-- one row per admission step: the cursor after it, and its tokens' times
CREATE TABLE IF NOT EXISTS fairq_room_steps (
    room_id     INTEGER NOT NULL,
    upto        INTEGER NOT NULL,
    admitted_at REAL NOT NULL,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (room_id, upto)
) WITHOUT ROWID;

-- one row per consumed token (single use)
CREATE TABLE IF NOT EXISTS fairq_room_used (
    room_id INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    place   INTEGER NOT NULL,
    used_at REAL NOT NULL,
    PRIMARY KEY (room_id, seq)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS fairq_room_ix_used_place ON fairq_room_used (room_id, place);

-- version 6: bodies shared by the copies of a publish ----------------------------------------
-- (fairq_messages gains body_ref; txn.ADDED_COLUMNS adds it to older files)
CREATE TABLE IF NOT EXISTS fairq_bodies (
    id   INTEGER PRIMARY KEY,
    body BLOB NOT NULL,
    refs INTEGER NOT NULL          -- messages still pointing here; deleted at 0
);

-- version 7: counters kept for another engine (Backend.add_counts: RabbitMQ's ?store=) -------
CREATE TABLE IF NOT EXISTS fairq_counts (
    scope TEXT NOT NULL,
    name  TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;

-- version 8: attention scheduled in worker time -------------------------------------------
-- (fairq_att_domains gains vclock and estimate, fairq_att_tenants vt and estimate,
-- fairq_att_slices tenant, charged and taken_at: txn.ADDED_COLUMNS adds them to older
-- files before this script runs). Version 4's index by turn gives way to one by virtual time.
DROP INDEX IF EXISTS fairq_att_ix_turn;
CREATE INDEX IF NOT EXISTS fairq_att_ix_vt
    ON fairq_att_tenants (domain_id, vt, turn, since) WHERE ready > 0;

-- each tenant's slices in 5 s buckets, for TenantStats (the last minute); older buckets are
-- deleted by tenant_stats and the reconciler
CREATE TABLE IF NOT EXISTS fairq_att_usage (
    domain_id INTEGER NOT NULL,
    bucket    INTEGER NOT NULL,                 -- floor(time / 5 s)
    tenant    TEXT NOT NULL,
    busy      REAL NOT NULL DEFAULT 0,          -- seconds its slices held a worker
    slices    INTEGER NOT NULL DEFAULT 0,
    messages  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (domain_id, bucket, tenant)
) WITHOUT ROWID;
