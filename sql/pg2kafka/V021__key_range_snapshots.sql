-- pg2kafka V021: snapshots of key ranges — what `repair` asks for (docs/design.md, "Repair").
--
-- A sink's `repair` finds the key ranges where the sink differs from its table (`verify`)
-- and asks pg2kafka to read exactly those ranges again: a request in the signal table
-- with `key_ranges` (shared/contract/keyranges.py: the key columns, and ranges
-- lower < key <= upper of integer or uuid keys). pg2kafka reads them as an incremental
-- snapshot whose chunks lie inside the ranges, and ends each table with a `range_end`
-- marker carrying the ranges: a sink removes the rows it holds in them that are older than
-- the marker (rows the source no longer has), and nothing outside them.
--
-- * snapshot_requests.key_ranges  NULL: the whole table (as before); else the ranges;
-- * snapshot_requests.after_lsn   taken only once the slot's restart position is past it
--                                 (a repair's: the WAL's end when it was filed). A read
--                                 row's version is that position minus one, so its rows
--                                 then carry a version above every change a sink can
--                                 hold for them — the stale version a repair replaces
--                                 included — and are not refused as older;
-- * snapshot_tables.key_ranges    the ranges a table's run reads (its end marker's);
-- * snapshot_chunks.bounds        which of a key chunk's bounds it includes, as a range
--                                 type writes it: '[)' (lower_key <= key < upper_key, as
--                                 before), '(]', '()' or '[]'.
--
-- _walcast.request_repair(tbl, ranges) is the way in: SECURITY DEFINER, executable by
-- the role walcast_repairer only (grant it to the login a sink's `repair` runs as; a
-- `verify`-only login needs walcast_verifier alone). It checks everything it is given —
-- the table's key must be its primary key (the replica identity's) of integer or uuid
-- columns, every bound a list of one value per key column of the column's type — and
-- files one request for each publication publishing the table. Its caller can make
-- pg2kafka read rows of that table again into Kafka; nothing else. (A run reads at most
-- 10,000 ranges of one table per request.)
-- _walcast.repair_progress(ids) tells such a caller how its requests stand.
-- Idempotent.

ALTER TABLE _walcast.snapshot_requests ADD COLUMN IF NOT EXISTS key_ranges jsonb;
ALTER TABLE _walcast.snapshot_requests ADD COLUMN IF NOT EXISTS after_lsn pg_lsn;
ALTER TABLE _walcast.snapshot_tables ADD COLUMN IF NOT EXISTS key_ranges jsonb;
ALTER TABLE _walcast.snapshot_chunks ADD COLUMN IF NOT EXISTS bounds text NOT NULL DEFAULT '[)'
    CHECK (bounds IN ('[)', '(]', '()', '[]'));

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'walcast_repairer') THEN
        BEGIN
            CREATE ROLE walcast_repairer NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'walcast: role walcast_repairer does not exist and % may not create it: only the owner may ask for repairs', current_user
                USING HINT = 'as a superuser run: CREATE ROLE walcast_repairer NOLOGIN; GRANT USAGE ON SCHEMA _walcast TO walcast_repairer; GRANT EXECUTE ON FUNCTION _walcast.request_repair(regclass, jsonb), _walcast.repair_progress(bigint[]) TO walcast_repairer';
        END;
    END IF;
END
$$;

-- The key ranges `ranges` (a JSON array of [lower, upper] pairs) of table `tbl`, checked
-- and written in the shape shared/contract/keyranges.py decides. Not SECURITY DEFINER;
-- called by request_repair only.
CREATE OR REPLACE FUNCTION _walcast.checked_key_ranges(tbl regclass, ranges jsonb)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cols text[];
    types oid[];
    identity "char";
    r jsonb;
    b jsonb;
    out_range jsonb;
    out_bound jsonb;
    out_ranges jsonb := '[]'::jsonb;
    i int;
    v jsonb;
BEGIN
    SELECT array_agg(a.attname::text ORDER BY k.ord), array_agg(a.atttypid ORDER BY k.ord)
      INTO cols, types
      FROM pg_catalog.pg_index x
     CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
      JOIN pg_catalog.pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
     WHERE x.indrelid = tbl AND x.indisprimary;
    IF cols IS NULL THEN
        RAISE EXCEPTION 'walcast: % has no primary key: only a keyed table is read by key ranges', tbl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.relreplident INTO identity FROM pg_catalog.pg_class c WHERE c.oid = tbl;
    IF identity <> 'd' AND NOT (identity = 'i' AND EXISTS (
            SELECT 1 FROM pg_catalog.pg_index x
             WHERE x.indrelid = tbl AND x.indisprimary AND x.indisreplident)) THEN
        RAISE EXCEPTION 'walcast: the replica identity of % is not its primary key: its events are keyed otherwise', tbl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT types <@ ARRAY[20, 21, 23, 2950]::oid[] THEN
        RAISE EXCEPTION 'walcast: the key of % is not made of smallint, integer, bigint or uuid columns: its order is not the same in every sink', tbl
            USING ERRCODE = 'feature_not_supported';
    END IF;
    IF ranges IS NULL OR jsonb_typeof(ranges) <> 'array'
            OR jsonb_array_length(ranges) NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'walcast: key ranges must be a JSON array of 1 to 10000 [lower, upper] pairs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR r IN SELECT e FROM jsonb_array_elements(ranges) AS e LOOP
        IF jsonb_typeof(r) <> 'array' OR jsonb_array_length(r) <> 2 THEN
            RAISE EXCEPTION 'walcast: a key range is not a [lower, upper] pair: %', left(r::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        out_range := '[]'::jsonb;
        FOR b IN SELECT e FROM jsonb_array_elements(r) AS e LOOP
            IF jsonb_typeof(b) = 'null' THEN
                out_range := out_range || jsonb_build_array(NULL::jsonb);
                CONTINUE;
            END IF;
            IF jsonb_typeof(b) <> 'array' OR jsonb_array_length(b) <> cardinality(cols) THEN
                RAISE EXCEPTION 'walcast: a key range''s bound is not null or an array of % key value(s): %',
                    cardinality(cols), left(b::text, 200)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            out_bound := '[]'::jsonb;
            FOR i IN 1 .. cardinality(cols) LOOP
                v := b -> (i - 1);
                IF jsonb_typeof(v) NOT IN ('number', 'string') THEN
                    RAISE EXCEPTION 'walcast: key value % of column % is not a number or a string', left(v::text, 100), cols[i]
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                -- A value of the wrong type fails its cast here, with Postgres's message.
                IF types[i] = 2950 THEN
                    out_bound := out_bound || to_jsonb((v #>> '{}')::uuid::text);
                ELSIF types[i] = 21 THEN
                    out_bound := out_bound || to_jsonb((v #>> '{}')::int2);
                ELSIF types[i] = 23 THEN
                    out_bound := out_bound || to_jsonb((v #>> '{}')::int4);
                ELSE
                    out_bound := out_bound || to_jsonb((v #>> '{}')::int8);
                END IF;
            END LOOP;
            out_range := out_range || jsonb_build_array(out_bound);
        END LOOP;
        out_ranges := out_ranges || jsonb_build_array(out_range);
    END LOOP;
    RETURN jsonb_build_object('columns', to_jsonb(cols), 'ranges', out_ranges);
END
$$;
REVOKE ALL ON FUNCTION _walcast.checked_key_ranges(regclass, jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION _walcast.request_repair(tbl regclass, ranges jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked jsonb := _walcast.checked_key_ranges(tbl, ranges);
    sch text;
    rel text;
    pub text;
    rid bigint;
    filed int := 0;
BEGIN
    SELECT n.nspname, c.relname INTO sch, rel
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = tbl;
    FOR pub IN SELECT p.pubname FROM pg_catalog.pg_publication_tables p
                WHERE p.schemaname = sch AND p.tablename = rel ORDER BY p.pubname LOOP
        INSERT INTO _walcast.snapshot_requests (publication, schema_name, table_name, reason,
                                                requested_by, key_ranges, after_lsn)
        VALUES (pub, sch, rel, 'repair', session_user, checked, pg_catalog.pg_current_wal_lsn())
        RETURNING id INTO rid;
        filed := filed + 1;
        RETURN NEXT rid;
    END LOOP;
    IF filed = 0 THEN
        RAISE EXCEPTION 'walcast: % is in no publication: no pg2kafka streams it', tbl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The slot's restart position moves past the request at the next record of running
    -- transactions the stream decodes: written every 15 s on a busy server, or now
    -- (Postgres 16 on, when the owner may).
    IF pg_catalog.current_setting('server_version_num')::int >= 160000 THEN
        BEGIN
            PERFORM pg_catalog.pg_log_standby_snapshot();
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION _walcast.request_repair(regclass, jsonb) FROM PUBLIC;

-- How the requests `ids` stand: not yet taken ('waiting': for a pg2kafka, or for its slot to
-- pass the request), declined (taken without a run:
-- the table left the publication, or is not streamed), or their run's state ('running',
-- 'done', 'cancelled', 'failed'), with the table's chunks done and planned.
CREATE OR REPLACE FUNCTION _walcast.repair_progress(ids bigint[])
RETURNS TABLE (id bigint, publication text, state text, chunks_done int, chunks_total int)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.id, r.publication,
           CASE WHEN r.taken_at IS NULL THEN 'waiting'
                WHEN s.id IS NULL THEN 'declined'
                ELSE s.state END,
           coalesce(t.chunks_done, 0), coalesce(t.chunks_total, 0)
      FROM _walcast.snapshot_requests r
      LEFT JOIN _walcast.snapshots s ON s.id = r.taken_by
      LEFT JOIN _walcast.snapshot_tables t
             ON t.snapshot_id = s.id AND t.schema_name = r.schema_name
            AND t.table_name = r.table_name
     WHERE r.id = ANY (ids)
     ORDER BY r.id
$$;
REVOKE ALL ON FUNCTION _walcast.repair_progress(bigint[]) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'walcast_repairer') THEN
        GRANT USAGE ON SCHEMA _walcast TO walcast_repairer;
        GRANT EXECUTE ON FUNCTION _walcast.request_repair(regclass, jsonb),
            _walcast.repair_progress(bigint[]) TO walcast_repairer;
    END IF;
END
$$;
