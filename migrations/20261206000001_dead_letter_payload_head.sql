-- A dead letter's payload past dead_letter_payload_max_bytes is stored as its head: then
-- payload_bytes holds its full length and payload_sha256 its SHA-256, so that a topic's
-- retention still bounds what is kept and the message can still be recognised. Both are
-- NULL for a payload stored whole. Added wherever the table is: the engine's schema, a
-- rebuild's shadow, the tables a swap replaced.
DO $$
DECLARE
    s name;
BEGIN
    FOR s IN
        SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname = 'projectionist_dead_letters' AND c.relkind = 'r' AND c.relpersistence <> 't'
    LOOP
        EXECUTE format('ALTER TABLE %I.projectionist_dead_letters ADD COLUMN IF NOT EXISTS payload_bytes bigint', s);
        EXECUTE format('ALTER TABLE %I.projectionist_dead_letters ADD COLUMN IF NOT EXISTS payload_sha256 bytea', s);
    END LOOP;
END
$$;
