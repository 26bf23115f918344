-- What an operator did with a dead letter: `retried` (applied by a later build of the
-- projection, its upcasters included) or `discarded` (its version skipped on purpose, the
-- gate moved past it without changing the row), when, and why. A resolved dead letter stays
-- as the record of it; `dead-letters list` shows the open ones.
ALTER TABLE projectionist_dead_letters ADD COLUMN IF NOT EXISTS resolution text;
ALTER TABLE projectionist_dead_letters ADD COLUMN IF NOT EXISTS resolved_at timestamptz;
ALTER TABLE projectionist_dead_letters ADD COLUMN IF NOT EXISTS resolution_note text;
