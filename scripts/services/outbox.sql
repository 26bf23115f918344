-- The outbox table the Debezium outbox chain reads (scripts/services/debezium-outbox.sh):
-- Debezium's documented shape (id, aggregatetype, aggregateid, type, payload) plus two
-- columns of ours, which the event router places as headers:
--   version     the event's version in its aggregate's stream (header `version`, decimal text);
--   occurred_at when the event happened (header `occurredAt`, RFC 3339 text in UTC, e.g.
--               2026-01-02T03:04:05.123456Z). A timestamptz cannot be the router's record
--               timestamp (table.field.event.timestamp takes only int64 time types), so the
--               Kafka timestamp is when Debezium read the change, and differs on a re-send.
-- An application inserts its outbox row in the transaction that changes its own rows. The
-- primary key is the replica identity, which is all that pgoutput needs for inserts and for
-- the deletes of an application that empties its outbox (the router ignores deletes).
CREATE TABLE IF NOT EXISTS outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb NOT NULL,
    version bigint NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
);
