-- A wait for an aggregate's version asks whether that version was discarded (the gates
-- stand past it, but it never changed the read model): found by its aggregate and version.
CREATE INDEX IF NOT EXISTS projectionist_dead_letters_discarded
    ON projectionist_dead_letters (projection, aggregate_type, aggregate_id, version)
    WHERE resolution = 'discarded';
