-- A header name need not be UTF-8 on the wire (librdkafka and Go producers write any bytes).
-- A dead letter keeps each name's bytes in header_name_bytes; header_names keeps them as text
-- (a name that is not UTF-8 made readable). Letters stored before have no bytes: their names
-- are their text. Added wherever the table is: the engine's schema, a rebuild's shadow, the
-- tables a swap replaced.
DO $$
DECLARE
    s name;
BEGIN
    FOR s IN
        SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname = 'projectionist_dead_letters' AND c.relkind = 'r' AND c.relpersistence <> 't'
    LOOP
        EXECUTE format('ALTER TABLE %I.projectionist_dead_letters ADD COLUMN IF NOT EXISTS header_name_bytes bytea[]', s);
    END LOOP;
END
$$;
