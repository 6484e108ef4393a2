-- pg2kafka V020: verification markers (docs/design.md#verification).
--
-- A sink's `verify` compares the sink with its tables at a point of the stream: it asks
-- for a marker after reading Postgres, waits until the sink has applied everything up to
-- that marker on every partition, then reads the sink. _walcast.verify_mark writes the
-- marker: a signed transactional logical message (prefix 'walcast.verify', written by
-- _walcast.emit_message, so pg2kafka acts on no forged one), which pg2kafka turns into an
-- `op: verify` event on each named table's partitions, in commit order.
--
-- The function is SECURITY DEFINER (it signs with the owner's key) and executable by
-- walcast_verifier only: grant that role to the login a sink's verify runs as. A marker
-- carries nothing but its id and the tables' names; calling it more often than a sink
-- verifies costs one event per table and partition.
-- Idempotent.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'walcast_verifier') THEN
        BEGIN
            CREATE ROLE walcast_verifier NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'walcast: role walcast_verifier does not exist and % may not create it: only the owner may ask for verification markers', current_user
                USING HINT = 'as a superuser run: CREATE ROLE walcast_verifier NOLOGIN; GRANT USAGE ON SCHEMA _walcast TO walcast_verifier; GRANT EXECUTE ON FUNCTION _walcast.verify_mark(text, regclass[]) TO walcast_verifier';
        END;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION _walcast.verify_mark(mark text, tables regclass[])
RETURNS pg_lsn
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    named jsonb;
BEGIN
    IF mark IS NULL OR length(mark) = 0 OR length(mark) > 200 THEN
        RAISE EXCEPTION 'walcast: a verification mark needs an id of 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(jsonb_agg(jsonb_build_object('schema', n.nspname, 'table', c.relname)
                              ORDER BY n.nspname, c.relname), '[]'::jsonb)
      INTO named
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = ANY (tables);
    RETURN _walcast.emit_message('walcast.verify',
        jsonb_build_object('id', mark, 'tables', named)::text);
END
$$;
REVOKE ALL ON FUNCTION _walcast.verify_mark(text, regclass[]) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'walcast_verifier') THEN
        GRANT USAGE ON SCHEMA _walcast TO walcast_verifier;
        GRANT EXECUTE ON FUNCTION _walcast.verify_mark(text, regclass[]) TO walcast_verifier;
    END IF;
END
$$;
