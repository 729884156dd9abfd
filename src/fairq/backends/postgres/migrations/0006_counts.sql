-- fairq on PostgreSQL, migration 6: named counters kept for another engine (RabbitMQ's
-- ?store= keeps its queues' and topics' counters here), one row per (scope, name):
-- store_counts (not the queues' own counts table of migration 1).

CREATE TABLE {schema}.store_counts (
    scope text NOT NULL,
    name  text NOT NULL,
    n     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, name)
) WITH (fillfactor = 70);
