-- kafka2postgres's bookkeeping in the target database (docs/kafka2postgres.md, "What the
-- target holds"): the tables walcast writes and how far each got, and the version of every
-- row it holds, deleted rows included (tombstones), so that an older change, redelivered
-- or arriving from another partition, never moves a row back or brings a deleted row back.
-- Idempotent; owned by the role kafka2postgres connects as, nothing granted to PUBLIC.

CREATE SCHEMA IF NOT EXISTS "_walcast_target";
REVOKE ALL ON SCHEMA "_walcast_target" FROM PUBLIC;

CREATE TABLE IF NOT EXISTS "_walcast_target"."tables" (
    "id" serial PRIMARY KEY,
    "source_db" text NOT NULL,
    "source_schema" text NOT NULL,
    "source_table" text NOT NULL,
    "target_schema" text NOT NULL,
    "target_table" text NOT NULL,
    -- walcast made the table: it may alter and drop it (a table it did not make is left
    -- as it is unless target.adopt_tables says otherwise)
    "created_by_walcast" boolean NOT NULL,
    -- changes at or below this version are kept out: the table's last truncate, snapshot
    -- end (its version - 1) or creation
    "floor" bigint NOT NULL DEFAULT -1,
    -- the version of the schema change last applied (older copies are skipped)
    "schema_at" bigint NOT NULL DEFAULT -1,
    -- the columns as last applied: [{"name", "type", "sql_type", "num"}], and the key
    "columns" jsonb NOT NULL DEFAULT '[]',
    "key" text[] NOT NULL DEFAULT '{}',
    -- whether the columns' types came from a DDL event (exact), or from a row's type
    -- names (no length or precision: made exact by the table's next DDL event)
    "exact" boolean NOT NULL DEFAULT false,
    -- renames and drops, for rows older than them: [[version, {"old": "new" | null}]]
    "moves" jsonb NOT NULL DEFAULT '[]',
    -- why the table's changes are not applied (an error the operator must fix), or NULL
    "stopped" text,
    "stopped_at" timestamptz,
    UNIQUE ("source_db", "source_schema", "source_table")
);

-- One row per key a target table holds or held: its version (epoch << 48 | LSN), whether
-- it was deleted, the columns a partial row still lacks, its row hash and transaction.
-- "key" is the key's values as Postgres prints a row of them (ROW(k1, k2)::text).
-- "tbl" is a "tables" id without a foreign key: its check, a trigger per inserted row,
-- doubled the cost of recording a bulk load's versions; kafka2postgres deletes a table's
-- versions with its entry.
CREATE TABLE IF NOT EXISTS "_walcast_target"."rows" (
    "tbl" integer NOT NULL,
    "key" text NOT NULL,
    "version" bigint NOT NULL,
    "deleted" boolean NOT NULL,
    "unfilled" text[],
    "hash" bigint,
    "xid" bigint,
    "at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("tbl", "key")
);
CREATE INDEX IF NOT EXISTS "rows_tombstones"
    ON "_walcast_target"."rows" ("at") WHERE "deleted";

REVOKE ALL ON ALL TABLES IN SCHEMA "_walcast_target" FROM PUBLIC;

-- Event values back into a type's text input (shared/contract/pgtypes.py is the way out):
-- a date or time with an ISO-8601 expanded year ("-0043-03-15", "+12345-01-01", year 0
-- being 1 BC) as Postgres reads it ("0044-03-15 BC", "12345-01-01"); anything else as it is.
CREATE OR REPLACE FUNCTION "_walcast_target"."time_text"(value text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog
AS $$
    SELECT CASE
        WHEN m IS NULL OR (m[1] = '' AND m[2] <> '0000') THEN value
        WHEN m[1] = '+' THEN m[2] || m[3]
        ELSE lpad((1 - (m[1] || m[2])::bigint)::text, 4, '0') || m[3] || ' BC'
    END
    FROM (SELECT regexp_match(value, '^([+-]?)([0-9]{4,})(-.*)$') AS m) AS parsed
$$;

-- An event's JSON array of a type whose values need converting (bytea as base64: kind
-- 'x'; dates and times: 'd', 't', 'z') as the text of a Postgres array of it, nested
-- arrays and NULLs kept; cast by the caller to the column's array type.
CREATE OR REPLACE FUNCTION "_walcast_target"."array_text"(value json, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog
AS $$
DECLARE
    parts text[] := '{}';
    element json;
    item text;
BEGIN
    IF json_typeof(value) = 'null' THEN
        RETURN NULL;
    END IF;
    FOR element IN SELECT e FROM json_array_elements(value) AS e LOOP
        IF json_typeof(element) = 'array' THEN
            item := "_walcast_target"."array_text"(element, kind);
        ELSIF json_typeof(element) = 'null' THEN
            item := 'NULL';
        ELSE
            item := element #>> '{}';
            IF kind = 'x' THEN
                item := '\x' || encode(decode(item, 'base64'), 'hex');
            ELSE
                item := "_walcast_target"."time_text"(item);
            END IF;
            item := '"' || replace(replace(item, '\', '\\'), '"', '\"') || '"';
        END IF;
        parts := parts || item;
    END LOOP;
    RETURN '{' || array_to_string(parts, ',') || '}';
END
$$;

REVOKE ALL ON FUNCTION "_walcast_target"."time_text"(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION "_walcast_target"."array_text"(json, text) FROM PUBLIC;
