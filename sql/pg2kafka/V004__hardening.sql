-- pg2kafka V004: hardening after review.
--
-- * Only privileged roles may write logical messages into the WAL. pg_logical_emit_message
--   is executable by PUBLIC by default, so any user could forge or break 'walcast.ddl'
--   messages. The DDL triggers are SECURITY DEFINER and keep working.
-- * The DDL trigger must never break the application's DDL: temporary and unlogged
--   tables cannot be published (skip them), a registered publication may have been
--   dropped by hand (skip it), and any failure to extend a publication is a WARNING.
-- * The statement text in DDL messages is capped at 10,000 characters: a long migration
--   script must not produce a message larger than Kafka accepts.
-- * Definer functions search pg_catalog, then pg_temp explicitly (a temporary table must
--   never shadow a catalog).
-- Idempotent.

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.proname = 'pg_logical_emit_message'
                AND p.pronamespace = 'pg_catalog'::regnamespace LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, current_user);
    END LOOP;
END
$$;

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
                        WHERE NOT p.all_tables LOOP
                IF _walcast.table_matches(pub.publication, rel.nspname, rel.relname)
                   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr
                                     JOIN pg_catalog.pg_publication pp ON pp.oid = pr.prpubid
                                    WHERE pp.pubname = pub.publication AND pr.prrelid = rel.oid)
                THEN
                    BEGIN
                        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I',
                                       pub.publication, rel.nspname, rel.relname);
                    EXCEPTION WHEN OTHERS THEN
                        RAISE WARNING 'walcast: could not add %.% to publication %: %',
                            rel.nspname, rel.relname, pub.publication, SQLERRM;
                    END;
                END IF;
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
        PERFORM pg_catalog.pg_logical_emit_message(true, 'walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', left(current_query(), 10000),
            'dropped', dropped)::text);
    END IF;
END
$$;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = '_walcast'::regnamespace
                AND p.proconfig @> ARRAY['search_path=pg_catalog'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END
$$;
