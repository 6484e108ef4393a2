-- pg2kafka V018: messages bound to their transaction; a table that joins says so.
--
-- * A signed logical message (V013) could be re-emitted, bytes unchanged, by a role able
--   to read the WAL (a replication user): a DROP TABLE replayed empties an index. The
--   signature now also covers the prefix and the writing transaction's 32-bit xid, which
--   pg2kafka compares with the transaction the message arrives in (v2 form):
--     'walcast-sig-v2:' || hex(sha256(key || sha256(prefix || ':' || xid || ':' || body)))
--       || ':' || body
--   A database whose key is missing no longer fails the application's DDL: the message
--   is left out, with a WARNING.
-- * Each table of a DDL message carries `joined`: it joined the CDC publication in this
--   statement (gained a key or an identity). pg2kafka records that position as the
--   table's floor, so the snapshot that follows replaces the rows it appended while the
--   table was insert-only — also after a restart, when nothing in memory remembers that.
-- * A keyless table that becomes insert-only on a running database (CREATE TABLE AS,
--   SELECT INTO, a moved table, a dropped key) gets a WARNING: its existing rows, updates
--   and deletes are not streamed.
-- Idempotent.

CREATE OR REPLACE FUNCTION _walcast.emit_message(prefix text, payload text)
RETURNS pg_lsn
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    body bytea := pg_catalog.convert_to(payload, 'UTF8');
    xid text := pg_catalog.pg_current_xact_id()::pg_catalog.xid::text;
    k bytea;
BEGIN
    SELECT m.key INTO k FROM _walcast.message_key m;
    IF k IS NULL THEN
        RAISE WARNING 'walcast: _walcast.message_key is empty: a % message was not written (run pg2kafka init)', prefix;
        RETURN NULL;
    END IF;
    RETURN pg_catalog.pg_logical_emit_message(true, prefix,
        pg_catalog.convert_to('walcast-sig-v2:' || pg_catalog.encode(pg_catalog.sha256(
            k || pg_catalog.sha256(pg_catalog.convert_to(prefix || ':' || xid || ':', 'UTF8')
                                   || body)), 'hex') || ':', 'UTF8') || body);
END
$$;
REVOKE ALL ON FUNCTION _walcast.emit_message(text, text) FROM PUBLIC;

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
    joined boolean;
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
        joined := false;
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
                        joined := true;
                        INSERT INTO _walcast.snapshot_requests
                            (publication, schema_name, table_name, reason)
                        VALUES (pub.publication, rel.nspname, rel.relname,
                                'joined the publication (' || cmd.command_tag || ')');
                    END IF;
                    IF outcome = 'inserts' AND cmd.command_tag <> 'CREATE TABLE' THEN
                        RAISE WARNING 'walcast: %.% streams as an insert-only table (no replica identity): only its inserts and truncates from now on reach walcast, not the rows it already holds nor its updates and deletes; add a primary key, or set filters.keyless_tables=full_identity',
                            rel.nspname, rel.relname;
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
        tables := tables || jsonb_build_array(
            _walcast.table_schema(rel.oid) || jsonb_build_object('joined', joined));
    END LOOP;
    IF jsonb_array_length(tables) > 0 THEN
        PERFORM _walcast.emit_message('walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', left(current_query(), 10000),
            'tables', tables)::text);
    END IF;
END
$$;
