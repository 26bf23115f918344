-- Engine tables of projectionist. Projection tables are created by each projection's schema().

-- Where each projection has read each topic partition up to: the next offset to consume.
-- Written in the same transaction as the batch it covers, so position and read model never disagree.
CREATE TABLE IF NOT EXISTS projectionist_checkpoints (
    projection  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);

-- Version watermark per projection and aggregate, for fan-in read models whose rows are not
-- 1:1 with aggregates. One row per aggregate (never per message), advanced by a guarded
-- transition in the same transaction as the writes it gates. Not a dedup table: it holds the
-- aggregate's last applied version, exactly what a 1:1 read model row would hold.
CREATE TABLE IF NOT EXISTS projectionist_watermarks (
    projection     text   NOT NULL,
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    version        bigint NOT NULL CHECK (version >= 1),
    PRIMARY KEY (projection, aggregate_type, aggregate_id)
);
