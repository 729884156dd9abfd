-- fairq's SQLite schema, version 1. Applied once per database file by store.py;
-- fairq_meta.schema_version tells later versions which migrations to run.
--
-- A message is in one of three states:
--   0 ready     visible now; ix_ready holds the delivery order (priority, availability, id)
--   1 waiting   delayed (lease IS NULL) or leased (lease = token of the current delivery);
--               ix_waiting holds when each comes due
--   2 blocked   in a FIFO queue, behind the head of its group (ix_fifo)
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
    visible       INTEGER NOT NULL DEFAULT 0,   -- states 0 and 2
    delayed       INTEGER NOT NULL DEFAULT 0,   -- state 1, not leased
    in_flight     INTEGER NOT NULL DEFAULT 0,   -- state 1, leased
    sent          INTEGER NOT NULL DEFAULT 0,
    acked         INTEGER NOT NULL DEFAULT 0,
    nacked        INTEGER NOT NULL DEFAULT 0,
    redelivered   INTEGER NOT NULL DEFAULT 0,
    dead_lettered INTEGER NOT NULL DEFAULT 0,
    expired       INTEGER NOT NULL DEFAULT 0,
    discarded     INTEGER NOT NULL DEFAULT 0
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
    body      BLOB NOT NULL,
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
