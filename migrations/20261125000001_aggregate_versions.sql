-- The version the engine keeps per projection and aggregate (for fan-in and custom tables) is
-- the aggregate's version; "watermark" is Kafka's high offset. The table is named for what it
-- holds, wherever it is: the engine's schema, a rebuild's shadow, the tables a swap replaced.
DO $$
DECLARE
    s name;
BEGIN
    FOR s IN
        SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname = 'projectionist_watermarks' AND c.relkind = 'r' AND c.relpersistence <> 't'
    LOOP
        EXECUTE format('ALTER TABLE %I.projectionist_watermarks RENAME TO projectionist_aggregate_versions', s);
        EXECUTE format(
            'ALTER INDEX IF EXISTS %I.projectionist_watermarks_pkey RENAME TO projectionist_aggregate_versions_pkey', s
        );
    END LOOP;
END
$$;
