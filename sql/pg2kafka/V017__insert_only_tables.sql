-- pg2kafka V017: keyless insert-only tables stream (filters.keyless_tables = 'inserts').
--
-- A table without a replica identity cannot be in a publication that publishes UPDATE or
-- DELETE (Postgres then refuses the application's UPDATE and DELETE on it), but it can be
-- in one that publishes only INSERT and TRUNCATE. Under 'inserts' (init's default from
-- now on) such a matching table joins that second publication, whose name init registers
-- in `_walcast.publications.inserts_publication` of the main publication's row; pg2kafka
-- streams both publications from the one slot. The two are disjoint:
--
-- * a table with a replica identity is in the main publication, never in the insert-only
--   one: one that gains a key moves (in the DDL's transaction) and `publish_table` still
--   returns 'added', so the DDL trigger (V013) asks for its snapshot as before;
-- * a table without one is in the insert-only publication under 'inserts' (returns
--   'inserts' when it joined or moved there), and in neither under 'skip' (returns
--   'removed' when it left one, else 'skipped');
-- * a row whose inserts_publication is NULL, or names a publication that does not exist
--   (an install init has not run on since), behaves as 'skip' for keyless tables.
--
-- The DDL trigger is unchanged: it calls publish_table with the main publication.
-- Idempotent.

ALTER TABLE _walcast.publications
    ADD COLUMN IF NOT EXISTS inserts_publication text;

ALTER TABLE _walcast.publications ALTER COLUMN keyless SET DEFAULT 'inserts';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                    WHERE conname = 'publications_keyless_check'
                      AND conrelid = '_walcast.publications'::regclass
                      AND pg_catalog.pg_get_constraintdef(oid) LIKE '%inserts%') THEN
        ALTER TABLE _walcast.publications DROP CONSTRAINT IF EXISTS publications_keyless_check;
        ALTER TABLE _walcast.publications ADD CONSTRAINT publications_keyless_check
            CHECK (keyless IN ('skip', 'full_identity', 'inserts'));
    END IF;
END
$$;

-- Bring one table in line with one publication's rule (and its insert-only companion's).
-- Returns what was done: 'added' / 'full_identity+added' (joined the main publication:
-- its rows were never streamed as keyed rows), 'inserts' (joined the insert-only
-- publication), 'removed' (left the main or the insert-only publication, streamed by
-- neither now), 'skipped' (keyless, in neither), '' or 'full_identity+' (nothing to do).
-- Raises on failure: callers decide whether that is a warning (the DDL trigger) or an
-- error (init).
CREATE OR REPLACE FUNCTION _walcast.publish_table(pub text, rel oid)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    mode text;
    ins text;
    listed boolean;
    ins_listed boolean := false;
    done text := '';
BEGIN
    SELECT n.nspname, c.relname, c.relreplident INTO r
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
    IF NOT FOUND THEN
        RETURN '';
    END IF;
    SELECT p.keyless, p.inserts_publication INTO mode, ins
      FROM _walcast.publications p WHERE p.publication = pub;
    IF ins IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = ins) THEN
        ins := NULL;
    END IF;
    IF NOT _walcast.has_identity(rel) AND mode = 'full_identity' AND r.relreplident = 'd' THEN
        EXECUTE format('ALTER TABLE %I.%I REPLICA IDENTITY FULL', r.nspname, r.relname);
        done := 'full_identity+';
        -- That ALTER TABLE ran the DDL trigger again, which may have moved the table:
        -- the memberships are read below, after it.
    END IF;
    listed := EXISTS (SELECT 1 FROM pg_publication_rel pr
                        JOIN pg_publication pp ON pp.oid = pr.prpubid
                       WHERE pp.pubname = pub AND pr.prrelid = rel);
    IF ins IS NOT NULL THEN
        ins_listed := EXISTS (SELECT 1 FROM pg_publication_rel pr
                                JOIN pg_publication pp ON pp.oid = pr.prpubid
                               WHERE pp.pubname = ins AND pr.prrelid = rel);
    END IF;
    IF _walcast.has_identity(rel) THEN
        IF ins_listed THEN
            EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I', ins, r.nspname, r.relname);
        END IF;
        IF NOT listed THEN
            EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', pub, r.nspname, r.relname);
            RETURN done || 'added';
        END IF;
        RETURN done;
    END IF;
    -- No replica identity: never in a publication that publishes UPDATE / DELETE.
    IF listed THEN
        EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I', pub, r.nspname, r.relname);
    END IF;
    IF mode = 'inserts' AND ins IS NOT NULL THEN
        IF NOT ins_listed THEN
            EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', ins, r.nspname, r.relname);
            RETURN 'inserts';
        END IF;
        RETURN '';
    END IF;
    IF ins_listed THEN
        EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I', ins, r.nspname, r.relname);
    END IF;
    IF listed OR ins_listed THEN
        RETURN 'removed';
    END IF;
    RETURN 'skipped';
END
$$;

REVOKE ALL ON FUNCTION _walcast.publish_table(text, oid) FROM PUBLIC;
