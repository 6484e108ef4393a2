-- pg2kafka V011: a table that joins a publication with rows in it gets a snapshot.
--
-- `pgbench -i` and `pg_restore` create tables, fill them, then add the primary keys. A
-- table without a replica identity is left out of the publication (V008) until it gains
-- one, so its rows were never streamed: the sinks held only the rows changed later.
-- Now, when the DDL trigger adds a table to a publication because of an ALTER TABLE (it
-- gained a key or an identity) or because it was created from a query (CREATE TABLE AS,
-- SELECT INTO), it also writes a request into _walcast.snapshot_requests, in the same
-- transaction; pg2kafka takes it and snapshots the table incrementally (docs/snapshots.md).
-- A plain CREATE TABLE is empty: nothing to ask for.
-- Idempotent.

CREATE OR REPLACE FUNCTION _walcast.on_ddl_command_end()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cmd record;
    pub record;
    rel record;
    outcome text;
    tables jsonb := '[]'::jsonb;
    seen oid[] := '{}';
BEGIN
    FOR cmd IN SELECT * FROM pg_catalog.pg_event_trigger_ddl_commands() LOOP
        CONTINUE WHEN cmd.classid <> 'pg_catalog.pg_class'::regclass OR cmd.objid = ANY(seen);
        SELECT c.oid, c.relkind, c.relispartition, c.relpersistence, n.nspname, c.relname
          INTO rel
          FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = cmd.objid;
        CONTINUE WHEN NOT FOUND OR rel.relkind NOT IN ('r', 'p') OR rel.relispartition
                      OR rel.relpersistence <> 'p' OR rel.nspname = '_walcast';
        seen := seen || rel.oid;
        IF cmd.command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE') THEN
            FOR pub IN SELECT p.publication FROM _walcast.publications p
                         JOIN pg_catalog.pg_publication pp ON pp.pubname = p.publication
                        WHERE NOT pp.puballtables LOOP
                CONTINUE WHEN NOT _walcast.table_matches(pub.publication, rel.nspname, rel.relname);
                BEGIN
                    outcome := _walcast.publish_table(pub.publication, rel.oid);
                    -- A table joining with rows already in it (it gained a key, or was
                    -- created from a query): those rows were never streamed.
                    IF outcome LIKE '%added' AND cmd.command_tag <> 'CREATE TABLE' THEN
                        INSERT INTO _walcast.snapshot_requests
                            (publication, schema_name, table_name, reason)
                        VALUES (pub.publication, rel.nspname, rel.relname,
                                'joined the publication (' || cmd.command_tag || ')');
                    END IF;
                    IF outcome = 'removed' THEN
                        RAISE WARNING 'walcast: %.% left publication % (it has no replica identity any more); its changes are not streamed until it has one',
                            rel.nspname, rel.relname, pub.publication;
                    END IF;
                EXCEPTION WHEN OTHERS THEN
                    -- The application's DDL must never fail because of walcast.
                    RAISE WARNING 'walcast: could not update publication % for %.%: %',
                        pub.publication, rel.nspname, rel.relname, SQLERRM;
                END;
            END LOOP;
        END IF;
        tables := tables || jsonb_build_array(_walcast.table_schema(rel.oid));
    END LOOP;
    IF jsonb_array_length(tables) > 0 THEN
        PERFORM pg_catalog.pg_logical_emit_message(true, 'walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', left(current_query(), 10000),
            'tables', tables)::text);
    END IF;
END
$$;
