-- The partitions halted in a running process, as that process reports them, so that
-- `status` (another process) can show them: where, why, since when, and whether and when
-- the halt is retried. A row goes when the partition gets past its halt or is assigned
-- again (to this process or another).
CREATE TABLE IF NOT EXISTS projectionist_halts (
    projection  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    halted_at   bigint      NOT NULL,
    reason      text        NOT NULL,
    heals       boolean     NOT NULL,
    since       timestamptz NOT NULL,
    retry_at    timestamptz,
    reported_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);
