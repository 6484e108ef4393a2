-- pg2kafka V002: partitions are not tables of their own to consumers.
--
-- Publications use publish_via_partition_root, so a partition's rows arrive under its
-- root table's name; a DDL event for each new partition (a daily-partitioned table makes
-- one a day) would only announce a table that never receives data. Same function as in
-- V001, with partitions skipped. Idempotent.

CREATE OR REPLACE FUNCTION _walcast.on_ddl_command_end()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog
AS $$
DECLARE
    cmd record;
    pub record;
    rel record;
    tables jsonb := '[]'::jsonb;
    seen oid[] := '{}';
BEGIN
    FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        CONTINUE WHEN cmd.classid <> 'pg_catalog.pg_class'::regclass OR cmd.objid = ANY(seen);
        SELECT c.oid, c.relkind, c.relispartition, n.nspname, c.relname INTO rel
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = cmd.objid;
        CONTINUE WHEN NOT FOUND OR rel.relkind NOT IN ('r', 'p') OR rel.relispartition
                      OR rel.nspname = '_walcast';
        seen := seen || rel.oid;
        -- Keep filtered publications in step with new, renamed or moved tables.
        IF cmd.command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE') THEN
            FOR pub IN SELECT p.publication FROM _walcast.publications p
                        WHERE NOT p.all_tables LOOP
                IF _walcast.table_matches(pub.publication, rel.nspname, rel.relname)
                   AND NOT EXISTS (SELECT 1 FROM pg_publication_rel pr
                                     JOIN pg_publication pp ON pp.oid = pr.prpubid
                                    WHERE pp.pubname = pub.publication AND pr.prrelid = rel.oid)
                THEN
                    EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I',
                                   pub.publication, rel.nspname, rel.relname);
                END IF;
            END LOOP;
        END IF;
        tables := tables || jsonb_build_array(_walcast.table_schema(rel.oid));
    END LOOP;
    IF jsonb_array_length(tables) > 0 THEN
        PERFORM pg_logical_emit_message(true, 'walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', current_query(),
            'tables', tables)::text);
    END IF;
END
$$;
