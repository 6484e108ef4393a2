-- pg2kafka V001: DDL capture and publication maintenance.
--
-- DDL travels in the replication stream itself: event triggers emit a *transactional*
-- logical message (prefix 'walcast.ddl') carrying the statement, the command tag and the
-- resulting table schema. Being part of the DDL's transaction, the message reaches
-- pg2kafka in commit order, before any data that depends on the change.
--
-- Publications created by `pg2kafka init` with include/exclude filters are registered in
-- _walcast.publications; a table created (or renamed / moved) later is added to every
-- publication whose filters match it. Idempotent: safe to run again.
--
-- The schema is "_walcast", not "walcast": a role named walcast would otherwise find it
-- first on its default search_path ("$user", public) and create its tables in it.

CREATE SCHEMA IF NOT EXISTS _walcast;

CREATE TABLE IF NOT EXISTS _walcast.publications (
    publication text PRIMARY KEY,
    include_patterns text[] NOT NULL,
    exclude_patterns text[] NOT NULL DEFAULT '{}',
    all_tables boolean NOT NULL
);

-- '*' is the only wildcard; everything else matches literally.
CREATE OR REPLACE FUNCTION _walcast.glob_match(pattern text, value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog
AS $$
    SELECT value ~ ('^' || replace(regexp_replace(pattern, '([.^$+?(){}\[\]|\\])', '\\\1', 'g'),
                                   '*', '.*') || '$')
$$;

CREATE OR REPLACE FUNCTION _walcast.table_matches(pub text, schema_name text, table_name text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog
AS $$
    SELECT schema_name <> '_walcast'
       AND EXISTS (SELECT 1 FROM unnest(p.include_patterns) i
                   WHERE _walcast.glob_match(split_part(i, '.', 1), schema_name)
                     AND _walcast.glob_match(substr(i, strpos(i, '.') + 1), table_name))
       AND NOT EXISTS (SELECT 1 FROM unnest(p.exclude_patterns) e
                       WHERE _walcast.glob_match(split_part(e, '.', 1), schema_name)
                         AND _walcast.glob_match(substr(e, strpos(e, '.') + 1), table_name))
      FROM _walcast.publications p
     WHERE p.publication = pub
$$;

-- The schema of one table as JSON: what consumers need to map it (columns in order,
-- Postgres types, nullability, primary key).
CREATE OR REPLACE FUNCTION _walcast.table_schema(rel oid)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog
AS $$
    SELECT jsonb_build_object(
        'schema', n.nspname,
        'table', c.relname,
        'columns', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'name', a.attname,
                       'type', t.typname,
                       'sql_type', format_type(a.atttypid, a.atttypmod),
                       'nullable', NOT a.attnotnull)
                   ORDER BY a.attnum)
              FROM pg_attribute a
              JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '[]'::jsonb),
        'primary_key', coalesce((
            SELECT jsonb_agg(a.attname ORDER BY k.ord)
              FROM pg_index i
              CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE i.indrelid = c.oid AND i.indisprimary), '[]'::jsonb))
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = rel
$$;

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
        CONTINUE WHEN NOT FOUND OR rel.relkind NOT IN ('r', 'p') OR rel.nspname = '_walcast';
        seen := seen || rel.oid;
        -- Keep filtered publications in step with new, renamed or moved tables.
        IF cmd.command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
           AND NOT rel.relispartition THEN
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

CREATE OR REPLACE FUNCTION _walcast.on_sql_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog
AS $$
DECLARE
    dropped jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_object('schema', o.schema_name, 'table', o.object_name)),
                    '[]'::jsonb)
      INTO dropped
      FROM pg_event_trigger_dropped_objects() o
     WHERE o.object_type = 'table' AND o.schema_name <> '_walcast' AND NOT o.is_temporary;
    IF jsonb_array_length(dropped) > 0 THEN
        PERFORM pg_logical_emit_message(true, 'walcast.ddl', jsonb_build_object(
            'tag', tg_tag,
            'statement', current_query(),
            'dropped', dropped)::text);
    END IF;
END
$$;

-- Event triggers fire for every role's DDL, a superuser's included, so only a superuser
-- may create them and the functions they run must belong to a role no less trusted: a
-- non-superuser owner could otherwise replace them and run code inside a superuser's DDL.
-- With a non-superuser owner, DDL capture stays off (docs/security.md).
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE NOTICE 'walcast: % is not a superuser, DDL capture (event triggers) not installed',
            current_user;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'walcast_ddl_command_end') THEN
        CREATE EVENT TRIGGER walcast_ddl_command_end ON ddl_command_end
            EXECUTE FUNCTION _walcast.on_ddl_command_end();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'walcast_sql_drop') THEN
        CREATE EVENT TRIGGER walcast_sql_drop ON sql_drop
            EXECUTE FUNCTION _walcast.on_sql_drop();
    END IF;
END
$$;
