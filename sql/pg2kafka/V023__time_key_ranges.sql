-- pg2kafka V023: snapshots of key ranges of date, timestamp, timestamptz and char(n) keys
-- (docs/design.md, "Repair"; shared/contract/keyorder.py).
--
-- V022 took integer, uuid, text and varchar key columns. A date or timestamp key is
-- compared by every sink by its text as events carry it (ISO-8601 with a `T`, the
-- fraction without trailing zeros, `+00:00` for a timestamptz), whose code point order is
-- the time order for the years 1 to 9999; a char(n) key by its blank-padded text, whose
-- code point order is Postgres's (COLLATE "C") unless it holds a control character.
--
-- _walcast.checked_key_ranges takes bpchar (1042), date (1082), timestamp (1114) and
-- timestamptz (1184) key columns too: a time bound is cast to the column's type, refused
-- outside the years 1 to 9999 (infinity included), and written in that text, whatever
-- the session's DateStyle or TimeZone; a char(n) bound is padded to n (as the sinks hold
-- such a key), and refused with a control character.
-- Nothing else changes (request_repair calls it). Idempotent.

-- A date, timestamp or timestamptz key value (`typ`: its type's oid) as every sink compares
-- it: the events' text (shared/contract/keyorder.py key_text). Refused outside the years 1
-- to 9999, where that text no longer sorts as time does. Not SECURITY DEFINER.
CREATE OR REPLACE FUNCTION _walcast.key_time_text(val text, typ oid, col text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ts timestamp;
    out text;
BEGIN
    IF typ = 1082 THEN
        ts := val::date::timestamp;
    ELSIF typ = 1114 THEN
        ts := val::timestamp;
    ELSE
        -- in UTC whatever the session's TimeZone (a bound without an offset is read in it)
        ts := val::timestamptz AT TIME ZONE 'UTC';
    END IF;
    IF NOT (ts >= '0001-01-01'::timestamp AND ts < '10000-01-01'::timestamp) THEN
        RAISE EXCEPTION 'walcast: key value % of column % is outside the years 1 to 9999: its order is not the same in every sink', left(val, 100), col
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF typ = 1082 THEN
        RETURN to_char(ts, 'YYYY-MM-DD');
    END IF;
    out := regexp_replace(to_char(ts, 'YYYY-MM-DD"T"HH24:MI:SS.US'), '[.]?0+$', '');
    RETURN out || CASE WHEN typ = 1184 THEN '+00:00' ELSE '' END;
END
$$;
REVOKE ALL ON FUNCTION _walcast.key_time_text(text, oid, text) FROM PUBLIC;

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
    typmods int[];
    identity "char";
    r jsonb;
    b jsonb;
    out_range jsonb;
    out_bound jsonb;
    out_ranges jsonb := '[]'::jsonb;
    i int;
    v jsonb;
BEGIN
    SELECT array_agg(a.attname::text ORDER BY k.ord), array_agg(a.atttypid ORDER BY k.ord),
           array_agg(a.atttypmod ORDER BY k.ord)
      INTO cols, types, typmods
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
    IF NOT types <@ ARRAY[20, 21, 23, 25, 1042, 1043, 1082, 1114, 1184, 2950]::oid[] THEN
        RAISE EXCEPTION 'walcast: the key of % is not made of smallint, integer, bigint, uuid, text, varchar, char(n), date, timestamp or timestamptz columns: its order is not the same in every sink', tbl
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
                ELSIF types[i] = 1042 THEN
                    -- char(n): compared blank-padded by every sink, so padded to n here
                    -- (Postgres compares it without its blanks: "abc" and "abc  " are one
                    -- key); a control character would sort differently padded, refused
                    IF jsonb_typeof(v) <> 'string' OR length(v #>> '{}') > 8191
                            OR (v #>> '{}') ~ ('[' || chr(1) || '-' || chr(31) || ']') THEN
                        RAISE EXCEPTION 'walcast: key value % of char(n) column % is not a string of at most 8191 characters without control characters', left(v::text, 100), cols[i]
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                    out_bound := out_bound || to_jsonb(CASE WHEN typmods[i] > 4
                        THEN rpad(rtrim(v #>> '{}', ' '),
                                  greatest(typmods[i] - 4, length(rtrim(v #>> '{}', ' '))))
                        ELSE v #>> '{}' END);
                ELSIF types[i] IN (1082, 1114, 1184) THEN
                    out_bound := out_bound || to_jsonb(_walcast.key_time_text(v #>> '{}', types[i], cols[i]));
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
