-- Dead letters: events that can never apply as they stand (an envelope or data that does not
-- decode, a key that contradicts the envelope, a value the table refuses, an apply that keeps
-- failing), kept with the message's exact bytes and the full error. An event whose aggregate
-- is known parks that aggregate behind it (projectionist_parked.dead_letter names it); one
-- with no usable aggregate identity is dead-lettered alone. Written in the batch's transaction.
CREATE TABLE IF NOT EXISTS projectionist_dead_letters (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection     text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    -- NULL when the event was not read from Kafka (applied through the library's API).
    "offset"       bigint,
    key            bytea,
    payload        bytea       NOT NULL,
    header_names   text[]      NOT NULL DEFAULT '{}',
    header_values  bytea[]     NOT NULL DEFAULT '{}',
    -- The aggregate it parks, when the envelope names one.
    aggregate_type text,
    aggregate_id   text,
    version        bigint,
    -- What kind of failure: envelope, data, value, apply.
    reason         text        NOT NULL,
    error          text        NOT NULL,
    attempts       integer     NOT NULL DEFAULT 1,
    first_seen     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now()
);
-- A message read again (a replay) is one dead letter, its attempts counted.
CREATE UNIQUE INDEX IF NOT EXISTS projectionist_dead_letters_message
    ON projectionist_dead_letters (projection, topic, partition, "offset");

-- A parked aggregate waits for a missing version (a gap), or behind a dead letter of its own.
ALTER TABLE projectionist_parked ADD COLUMN IF NOT EXISTS dead_letter bigint;
