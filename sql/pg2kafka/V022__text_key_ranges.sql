-- pg2kafka V022: snapshots of key ranges of text keys (docs/design.md, "Repair").
--
-- V021 took key ranges of integer and uuid keys only. A text or varchar key orders by its
-- collation in Postgres, but by code point in a search engine's keyword and in Spark: the
-- one order all of them share is code point order, which Postgres gives with
-- COLLATE "C" (shared/contract/keyorder.py). From this version a range's bounds of a text
-- key column are strings, compared so by pg2kafka when it reads the range and by each sink
-- when it removes the rows older than the range's end marker.
--
-- _walcast.checked_key_ranges takes text (25) and varchar (1043) key columns too; nothing
-- else changes (request_repair calls it). Idempotent.

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
    IF NOT types <@ ARRAY[20, 21, 23, 25, 1043, 2950]::oid[] THEN
        RAISE EXCEPTION 'walcast: the key of % is not made of smallint, integer, bigint, uuid, text or varchar columns: its order is not the same in every sink', tbl
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
                IF types[i] IN (25, 1043) THEN
                    -- text is compared by code point (COLLATE "C") by whoever reads the
                    -- range: kept as given, a string, no longer than a keyword holds
                    IF jsonb_typeof(v) <> 'string' OR length(v #>> '{}') > 8191 THEN
                        RAISE EXCEPTION 'walcast: key value % of text column % is not a string of at most 8191 characters', left(v::text, 100), cols[i]
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                    out_bound := out_bound || v;
                ELSIF types[i] = 2950 THEN
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
