-- Parking: an aggregate whose event cannot be applied yet (a gap: its predecessor never
-- arrived) waits here, and its later events are held, exactly as they were read, until the
-- version it waits for arrives; then they are applied in version order and removed. Written
-- in the same transaction as the batch and its checkpoint.

-- One row per parked aggregate of a projection.
CREATE TABLE IF NOT EXISTS projectionist_parked (
    projection     text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    -- Where its events are read.
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    -- The version whose arrival resumes it.
    waiting_for    bigint      NOT NULL CHECK (waiting_for >= 1),
    reason         text        NOT NULL,
    since          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, aggregate_type, aggregate_id)
);
CREATE INDEX IF NOT EXISTS projectionist_parked_by_partition
    ON projectionist_parked (projection, topic, partition);

-- The events held behind parked aggregates: the message's exact bytes and where it was read.
CREATE TABLE IF NOT EXISTS projectionist_held (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection     text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    -- NULL when the event was not read from Kafka (applied through the library's API).
    "offset"       bigint,
    key            bytea,
    payload        bytea       NOT NULL,
    held_at        timestamptz NOT NULL DEFAULT now()
);
-- A message read again (a replay) is held once.
CREATE UNIQUE INDEX IF NOT EXISTS projectionist_held_message
    ON projectionist_held (projection, topic, partition, "offset");
CREATE INDEX IF NOT EXISTS projectionist_held_by_aggregate
    ON projectionist_held (projection, aggregate_type, aggregate_id, version, id);
