-- pg2kafka V008: a table without a replica identity never breaks the application.
--
-- Postgres refuses UPDATE and DELETE on a table that is in a publication publishing them
-- but has no replica identity (no primary key, REPLICA IDENTITY NOTHING, or DEFAULT
-- without a key). A `FOR ALL TABLES` publication therefore made every such statement of
-- the application fail the moment `init` ran. From here on:
--
-- * publications list their tables (init converts a `FOR ALL TABLES` one), and a table
--   is in a publication only while it has a replica identity;
-- * `_walcast.publications.keyless` says what happens to a matching table without one:
--   'skip' (left out; init reports it, pg2kafka logs it and counts it in a metric) or
--   'full_identity' (made REPLICA IDENTITY FULL, then published: only when asked, since
--   it makes every update and delete log the whole old row);
-- * the DDL trigger applies the same rule to tables created or altered later: a table
--   that gains a primary key joins, one that loses its identity leaves (in the same
--   transaction, so the application's next UPDATE works).
-- Idempotent.

ALTER TABLE _walcast.publications
    ADD COLUMN IF NOT EXISTS keyless text NOT NULL DEFAULT 'skip';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                    WHERE conname = 'publications_keyless_check'
                      AND conrelid = '_walcast.publications'::regclass) THEN
        ALTER TABLE _walcast.publications ADD CONSTRAINT publications_keyless_check
            CHECK (keyless IN ('skip', 'full_identity'));
    END IF;
END
$$;

-- Whether UPDATE / DELETE on the table can be published: what Postgres itself checks.
CREATE OR REPLACE FUNCTION _walcast.has_identity(rel oid)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE c.relreplident
             WHEN 'f' THEN true
             WHEN 'n' THEN false
             WHEN 'i' THEN EXISTS (SELECT 1 FROM pg_index i
                                    WHERE i.indrelid = c.oid AND i.indisreplident)
             ELSE EXISTS (SELECT 1 FROM pg_index i
                           WHERE i.indrelid = c.oid AND i.indisprimary)
           END
      FROM pg_class c
     WHERE c.oid = rel
$$;

-- Bring one table in line with one publication's rule: make it FULL when asked, then add
-- it when it has an identity, or remove it when it lost its identity. Returns what was
-- done ('added', 'removed', 'full_identity+added', 'skipped', '' for nothing). Raises on
-- failure: callers decide whether that is a warning (the DDL trigger) or an error (init).
CREATE OR REPLACE FUNCTION _walcast.publish_table(pub text, rel oid)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    mode text;
    listed boolean;
    done text := '';
BEGIN
    SELECT n.nspname, c.relname, c.relreplident INTO r
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
    IF NOT FOUND THEN
        RETURN '';
    END IF;
    SELECT p.keyless INTO mode FROM _walcast.publications p WHERE p.publication = pub;
    listed := EXISTS (SELECT 1 FROM pg_publication_rel pr
                        JOIN pg_publication pp ON pp.oid = pr.prpubid
                       WHERE pp.pubname = pub AND pr.prrelid = rel);
    IF NOT _walcast.has_identity(rel) AND mode = 'full_identity' AND r.relreplident = 'd' THEN
        EXECUTE format('ALTER TABLE %I.%I REPLICA IDENTITY FULL', r.nspname, r.relname);
        done := 'full_identity+';
        -- That ALTER TABLE ran the DDL trigger again, which may have added the table.
        listed := EXISTS (SELECT 1 FROM pg_publication_rel pr
                            JOIN pg_publication pp ON pp.oid = pr.prpubid
                           WHERE pp.pubname = pub AND pr.prrelid = rel);
    END IF;
    IF _walcast.has_identity(rel) THEN
        IF NOT listed THEN
            EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', pub, r.nspname, r.relname);
            RETURN done || 'added';
        END IF;
        RETURN done;
    END IF;
    IF listed THEN
        EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I', pub, r.nspname, r.relname);
        RETURN 'removed';
    END IF;
    RETURN 'skipped';
END
$$;

REVOKE ALL ON FUNCTION _walcast.publish_table(text, oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION _walcast.has_identity(oid) FROM PUBLIC;

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
