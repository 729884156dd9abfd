-- fairq on PostgreSQL, migration 4: waiting rooms (see backends/room_policy.py).
-- A room is one row of numbers; positions are arithmetic on it, nothing counts fans.
CREATE TABLE {schema}.rooms (
    id             serial PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    config         jsonb NOT NULL,
    rate           float8 NOT NULL,
    kid            text NOT NULL,
    key_seed       bytea,
    created_at     float8 NOT NULL,
    joined         bigint NOT NULL DEFAULT 0,
    drawn_at       float8,
    pre_queue      bigint NOT NULL DEFAULT 0,
    draw_seed      bytea,
    head           bigint NOT NULL DEFAULT 0,
    expired_upto   bigint NOT NULL DEFAULT 0,
    used           bigint NOT NULL DEFAULT 0,
    used_live      bigint NOT NULL DEFAULT 0,
    credit         float8 NOT NULL DEFAULT 0,
    credit_at      float8,
    meas_sum       float8 NOT NULL DEFAULT 0,
    meas_at        float8,
    meas_since     float8,
    admitter       text,
    admitter_until float8 NOT NULL DEFAULT 0,
    fence          bigint NOT NULL DEFAULT 0,
    sold_out_at    float8,
    told_sold_out  bigint NOT NULL DEFAULT 0,
    closed_at      float8
) WITH (fillfactor = 50);

-- one row per fan: "one ticket per fan id"
CREATE TABLE {schema}.room_fans (
    room_id int NOT NULL,
    fan     text NOT NULL,
    seq     bigint NOT NULL,
    PRIMARY KEY (room_id, fan)
);

-- one row per admission step: the cursor after it, and its tokens' times
CREATE TABLE {schema}.room_steps (
    room_id     int NOT NULL,
    upto        bigint NOT NULL,
    admitted_at float8 NOT NULL,
    expires_at  float8 NOT NULL,
    PRIMARY KEY (room_id, upto)
);

-- one row per consumed token (single use)
CREATE TABLE {schema}.room_used (
    room_id int NOT NULL,
    seq     bigint NOT NULL,
    place   bigint NOT NULL,
    used_at float8 NOT NULL,
    PRIMARY KEY (room_id, seq)
);
CREATE INDEX room_used_place ON {schema}.room_used (room_id, place);
