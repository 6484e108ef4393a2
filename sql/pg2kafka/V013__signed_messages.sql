-- pg2kafka V013: pg2kafka acts only on logical messages walcast wrote.
--
-- pg_logical_emit_message is executable by PUBLIC unless a superuser revokes it (V004 does
-- where it can), and pgoutput does not say who wrote a message: any login could write a
-- 'walcast.ddl' message (a forged CREATE TABLE empties a table's index) or a snapshot
-- watermark (a window that never closes). Now every message pg2kafka acts on is signed:
--
--   content = 'walcast-sig-v1:' || hex(sha256(key || sha256(body))) || ':' || body
--
-- where body is the payload in UTF-8 and key is 32 random bytes in _walcast.message_key,
-- readable by the owner only. _walcast.emit_message is the one writer (the owner's alone:
-- the DDL triggers, SECURITY DEFINER, and pg2kafka's snapshot readers call it);
-- pg2kafka checks the signature (services/pg2kafka/messages.py) and ignores, counts and
-- logs every other message with a walcast prefix. The outer hash is over a fixed length
-- (key and inner digest), so the scheme has no length extension.
-- Idempotent.

CREATE TABLE IF NOT EXISTS _walcast.message_key (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    key bytea NOT NULL CHECK (length(key) = 32)
);
REVOKE ALL ON _walcast.message_key FROM PUBLIC;

-- gen_random_uuid() reads the server's strong random source (PostgreSQL 13+); two of
-- them without their version and variant bits give 244 random bits.
INSERT INTO _walcast.message_key (key)
SELECT pg_catalog.decode(
           pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '')
           || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 'hex')
WHERE NOT EXISTS (SELECT FROM _walcast.message_key);

CREATE OR REPLACE FUNCTION _walcast.emit_message(prefix text, payload text)
RETURNS pg_lsn
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    body bytea := pg_catalog.convert_to(payload, 'UTF8');
    k bytea;
BEGIN
    SELECT m.key INTO STRICT k FROM _walcast.message_key m;
    RETURN pg_catalog.pg_logical_emit_message(true, prefix,
        pg_catalog.convert_to('walcast-sig-v1:' || pg_catalog.encode(
            pg_catalog.sha256(k || pg_catalog.sha256(body)), 'hex') || ':', 'UTF8') || body);
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
        PERFORM _walcast.emit_message('walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', left(current_query(), 10000),
            'tables', tables)::text);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION _walcast.on_sql_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    dropped jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_object('schema', o.schema_name,
                                                 'table', o.object_name)), '[]'::jsonb)
      INTO dropped
      FROM pg_catalog.pg_event_trigger_dropped_objects() o
     WHERE o.object_type = 'table' AND o.schema_name <> '_walcast' AND NOT o.is_temporary;
    IF jsonb_array_length(dropped) > 0 THEN
        PERFORM _walcast.emit_message('walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', left(current_query(), 10000),
            'dropped', dropped)::text);
    END IF;
END
$$;
