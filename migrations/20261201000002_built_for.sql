-- The event types a projection's tables were built for: what the release whose rebuild
-- swapped them in handles. A run of a release that does not handle one of them halts at
-- such an event rather than skip it (its next release would have written it).
CREATE TABLE IF NOT EXISTS projectionist_built_for (
    projection  text        PRIMARY KEY,
    event_types text[]      NOT NULL,
    swapped_at  timestamptz NOT NULL DEFAULT now()
);
