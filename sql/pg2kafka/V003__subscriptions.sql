-- pg2kafka V003: database-managed subscriptions and the daily-partitioned events table.
--
-- Applications declare what they want to hear about as rows of _walcast.subscriptions.
-- Every change to that table regenerates exactly the triggers it affects: one function
-- and one deferred constraint trigger per (schema, table, operation), merging every
-- subscription on it. The triggers write shaped events into _walcast.events, which
-- pg2kafka streams to Kafka (and replays from, after an outage).
--
-- Generated SQL quotes every identifier and literal (format %I / %L); generated functions
-- are SECURITY DEFINER with an empty search_path, so they behave the same whoever writes
-- the row. Idempotent: safe to run again.

CREATE TABLE IF NOT EXISTS _walcast.streams (
    id bigint PRIMARY KEY,
    description text,
    -- Failover: the position of the first undelivered event, set once when Kafka became
    -- unavailable and cleared when the replay finished; never overwritten meanwhile.
    failover_checkpoint jsonb,
    -- Replay progress (the last replayed event), so a restart resumes the replay.
    replay_position jsonb,
    last_maintenance_at timestamptz,
    next_maintenance_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS _walcast.subscriptions (
    key text PRIMARY KEY CHECK (key <> ''),
    stream_id bigint NOT NULL REFERENCES _walcast.streams (id) ON DELETE CASCADE,
    operation text NOT NULL CHECK (operation IN ('INSERT', 'UPDATE', 'DELETE')),
    schema_name text NOT NULL,
    table_name text NOT NULL,
    when_clause text,
    column_names text[],
    metadata jsonb,
    payload_extensions jsonb NOT NULL DEFAULT '[]'::jsonb
        CHECK (jsonb_typeof(payload_extensions) = 'array'),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE IF NOT EXISTS _walcast.events_id_seq;

CREATE TABLE IF NOT EXISTS _walcast.events (
    id bigint NOT NULL DEFAULT nextval('_walcast.events_id_seq'),
    payload jsonb NOT NULL,
    metadata jsonb,
    stream_id bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- The writing transaction: lets recovery find events committed after a snapshot.
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (created_at, id)
) PARTITION BY RANGE (created_at);

-- Writes never fail because maintenance is late: rows land here until their day's
-- partition exists, and maintenance moves them there.
CREATE TABLE IF NOT EXISTS _walcast.events_default PARTITION OF _walcast.events DEFAULT;

-- Sets a value at a dotted path ({a,b,c}), creating the intermediate objects.
CREATE OR REPLACE FUNCTION _walcast.jsonb_set_path(target jsonb, path text[], value jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog
AS $$
BEGIN
    target := coalesce(target, '{}'::jsonb);
    IF array_length(path, 1) = 1 THEN
        RETURN jsonb_set(target, path, coalesce(value, 'null'::jsonb), true);
    END IF;
    RETURN jsonb_set(
        target, path[1:1],
        _walcast.jsonb_set_path(
            CASE WHEN jsonb_typeof(target -> path[1]) = 'object' THEN target -> path[1] END,
            path[2:], value),
        true);
END
$$;

-- The row image for a payload: all columns, or only column_names.
CREATE OR REPLACE FUNCTION _walcast.row_sql(rowvar text, columns text[])
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog
AS $$
    SELECT CASE WHEN columns IS NULL THEN format('to_jsonb(%s)', rowvar)
           ELSE format('jsonb_build_object(%s)',
                       (SELECT string_agg(format('%L, %s.%I', c, rowvar, c), ', ' ORDER BY o)
                          FROM unnest(columns) WITH ORDINALITY AS u(c, o)))
           END
$$;

-- Rejects a subscription that cannot work, with a message naming it and the cause;
-- raising aborts the statement, so existing triggers stay as they were.
CREATE OR REPLACE FUNCTION _walcast.validate_subscription(s _walcast.subscriptions)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
    rel oid;
    missing text[];
    ext jsonb;
    probe text;
BEGIN
    SELECT c.oid INTO rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = s.schema_name AND c.relname = s.table_name AND c.relkind IN ('r', 'p');
    IF rel IS NULL THEN
        RAISE EXCEPTION 'subscription %: table %.% does not exist', s.key,
            quote_ident(s.schema_name), quote_ident(s.table_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF s.column_names IS NOT NULL THEN
        SELECT array_agg(c ORDER BY c) INTO missing FROM unnest(s.column_names) c
         WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = rel
                              AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped);
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'subscription %: unknown column(s) % in %.%', s.key, missing,
                quote_ident(s.schema_name), quote_ident(s.table_name)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- Expressions are planned against two empty images of the row named new and old,
    -- which catches unknown columns, functions and type errors now rather than at commit.
    probe := format('SELECT %%s FROM (SELECT * FROM %I.%I LIMIT 0) AS new,' ||
                    ' (SELECT * FROM %I.%I LIMIT 0) AS old',
                    s.schema_name, s.table_name, s.schema_name, s.table_name);
    -- A row image the operation does not have would silently be NULL: reject it.
    IF (s.operation = 'INSERT' AND concat_ws(' ', s.when_clause, s.payload_extensions::text)
            ~* '\mold\s*\.')
       OR (s.operation = 'DELETE' AND concat_ws(' ', s.when_clause, s.payload_extensions::text)
            ~* '\mnew\s*\.') THEN
        RAISE EXCEPTION 'subscription %: an % subscription has no % row to refer to', s.key,
            s.operation, CASE s.operation WHEN 'INSERT' THEN 'OLD' ELSE 'NEW' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF s.when_clause IS NOT NULL THEN
        BEGIN
            EXECUTE format(probe, format('(%s)::boolean', s.when_clause));
        EXCEPTION WHEN OTHERS THEN
            RAISE EXCEPTION 'subscription %: invalid when_clause %: %', s.key,
                s.when_clause, SQLERRM USING ERRCODE = 'invalid_parameter_value';
        END;
    END IF;
    FOR ext IN SELECT * FROM jsonb_array_elements(s.payload_extensions) LOOP
        IF jsonb_typeof(ext -> 'json_path') IS DISTINCT FROM 'string'
           OR jsonb_typeof(ext -> 'expression') IS DISTINCT FROM 'string'
           OR ext ->> 'json_path' = '' THEN
            RAISE EXCEPTION 'subscription %: a payload extension needs json_path and expression (got %)',
                s.key, ext USING ERRCODE = 'invalid_parameter_value';
        END IF;
        BEGIN
            EXECUTE format(probe, format('(SELECT to_jsonb(x) FROM (SELECT (%s) AS x) AS _x)',
                                         ext ->> 'expression'));
        EXCEPTION WHEN OTHERS THEN
            RAISE EXCEPTION 'subscription %: invalid payload extension %: %', s.key,
                ext ->> 'json_path', SQLERRM USING ERRCODE = 'invalid_parameter_value';
        END;
    END LOOP;
END
$$;

-- What generate_trigger last installed for (schema, table, operation), so an unchanged
-- definition issues no DDL at all.
CREATE TABLE IF NOT EXISTS _walcast.generated_triggers (
    schema_name text NOT NULL,
    table_name text NOT NULL,
    operation text NOT NULL,
    function_name text NOT NULL,
    definition_md5 text NOT NULL,
    PRIMARY KEY (schema_name, table_name, operation)
);

-- (Re)creates, or drops, the function and trigger for one (schema, table, operation)
-- from every subscription on it.
CREATE OR REPLACE FUNCTION _walcast.generate_trigger(
    p_schema text, p_table text, p_operation text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
    sub _walcast.subscriptions;
    fn text := 'sub_' || md5(p_schema || '.' || p_table || '.' || p_operation);
    trg text := '_walcast_' || lower(p_operation);
    body text := '';
    whens text[] := '{}';
    any_unconditional boolean := false;
    new_sql text;
    old_sql text;
    ext jsonb;
    definition text;
    previous text;
BEGIN
    FOR sub IN SELECT * FROM _walcast.subscriptions s
                WHERE s.schema_name = p_schema AND s.table_name = p_table
                  AND s.operation = p_operation
                ORDER BY s.key LOOP
        new_sql := CASE WHEN p_operation = 'DELETE' THEN 'NULL::jsonb'
                        ELSE _walcast.row_sql('new', sub.column_names) END;
        old_sql := CASE WHEN p_operation = 'INSERT' THEN 'NULL::jsonb'
                        ELSE _walcast.row_sql('old', sub.column_names) END;
        IF sub.when_clause IS NULL THEN
            any_unconditional := true;
        ELSE
            whens := whens || format('(%s)', sub.when_clause);
        END IF;
        body := body || format(E'\n    -- subscription %s\n    IF %s THEN\n' ||
            '        payload := base || jsonb_build_object(''tg_name'', %L, ''new'', %s,' ||
            E' ''old'', %s);\n',
            replace(sub.key, E'\n', ' '), coalesce(sub.when_clause, 'true'), sub.key,
            new_sql, old_sql);
        FOR ext IN SELECT * FROM jsonb_array_elements(sub.payload_extensions) LOOP
            body := body || format(
                E'        payload := _walcast.jsonb_set_path(payload, %L,' ||
                E' (SELECT to_jsonb(x) FROM (SELECT (%s) AS x) AS _x));\n',
                string_to_array(ext ->> 'json_path', '.'), ext ->> 'expression');
        END LOOP;
        body := body || format(
            E'        INSERT INTO _walcast.events (payload, metadata, stream_id)' ||
            E' VALUES (payload, %L::jsonb, %s);\n    END IF;\n',
            sub.metadata, sub.stream_id);
    END LOOP;

    IF body = '' THEN
        IF EXISTS (SELECT 1 FROM _walcast.generated_triggers g WHERE g.schema_name = p_schema
                      AND g.table_name = p_table AND g.operation = p_operation) THEN
            -- The table may be gone already (its trigger went with it).
            IF to_regclass(format('%I.%I', p_schema, p_table)) IS NOT NULL THEN
                EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I.%I', trg, p_schema, p_table);
            END IF;
            EXECUTE format('DROP FUNCTION IF EXISTS _walcast.%I()', fn);
            DELETE FROM _walcast.generated_triggers g WHERE g.schema_name = p_schema
               AND g.table_name = p_table AND g.operation = p_operation;
        END IF;
        RETURN;
    END IF;

    definition := format(
        E'CREATE OR REPLACE FUNCTION _walcast.%I() RETURNS trigger\n' ||
        E'LANGUAGE plpgsql SECURITY DEFINER SET search_path = ''''\nAS $walcast$\n' ||
        E'DECLARE\n    payload jsonb;\n    base jsonb := jsonb_build_object(' ||
        E'''tg_op'', tg_op, ''tg_table_name'', tg_table_name,' ||
        E' ''tg_table_schema'', tg_table_schema,' ||
        E' ''timestamp'', (extract(epoch from now()) * 1000)::bigint);\nBEGIN%s' ||
        E'    RETURN NULL;\nEND\n$walcast$',
        fn, body)
        || format(E';\nCREATE CONSTRAINT TRIGGER %I AFTER %s ON %I.%I\n' ||
                  'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW%s EXECUTE FUNCTION _walcast.%I()',
                  trg, p_operation, p_schema, p_table,
                  CASE WHEN any_unconditional THEN ''
                       ELSE ' WHEN (' || array_to_string(whens, ' OR ') || ')' END,
                  fn);
    SELECT g.definition_md5 INTO previous FROM _walcast.generated_triggers g
     WHERE g.schema_name = p_schema AND g.table_name = p_table AND g.operation = p_operation;
    IF previous = md5(definition) THEN
        RETURN;  -- identical: no DDL
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgname = trg
                  AND t.tgrelid = format('%I.%I', p_schema, p_table)::regclass) THEN
        EXECUTE format('DROP TRIGGER %I ON %I.%I', trg, p_schema, p_table);
    END IF;
    EXECUTE definition;
    INSERT INTO _walcast.generated_triggers AS g
        VALUES (p_schema, p_table, p_operation, fn, md5(definition))
        ON CONFLICT (schema_name, table_name, operation)
        DO UPDATE SET function_name = EXCLUDED.function_name,
                      definition_md5 = EXCLUDED.definition_md5;
END
$$;

CREATE OR REPLACE FUNCTION _walcast.on_subscriptions_change()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog
AS $$
BEGIN
    IF tg_op IN ('INSERT', 'UPDATE') THEN
        PERFORM _walcast.validate_subscription(new);
    END IF;
    -- A subscription moved to another table or operation leaves its old target too.
    IF tg_op IN ('UPDATE', 'DELETE') THEN
        PERFORM _walcast.generate_trigger(old.schema_name, old.table_name, old.operation);
    END IF;
    IF tg_op IN ('INSERT', 'UPDATE') AND (tg_op = 'INSERT'
        OR (new.schema_name, new.table_name, new.operation)
           IS DISTINCT FROM (old.schema_name, old.table_name, old.operation)) THEN
        PERFORM _walcast.generate_trigger(new.schema_name, new.table_name, new.operation);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION _walcast.touch_subscription()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
BEGIN
    new.updated_at := now();
    RETURN new;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'walcast_subscriptions_changed'
                      AND tgrelid = '_walcast.subscriptions'::regclass) THEN
        CREATE TRIGGER walcast_subscriptions_changed
            AFTER INSERT OR UPDATE OR DELETE ON _walcast.subscriptions
            FOR EACH ROW EXECUTE FUNCTION _walcast.on_subscriptions_change();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'walcast_subscriptions_touch'
                      AND tgrelid = '_walcast.subscriptions'::regclass) THEN
        CREATE TRIGGER walcast_subscriptions_touch
            BEFORE UPDATE ON _walcast.subscriptions
            FOR EACH ROW EXECUTE FUNCTION _walcast.touch_subscription();
    END IF;
END
$$;

-- Declarative: make the stream's subscriptions exactly p_subscriptions. Rows that did
-- not change are not touched, so re-applying an identical set issues no DDL at all.
CREATE OR REPLACE FUNCTION _walcast.set_subscriptions(
    p_stream_id bigint, p_subscriptions _walcast.subscriptions[])
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog
AS $$
BEGIN
    INSERT INTO _walcast.subscriptions AS t
        (key, stream_id, operation, schema_name, table_name, when_clause, column_names,
         metadata, payload_extensions)
    SELECT s.key, p_stream_id, s.operation, s.schema_name, s.table_name, s.when_clause,
           s.column_names, s.metadata, coalesce(s.payload_extensions, '[]'::jsonb)
      FROM unnest(p_subscriptions) s
    ON CONFLICT (key) DO UPDATE SET
        stream_id = EXCLUDED.stream_id, operation = EXCLUDED.operation,
        schema_name = EXCLUDED.schema_name, table_name = EXCLUDED.table_name,
        when_clause = EXCLUDED.when_clause, column_names = EXCLUDED.column_names,
        metadata = EXCLUDED.metadata, payload_extensions = EXCLUDED.payload_extensions
    WHERE (t.stream_id, t.operation, t.schema_name, t.table_name, t.when_clause,
           t.column_names, t.metadata, t.payload_extensions)
          IS DISTINCT FROM
          (EXCLUDED.stream_id, EXCLUDED.operation, EXCLUDED.schema_name, EXCLUDED.table_name,
           EXCLUDED.when_clause, EXCLUDED.column_names, EXCLUDED.metadata,
           EXCLUDED.payload_extensions);
    DELETE FROM _walcast.subscriptions t
     WHERE t.stream_id = p_stream_id
       AND t.key NOT IN (SELECT s.key FROM unnest(p_subscriptions) s);
END
$$;

-- Daily partitions: creates today's and p_premake_days ahead, moves rows that waited in
-- the DEFAULT partition into their day's partition, drops partitions (and DEFAULT rows)
-- older than p_retention_days. Days are UTC. Returns what it did.
CREATE OR REPLACE FUNCTION _walcast.maintain_partitions(
    p_premake_days int DEFAULT 7, p_retention_days int DEFAULT 7,
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog
AS $$
DECLARE
    today date := (p_now AT TIME ZONE 'UTC')::date;
    oldest date := today - p_retention_days;
    d date;
    name text;
    lo timestamptz;
    hi timestamptz;
    created text[] := '{}';
    dropped text[] := '{}';
    moved bigint := 0;
    n bigint;
    part record;
BEGIN
    IF p_premake_days < 0 OR p_retention_days < 1 THEN
        RAISE EXCEPTION 'premake_days must be >= 0 and retention_days >= 1';
    END IF;
    -- Serialise concurrent maintenance (several pg2kafka processes, several streams).
    PERFORM pg_advisory_xact_lock(hashtext('walcast.maintain_partitions'));
    FOR d IN
        SELECT g::date FROM generate_series(today, today + p_premake_days, '1 day') g
        UNION
        SELECT DISTINCT (e.created_at AT TIME ZONE 'UTC')::date FROM _walcast.events_default e
         WHERE e.created_at >= (oldest::timestamp AT TIME ZONE 'UTC')
        ORDER BY 1
    LOOP
        name := 'events_' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(format('_walcast.%I', name)) IS NOT NULL;
        lo := d::timestamp AT TIME ZONE 'UTC';
        hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
        EXECUTE format('CREATE TABLE _walcast.%I (LIKE _walcast.events INCLUDING DEFAULTS' ||
                       ' INCLUDING CONSTRAINTS)', name);
        EXECUTE format('WITH m AS (DELETE FROM _walcast.events_default' ||
                       ' WHERE created_at >= %L AND created_at < %L RETURNING *)' ||
                       ' INSERT INTO _walcast.%I SELECT * FROM m', lo, hi, name);
        GET DIAGNOSTICS n = ROW_COUNT;
        moved := moved + n;
        EXECUTE format('ALTER TABLE _walcast.events ATTACH PARTITION _walcast.%I' ||
                       ' FOR VALUES FROM (%L) TO (%L)', name, lo, hi);
        created := created || name;
    END LOOP;
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = '_walcast.events'::regclass AND c.relname ~ '^events_\d{8}$'
           AND to_date(substr(c.relname, 8), 'YYYYMMDD') < oldest
    LOOP
        EXECUTE format('DROP TABLE _walcast.%I', part.relname);
        dropped := dropped || part.relname::text;
    END LOOP;
    DELETE FROM _walcast.events_default
     WHERE created_at < (oldest::timestamp AT TIME ZONE 'UTC');
    RETURN jsonb_build_object('created', to_jsonb(created), 'dropped', to_jsonb(dropped),
                              'moved_from_default', moved);
END
$$;
