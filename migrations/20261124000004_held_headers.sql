-- The headers of a held event, as read, so that a held event found poison when its
-- aggregate resumes is dead-lettered with them: `[[name, value as hex], …]` (a per-row array
-- of pairs, which PostgreSQL's arrays cannot hold beside the set-based insert's unnest).
ALTER TABLE projectionist_held ADD COLUMN IF NOT EXISTS headers jsonb NOT NULL DEFAULT '[]';
