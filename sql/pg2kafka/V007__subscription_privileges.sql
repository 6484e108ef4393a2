-- pg2kafka V007: subscriptions that cannot escalate privileges.
--
-- Before this migration a subscription's text (key, when_clause, payload expressions) was
-- pasted into a SECURITY DEFINER function owned by whoever ran `init`, and validated by
-- EXECUTE-ing it as that role: anyone allowed to write a subscription could run SQL as the
-- owner. The model from here on (docs/security.md):
--
-- * Roles. The OWNER (the role that runs `init`; superuser not required) owns every
--   walcast object. AUTHORS are members of walcast_admin: they may write subscriptions
--   and streams. walcast_sandbox owns nothing that matters, can read nothing beyond
--   PUBLIC, and everything it runs is read-only. Application roles need nothing.
-- * Text never becomes code in a privileged context. An author's expressions are compiled
--   into a function the AUTHOR owns (_walcast_sub.w_<h>, SECURITY DEFINER: it runs as its
--   author), created by the author's own statement. The owner's generated trigger code
--   holds only quoted identifiers and literals (format %I / %L; the whole body is one
--   %L literal, so no dollar-quote delimiter can end it) and never a key in a comment.
-- * The owner's trigger reaches an author function only through a shim owned by
--   walcast_sandbox (_walcast_sub.c_<h>) with `SET transaction_read_only = on`. If an
--   author turns their function into SECURITY INVOKER, it runs as the sandbox, read-only,
--   with no privileges; it can neither write nor replace the shim (DDL is refused in a
--   read-only transaction, and going back to read-write is refused too).
-- * Expressions see a row image restricted to the columns their author may SELECT
--   (_walcast_sub.r_<h>, built by the owner from has_column_privilege). Projections are
--   checked the same way: a subscription can only ever stream what its author can read.
-- * Expressions are single SQL expressions: no ';', no comment, no dollar quote, balanced
--   parentheses (checked on the text, outside string literals), then parsed by Postgres
--   when the author's function is created. Nothing is executed to validate them.
-- * A subscription that fails at run time (an expression error, a projected column
--   dropped or renamed) never fails the application's commit: its event is quarantined
--   in _walcast.subscription_errors with the reason, a WARNING names the subscription,
--   and pg2kafka exports the count as a metric. Other subscriptions are not affected.
-- * Nothing in _walcast is executable by PUBLIC. maintain_partitions bounds its
--   arguments and keeps any partition holding events a stream has not delivered yet.
-- Idempotent.

-- Roles --------------------------------------------------------------------------------
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['walcast_sandbox', 'walcast_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'walcast: role % does not exist and % may not create it', r,
                    current_user
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = format('as a superuser run: CREATE ROLE walcast_sandbox NOLOGIN;'
                                        ' CREATE ROLE walcast_admin NOLOGIN;'
                                        ' GRANT walcast_sandbox TO %I;', current_user);
            END;
        END IF;
    END LOOP;
    -- The owner hands generated shims to walcast_sandbox (ALTER ... OWNER needs membership).
    IF NOT pg_catalog.pg_has_role(current_user, 'walcast_sandbox', 'USAGE') THEN
        BEGIN
            EXECUTE format('GRANT walcast_sandbox TO %I', current_user);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'walcast: % is not a member of walcast_sandbox', current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('as a superuser run: GRANT walcast_sandbox TO %I;', current_user);
        END;
    END IF;
END
$$;

-- Who wrote a subscription: set by a trigger from current_user, never by the writer.
ALTER TABLE _walcast.subscriptions ADD COLUMN IF NOT EXISTS author name;

-- Where a subscription's failures go instead of failing the application's commit.
CREATE TABLE IF NOT EXISTS _walcast.subscription_errors (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL,
    stream_id bigint NOT NULL,
    schema_name text NOT NULL,
    table_name text NOT NULL,
    operation text NOT NULL,
    sqlstate text NOT NULL,
    message text NOT NULL,
    -- The full row images, so an operator can re-emit the event. Readable by the owner
    -- only: an author may not be allowed to see every column.
    new_row jsonb,
    old_row jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE SCHEMA IF NOT EXISTS _walcast_sub;
COMMENT ON SCHEMA _walcast_sub IS
    'walcast: per-subscription row types (owner), expression functions (their author) and'
    ' read-only shims (walcast_sandbox). Nothing here is called by name from outside.';

-- Helpers ------------------------------------------------------------------------------

-- The name suffix of a subscription's objects: its key and its author, hashed, so no free
-- text ever becomes part of a name and two authors never collide.
CREATE OR REPLACE FUNCTION _walcast.subscription_hash(p_key text, p_author name)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
RETURN md5(p_key || '/' || p_author::text);

CREATE OR REPLACE FUNCTION _walcast.has_expressions(s _walcast.subscriptions)
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN s.when_clause IS NOT NULL
    OR coalesce(jsonb_array_length(s.payload_extensions), 0) > 0;

-- Rejects text that is not one plain SQL expression: a ';' (a second statement), a
-- comment ('--', '/*'), a dollar quote or positional parameter ('$'), or unbalanced
-- parentheses, outside string literals and quoted identifiers. Postgres then parses what
-- passes when the author's function is created; this check only guarantees the text
-- cannot leave the expression it is placed in.
CREATE OR REPLACE FUNCTION _walcast.check_expression(p_key text, p_what text, p_text text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    i int := 1;
    n int := length(p_text);
    c text;
    depth int := 0;
    quote text;
    escapes boolean;
    problem text;
BEGIN
    IF p_text IS NULL OR btrim(p_text) = '' THEN
        problem := 'it is empty';
    END IF;
    WHILE problem IS NULL AND i <= n LOOP
        c := substr(p_text, i, 1);
        IF c IN ('''', '"') THEN
            quote := c;
            -- E'...' strings take backslash escapes; standard strings do not.
            escapes := c = '''' AND i > 1 AND upper(substr(p_text, i - 1, 1)) = 'E'
                       AND (i = 2 OR substr(p_text, i - 2, 1) !~ '[[:alnum:]_]');
            i := i + 1;
            LOOP
                IF i > n THEN
                    problem := 'a quoted string or name is not closed';
                    EXIT;
                END IF;
                c := substr(p_text, i, 1);
                IF escapes AND c = '\' THEN
                    i := i + 2;
                    CONTINUE;
                END IF;
                IF c = quote THEN
                    IF substr(p_text, i + 1, 1) = quote THEN
                        i := i + 2;  -- a doubled quote stays inside
                        CONTINUE;
                    END IF;
                    EXIT;
                END IF;
                i := i + 1;
            END LOOP;
        ELSIF c = ';' THEN
            problem := 'it contains '';'' (only one expression is allowed)';
        ELSIF c = '$' THEN
            problem := 'it contains ''$'' (no dollar quotes or parameters)';
        ELSIF substr(p_text, i, 2) IN ('--', '/*', '*/') THEN
            problem := 'it contains a comment';
        ELSIF c = '(' THEN
            depth := depth + 1;
        ELSIF c = ')' THEN
            depth := depth - 1;
            IF depth < 0 THEN
                problem := 'it closes a parenthesis it did not open';
            END IF;
        END IF;
        i := i + 1;
    END LOOP;
    IF problem IS NULL AND depth <> 0 THEN
        problem := 'a parenthesis is not closed';
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'subscription %: % is not a single SQL expression: %', p_key, p_what,
            problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- Checks that run as the role writing the subscription (SECURITY INVOKER): the table, the
-- author's privileges on what the subscription exposes, and the shape of every expression.
CREATE OR REPLACE FUNCTION _walcast.validate_subscription(s _walcast.subscriptions)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rel oid;
    missing text[];
    ext jsonb;
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
    PERFORM _walcast.check_author_privileges(s, rel);
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
        PERFORM _walcast.check_expression(s.key, 'when_clause', s.when_clause);
    END IF;
    FOR ext IN SELECT * FROM jsonb_array_elements(s.payload_extensions) LOOP
        IF jsonb_typeof(ext -> 'json_path') IS DISTINCT FROM 'string'
           OR jsonb_typeof(ext -> 'expression') IS DISTINCT FROM 'string'
           OR ext ->> 'json_path' = '' THEN
            RAISE EXCEPTION 'subscription %: a payload extension needs json_path and expression (got %)',
                s.key, ext USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM _walcast.check_expression(s.key,
            format('payload extension %s', ext ->> 'json_path'), ext ->> 'expression');
    END LOOP;
END
$$;

-- The author (s.author) may SELECT what the subscription exposes: the whole table when it
-- streams whole rows, else each projected column. Called when the subscription is written
-- and again whenever its trigger is generated.
CREATE OR REPLACE FUNCTION _walcast.check_author_privileges(s _walcast.subscriptions, rel oid)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    denied text[];
BEGIN
    IF s.author IS NULL OR NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = s.author) THEN
        RAISE EXCEPTION 'subscription %: its author % is not a role', s.key, s.author
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF s.column_names IS NULL THEN
        IF NOT has_table_privilege(s.author, rel, 'SELECT') THEN
            RAISE EXCEPTION 'subscription %: role % may not SELECT from %.%', s.key, s.author,
                quote_ident(s.schema_name), quote_ident(s.table_name)
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'grant SELECT on the table, or list only readable columns in column_names';
        END IF;
    ELSE
        SELECT array_agg(c ORDER BY c) INTO denied FROM unnest(s.column_names) c
         WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = rel
                              AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped
                              AND has_column_privilege(s.author, rel, a.attnum, 'SELECT'));
        IF denied IS NOT NULL THEN
            RAISE EXCEPTION 'subscription %: role % may not SELECT column(s) % of %.%', s.key,
                s.author, denied, quote_ident(s.schema_name), quote_ident(s.table_name)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
END
$$;

-- The row image an author's expressions see: a composite type of exactly the columns the
-- author may SELECT, owned by the owner. Recreated (dropping the author's old function
-- with it) only when that column list changed.
CREATE OR REPLACE FUNCTION _walcast.prepare_row_type(p_key text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s _walcast.subscriptions;
    rel oid;
    wanted text;
    existing text;
    typ text;
BEGIN
    SELECT * INTO s FROM _walcast.subscriptions WHERE key = p_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    rel := to_regclass(format('%I.%I', s.schema_name, s.table_name));
    typ := 'r_' || _walcast.subscription_hash(s.key, s.author);
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', '
                      ORDER BY a.attnum)
      INTO wanted
      FROM pg_attribute a
     WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
       AND has_column_privilege(s.author, rel, a.attnum, 'SELECT');
    IF wanted IS NULL THEN
        RAISE EXCEPTION 'subscription %: role % may not SELECT any column of %.%', s.key,
            s.author, quote_ident(s.schema_name), quote_ident(s.table_name)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', '
                      ORDER BY a.attnum)
      INTO existing
      FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
      JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE n.nspname = '_walcast_sub' AND t.typname = typ AND t.typowner = current_user::regrole;
    IF existing IS NOT DISTINCT FROM wanted THEN
        RETURN;
    END IF;
    -- Whatever stands under that name (an out-of-date type, or one somebody else planted in
    -- the schema) goes, with the functions that used it.
    EXECUTE format('DROP TYPE IF EXISTS _walcast_sub.%I CASCADE', typ);
    EXECUTE format('CREATE TYPE _walcast_sub.%I AS (%s)', typ, wanted);
END
$$;

-- Compiles the author's expressions into _walcast_sub.w_<h>(new, old), a function owned by
-- the author and run as the author, returning NULL when when_clause is false and else the
-- array of payload extension values. SECURITY INVOKER: it runs in the author's statement.
CREATE OR REPLACE FUNCTION _walcast.install_expression_function(s _walcast.subscriptions)
RETURNS void
LANGUAGE plpgsql
-- The text was checked under these lexing rules (backslashes only escape in E'...').
SET standard_conforming_strings = on
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h text := _walcast.subscription_hash(s.key, s.author);
    signature text := format('_walcast_sub.%I(new _walcast_sub.%I, old _walcast_sub.%I)',
                             'w_' || h, 'r_' || h, 'r_' || h);
    template text := 'CREATE OR REPLACE FUNCTION %s RETURNS jsonb LANGUAGE sql STABLE'
                     ' SECURITY DEFINER SET search_path = pg_catalog, pg_temp'
                     ' RETURN CASE WHEN (%s)::boolean THEN jsonb_build_array(%s) END';
    value_sql text := '(SELECT to_jsonb(x) FROM (SELECT (%s) AS x) AS _x)';
    -- new and old as the author's function will see them: the readable columns.
    probe text := format('EXPLAIN (COSTS OFF) SELECT %%s FROM'
                         ' (SELECT (r).* FROM (SELECT NULL::_walcast_sub.%1$I AS r) AS _n) AS new,'
                         ' (SELECT (r).* FROM (SELECT NULL::_walcast_sub.%1$I AS r) AS _o) AS old',
                         'r_' || h);
    values_sql text;
    ext jsonb;
    what text;
BEGIN
    -- Each expression alone first, so an error names the one that is wrong. EXPLAIN, as the
    -- author, parses, plans and checks the author's privileges on every table and function
    -- the expression uses; nothing is executed.
    FOR what, values_sql IN
        SELECT 'when_clause', format(probe, format('(%s)::boolean', s.when_clause))
         WHERE s.when_clause IS NOT NULL
        UNION ALL
        SELECT format('payload extension %s', e ->> 'json_path'),
               format(probe, format(value_sql, e ->> 'expression'))
          FROM jsonb_array_elements(s.payload_extensions) e
    LOOP
        BEGIN
            EXECUTE values_sql;
        EXCEPTION WHEN OTHERS THEN
            RAISE EXCEPTION 'subscription %: invalid %: %', s.key, what,
                CASE WHEN SQLERRM ~ '^(missing FROM-clause entry for table|column) "?(new|old)'
                     THEN 'a column it names does not exist or its author may not SELECT it'
                     ELSE SQLERRM END
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'new and old hold the columns the author may SELECT';
        END;
    END LOOP;
    SELECT coalesce(string_agg(format(value_sql, e ->> 'expression'), ', ' ORDER BY o), '')
      INTO values_sql
      FROM jsonb_array_elements(s.payload_extensions) WITH ORDINALITY AS x(e, o);
    EXECUTE format(template, signature, coalesce(s.when_clause, 'true'), values_sql);
    EXECUTE format('COMMENT ON FUNCTION %s IS %L', signature, 'walcast subscription ' || s.key);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', signature);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO walcast_sandbox', signature);
END
$$;

-- Drops every _walcast_sub object no current subscription (key, author) names any more.
CREATE OR REPLACE FUNCTION _walcast.drop_orphaned_subscription_objects()
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o record;
BEGIN
    FOR o IN
        SELECT t.typname AS name FROM pg_type t
         WHERE t.typnamespace = '_walcast_sub'::regnamespace AND t.typname ~ '^r_[0-9a-f]{32}$'
           AND NOT EXISTS (SELECT 1 FROM _walcast.subscriptions s
                            WHERE 'r_' || _walcast.subscription_hash(s.key, s.author) = t.typname
                              AND _walcast.has_expressions(s))
    LOOP
        EXECUTE format('DROP TYPE IF EXISTS _walcast_sub.%I CASCADE', o.name);
    END LOOP;
END
$$;

-- The per-row payload of one subscription, as the owner's trigger builds it.
CREATE OR REPLACE FUNCTION _walcast.row_sql(rowvar text, columns text[])
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN columns IS NULL THEN format('to_jsonb(%s)', rowvar)
           ELSE format('jsonb_build_object(%s)',
                       (SELECT string_agg(format('%L, %s.%I', c, rowvar, c), ', ' ORDER BY o)
                          FROM unnest(columns) WITH ORDINALITY AS u(c, o)))
           END
$$;

-- (Re)creates, or drops, the function and trigger for one (schema, table, operation) from
-- every subscription on it. SECURITY DEFINER (it creates the trigger as the owner); it
-- runs no subscription text: the body it generates holds quoted identifiers and literals
-- and calls each subscription's read-only shim.
CREATE OR REPLACE FUNCTION _walcast.generate_trigger(
    p_schema text, p_table text, p_operation text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sub _walcast.subscriptions;
    rel oid := to_regclass(format('%I.%I', p_schema, p_table));
    fn text := 'sub_' || md5(p_schema || '.' || p_table || '.' || p_operation);
    trg text := '_walcast_' || lower(p_operation);
    body text := '';
    h text;
    typ text;
    cols text;
    old_cols text;
    call_sql text;
    new_sql text;
    old_sql text;
    ext jsonb;
    n int;
    definition text;
    previous text;
BEGIN
    FOR sub IN SELECT * FROM _walcast.subscriptions s
                WHERE s.schema_name = p_schema AND s.table_name = p_table
                  AND s.operation = p_operation
                ORDER BY s.key LOOP
        PERFORM _walcast.check_author_privileges(sub, rel);
        new_sql := CASE WHEN p_operation = 'DELETE' THEN 'NULL::jsonb'
                        ELSE _walcast.row_sql('new', sub.column_names) END;
        old_sql := CASE WHEN p_operation = 'INSERT' THEN 'NULL::jsonb'
                        ELSE _walcast.row_sql('old', sub.column_names) END;
        IF _walcast.has_expressions(sub) THEN
            h := _walcast.subscription_hash(sub.key, sub.author);
            typ := format('_walcast_sub.%I', 'r_' || h);
            -- The row image: the type's columns, each re-checked readable by the author.
            SELECT string_agg(format('new.%I', a.attname), ', ' ORDER BY a.attnum),
                   string_agg(format('old.%I', a.attname), ', ' ORDER BY a.attnum),
                   count(*) FILTER (WHERE NOT has_column_privilege(
                       sub.author, rel, a.attname::text, 'SELECT'))
              INTO cols, old_cols, n
              FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
             WHERE t.typnamespace = '_walcast_sub'::regnamespace AND t.typname = 'r_' || h
               AND t.typowner = current_user::regrole AND a.attnum > 0 AND NOT a.attisdropped
               AND EXISTS (SELECT 1 FROM pg_attribute c WHERE c.attrelid = rel
                              AND c.attname = a.attname AND NOT c.attisdropped);
            IF cols IS NULL OR n > 0 THEN
                RAISE EXCEPTION 'subscription %: its row type is missing or exposes columns'
                    ' its author may not read; write the subscription again', sub.key
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            IF NOT EXISTS (SELECT 1 FROM pg_proc p
                            WHERE p.pronamespace = '_walcast_sub'::regnamespace
                              AND p.proname = 'w_' || h
                              AND p.proargtypes = ARRAY[typ::regtype, typ::regtype]::oidvector
                              AND p.proowner = sub.author::text::regrole AND p.prosecdef) THEN
                RAISE EXCEPTION 'subscription %: its expression function is missing or not'
                    ' owned by its author; write the subscription again', sub.key
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            -- The shim: owned by walcast_sandbox, read-only, holds no subscription text.
            IF NOT EXISTS (SELECT 1 FROM pg_proc p
                            WHERE p.pronamespace = '_walcast_sub'::regnamespace
                              AND p.proname = 'c_' || h
                              AND p.proargtypes = ARRAY[typ::regtype, typ::regtype]::oidvector
                              AND p.proowner = 'walcast_sandbox'::regrole) THEN
                EXECUTE format('DROP FUNCTION IF EXISTS _walcast_sub.%I(%s, %s)',
                               'c_' || h, typ, typ);
                EXECUTE format(
                    'CREATE FUNCTION _walcast_sub.%I(new %s, old %s) RETURNS jsonb'
                    ' LANGUAGE sql STABLE SECURITY DEFINER'
                    ' SET transaction_read_only = on SET search_path = pg_catalog, pg_temp'
                    ' RETURN _walcast_sub.%I(new, old)',
                    'c_' || h, typ, typ, 'w_' || h);
                EXECUTE format('REVOKE ALL ON FUNCTION _walcast_sub.%I(%s, %s) FROM PUBLIC',
                               'c_' || h, typ, typ);
                EXECUTE format('ALTER FUNCTION _walcast_sub.%I(%s, %s) OWNER TO walcast_sandbox',
                               'c_' || h, typ, typ);
            END IF;
            call_sql := format('_walcast_sub.%I(%s, %s)', 'c_' || h,
                CASE WHEN p_operation = 'DELETE' THEN format('NULL::%s', typ)
                     ELSE format('ROW(%s)::%s', cols, typ) END,
                CASE WHEN p_operation = 'INSERT' THEN format('NULL::%s', typ)
                     ELSE format('ROW(%s)::%s', old_cols, typ) END);
        ELSE
            call_sql := '''[]''::jsonb';
        END IF;
        body := body || format(
            E'\n    payload := NULL;\n    BEGIN\n        vals := %s;\n' ||
            E'        IF vals IS NOT NULL THEN\n' ||
            E'            payload := base || jsonb_build_object(''tg_name'', %L, ''new'', %s,' ||
            E' ''old'', %s);\n',
            call_sql, sub.key, new_sql, old_sql);
        n := 0;
        FOR ext IN SELECT * FROM jsonb_array_elements(sub.payload_extensions) LOOP
            body := body || format(
                E'            payload := _walcast.jsonb_set_path(payload, %L, vals -> %s);\n',
                string_to_array(ext ->> 'json_path', '.'), n);
            n := n + 1;
        END LOOP;
        body := body || format(
            E'        END IF;\n    EXCEPTION WHEN OTHERS THEN\n' ||
            E'        payload := NULL;\n' ||
            E'        INSERT INTO _walcast.subscription_errors (key, stream_id, schema_name,' ||
            E' table_name, operation, sqlstate, message, new_row, old_row)\n' ||
            E'        VALUES (%L, %s, tg_table_schema, tg_table_name, tg_op, SQLSTATE, SQLERRM,' ||
            E' %s, %s);\n' ||
            E'        RAISE WARNING ''walcast: subscription %% failed on %%.%%: %% (event' ||
            E' quarantined in _walcast.subscription_errors)'', %L, tg_table_schema,' ||
            E' tg_table_name, SQLERRM;\n    END;\n' ||
            E'    IF payload IS NOT NULL THEN\n' ||
            E'        INSERT INTO _walcast.events (payload, metadata, stream_id)' ||
            E' VALUES (payload, %L::jsonb, %s);\n    END IF;\n',
            sub.key, sub.stream_id,
            CASE WHEN p_operation = 'DELETE' THEN 'NULL' ELSE 'to_jsonb(new)' END,
            CASE WHEN p_operation = 'INSERT' THEN 'NULL' ELSE 'to_jsonb(old)' END,
            sub.key, sub.metadata, sub.stream_id);
    END LOOP;

    IF body = '' THEN
        IF EXISTS (SELECT 1 FROM _walcast.generated_triggers g WHERE g.schema_name = p_schema
                      AND g.table_name = p_table AND g.operation = p_operation) THEN
            -- The table may be gone already (its trigger went with it).
            IF rel IS NOT NULL THEN
                EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I.%I', trg, p_schema, p_table);
            END IF;
            EXECUTE format('DROP FUNCTION IF EXISTS _walcast.%I()', fn);
            DELETE FROM _walcast.generated_triggers g WHERE g.schema_name = p_schema
               AND g.table_name = p_table AND g.operation = p_operation;
        END IF;
        RETURN;
    END IF;

    -- The body is one quoted literal (%L): nothing inside it can end it early.
    definition := format(
        E'CREATE OR REPLACE FUNCTION _walcast.%I() RETURNS trigger\n' ||
        E'LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp\nAS %L',
        fn,
        E'DECLARE\n    payload jsonb;\n    vals jsonb;\n    base jsonb := jsonb_build_object(' ||
        E'''tg_op'', tg_op, ''tg_table_name'', tg_table_name,' ||
        E' ''tg_table_schema'', tg_table_schema,' ||
        E' ''timestamp'', (extract(epoch from now()) * 1000)::bigint);\nBEGIN' || body ||
        E'    RETURN NULL;\nEND\n')
        || format(E';\nCREATE CONSTRAINT TRIGGER %I AFTER %s ON %I.%I\n' ||
                  'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION _walcast.%I()',
                  trg, p_operation, p_schema, p_table, fn);
    SELECT g.definition_md5 INTO previous FROM _walcast.generated_triggers g
     WHERE g.schema_name = p_schema AND g.table_name = p_table AND g.operation = p_operation;
    IF previous = md5(definition) AND EXISTS (
            SELECT 1 FROM pg_trigger t WHERE t.tgname = trg AND t.tgrelid = rel) THEN
        RETURN;  -- identical: no DDL
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgname = trg AND t.tgrelid = rel) THEN
        EXECUTE format('DROP TRIGGER %I ON %I.%I', trg, p_schema, p_table);
    END IF;
    EXECUTE definition;
    EXECUTE format('REVOKE ALL ON FUNCTION _walcast.%I() FROM PUBLIC', fn);
    INSERT INTO _walcast.generated_triggers AS g
        VALUES (p_schema, p_table, p_operation, fn, md5(definition))
        ON CONFLICT (schema_name, table_name, operation)
        DO UPDATE SET function_name = EXCLUDED.function_name,
                      definition_md5 = EXCLUDED.definition_md5;
END
$$;

-- The writer's side of a subscription change. SECURITY INVOKER: validation and the author's
-- expression function run as the role that wrote the row, never as the owner.
CREATE OR REPLACE FUNCTION _walcast.on_subscriptions_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tg_op IN ('INSERT', 'UPDATE') THEN
        PERFORM _walcast.validate_subscription(new);
        IF _walcast.has_expressions(new) THEN
            PERFORM _walcast.prepare_row_type(new.key);
            PERFORM _walcast.install_expression_function(new);
        END IF;
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
    PERFORM _walcast.drop_orphaned_subscription_objects();
    RETURN NULL;
END
$$;

-- Records who wrote the row (current_user: unforgeable by the writer) and when.
CREATE OR REPLACE FUNCTION _walcast.touch_subscription()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    new.author := current_user;
    IF tg_op = 'UPDATE' THEN
        new.updated_at := now();
    END IF;
    RETURN new;
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'walcast_subscriptions_touch'
                  AND tgrelid = '_walcast.subscriptions'::regclass) THEN
        DROP TRIGGER walcast_subscriptions_touch ON _walcast.subscriptions;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'walcast_subscriptions_author'
                      AND tgrelid = '_walcast.subscriptions'::regclass) THEN
        CREATE TRIGGER walcast_subscriptions_author
            BEFORE INSERT OR UPDATE ON _walcast.subscriptions
            FOR EACH ROW EXECUTE FUNCTION _walcast.touch_subscription();
    END IF;
END
$$;

-- SECURITY INVOKER now: the rows it writes carry the caller as their author.
CREATE OR REPLACE FUNCTION _walcast.set_subscriptions(
    p_stream_id bigint, p_subscriptions _walcast.subscriptions[])
RETURNS void
LANGUAGE plpgsql
SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
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

-- Daily partitions, as in V003, with bounded arguments and nothing undelivered dropped: a
-- partition (or a DEFAULT-partition row) past retention is kept while it holds an event
-- of an existing stream that the stream has not delivered (not visible in its delivered
-- snapshot, or waiting in the replay queue). Such partitions are listed under "kept".
CREATE OR REPLACE FUNCTION _walcast.maintain_partitions(
    p_premake_days int DEFAULT 7, p_retention_days int DEFAULT 7,
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    today date;
    oldest date;
    d date;
    name text;
    lo timestamptz;
    hi timestamptz;
    created text[] := '{}';
    dropped text[] := '{}';
    kept text[] := '{}';
    moved bigint := 0;
    n bigint;
    part record;
    undelivered boolean;
BEGIN
    IF p_premake_days IS NULL OR p_premake_days NOT BETWEEN 0 AND 366
       OR p_retention_days IS NULL OR p_retention_days NOT BETWEEN 1 AND 3660
       -- A clock in the future is the one direction that drops more: refuse it.
       OR p_now IS NULL OR p_now > now() + interval '1 day' THEN
        RAISE EXCEPTION 'maintain_partitions: premake_days must be 0..366, retention_days'
            ' 1..3660 and p_now not later than the clock (got %, %, %)',
            p_premake_days, p_retention_days, p_now USING ERRCODE = 'invalid_parameter_value';
    END IF;
    today := (p_now AT TIME ZONE 'UTC')::date;
    oldest := today - p_retention_days;
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
        EXECUTE format(
            'SELECT EXISTS (SELECT 1 FROM _walcast.%I e JOIN _walcast.streams s' ||
            ' ON s.id = e.stream_id WHERE s.delivered_snapshot IS NULL' ||
            ' OR NOT pg_visible_in_snapshot(e.xid, s.delivered_snapshot)' ||
            ' OR EXISTS (SELECT 1 FROM _walcast.replay_queue q' ||
            ' WHERE q.stream_id = e.stream_id AND q.event_id = e.id' ||
            ' AND q.event_created_at = e.created_at))', part.relname)
            INTO undelivered;
        IF undelivered THEN
            kept := kept || part.relname::text;
            RAISE WARNING 'walcast: partition _walcast.% is past retention but holds'
                ' undelivered events; kept', part.relname;
            CONTINUE;
        END IF;
        EXECUTE format('DROP TABLE _walcast.%I', part.relname);
        dropped := dropped || part.relname::text;
    END LOOP;
    DELETE FROM _walcast.events_default e
     WHERE e.created_at < (oldest::timestamp AT TIME ZONE 'UTC')
       AND NOT EXISTS (SELECT 1 FROM _walcast.streams s WHERE s.id = e.stream_id
                          AND (s.delivered_snapshot IS NULL
                               OR NOT pg_visible_in_snapshot(e.xid, s.delivered_snapshot)))
       AND NOT EXISTS (SELECT 1 FROM _walcast.replay_queue q
                        WHERE q.stream_id = e.stream_id AND q.event_id = e.id
                          AND q.event_created_at = e.created_at);
    RETURN jsonb_build_object('created', to_jsonb(created), 'dropped', to_jsonb(dropped),
                              'kept', to_jsonb(kept), 'moved_from_default', moved);
END
$$;

-- The old per-target functions embedded subscription text: regenerate every target with
-- the code above. Rows written before this migration were written by the role running
-- it (init's role), which becomes their author and writes their expression functions.
DO $$
DECLARE
    s _walcast.subscriptions;
    t record;
BEGIN
    ALTER TABLE _walcast.subscriptions DISABLE TRIGGER walcast_subscriptions_changed;
    UPDATE _walcast.subscriptions SET author = current_user WHERE author IS NULL;
    ALTER TABLE _walcast.subscriptions ENABLE TRIGGER walcast_subscriptions_changed;
    FOR s IN SELECT * FROM _walcast.subscriptions WHERE _walcast.has_expressions(subscriptions)
    LOOP
        PERFORM _walcast.prepare_row_type(s.key);
        PERFORM _walcast.install_expression_function(s);
    END LOOP;
    FOR t IN SELECT DISTINCT schema_name, table_name, operation FROM _walcast.subscriptions
    LOOP
        PERFORM _walcast.generate_trigger(t.schema_name, t.table_name, t.operation);
    END LOOP;
    -- Force a rewrite of targets whose definition hash happens to match the old code.
    FOR t IN SELECT g.schema_name, g.table_name, g.operation FROM _walcast.generated_triggers g
    LOOP
        PERFORM _walcast.generate_trigger(t.schema_name, t.table_name, t.operation);
    END LOOP;
END
$$;

-- Privileges ---------------------------------------------------------------------------
-- Nothing in _walcast is executable by PUBLIC; what roles need is granted by name.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA _walcast FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA _walcast REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE ALL ON SCHEMA _walcast FROM PUBLIC;
REVOKE ALL ON SCHEMA _walcast_sub FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA _walcast FROM PUBLIC;

-- Authors: write subscriptions and streams, read their outcome.
GRANT USAGE ON SCHEMA _walcast TO walcast_admin;
GRANT USAGE, CREATE ON SCHEMA _walcast_sub TO walcast_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON _walcast.subscriptions TO walcast_admin;
GRANT SELECT, DELETE ON _walcast.streams TO walcast_admin;
GRANT INSERT (id, description), UPDATE (description) ON _walcast.streams TO walcast_admin;
GRANT SELECT ON _walcast.generated_triggers TO walcast_admin;
GRANT SELECT (id, key, stream_id, schema_name, table_name, operation, sqlstate, message,
              created_at) ON _walcast.subscription_errors TO walcast_admin;
-- What the author's statement runs (invoker functions, and definer functions that take
-- nothing but names and re-check the author's privileges themselves).
GRANT EXECUTE ON FUNCTION
    _walcast.set_subscriptions(bigint, _walcast.subscriptions[]),
    _walcast.validate_subscription(_walcast.subscriptions),
    _walcast.check_author_privileges(_walcast.subscriptions, oid),
    _walcast.check_expression(text, text, text),
    _walcast.subscription_hash(text, name),
    _walcast.has_expressions(_walcast.subscriptions),
    _walcast.prepare_row_type(text),
    _walcast.install_expression_function(_walcast.subscriptions),
    _walcast.generate_trigger(text, text, text),
    _walcast.drop_orphaned_subscription_objects()
    TO walcast_admin;
-- The sandbox reaches author functions through the shims; it owns them, so it needs the
-- schema to hold them (ALTER ... OWNER checks CREATE), but runs nothing that can create.
GRANT USAGE, CREATE ON SCHEMA _walcast_sub TO walcast_sandbox;
