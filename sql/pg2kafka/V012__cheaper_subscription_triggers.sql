-- pg2kafka V012: cheaper subscription triggers (issue 18).
--
-- A generated trigger used to open one exception block (a subtransaction) per subscription
-- and row, and to run one INSERT per event. Now, for a row matched by several
-- subscriptions, all of them are evaluated in one exception block; only if one of them
-- raises are they evaluated again one by one, each in its own block, so the failing one
-- is quarantined and the others are not affected (as before). The row's events are then
-- written by one INSERT, in subscription key order. The handlers also catch
-- assert_failure and query_canceled, which WHEN OTHERS leaves out: an author's function
-- raising either (ASSERT, or RAISE with that SQLSTATE) failed the application's commit
-- before. A real cancel or statement timeout while a subscription is evaluated
-- quarantines that event (kept with its row images) instead of failing the commit.
--
-- The author's expression function and the shim are PL/pgSQL instead of SQL: a SQL
-- function is planned again in every transaction that calls it, a PL/pgSQL one once per
-- session. The security model (V007) is unchanged: the trigger body holds only quoted
-- identifiers and literals and reaches each author's expressions through the read-only
-- shim; the author's text is compiled only into the author's own function, under pinned
-- lexing rules. Idempotent.

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
    k int := 0;
    i int;
    seg text;
    fast text := '';
    alone text := '';
    decls text := '';
    resets text := '';
    rows_sql text := '';
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
                              AND p.proowner = 'walcast_sandbox'::regrole
                              AND p.prolang = (SELECT l.oid FROM pg_language l
                                                WHERE l.lanname = 'plpgsql')) THEN
                EXECUTE format('DROP FUNCTION IF EXISTS _walcast_sub.%I(%s, %s)',
                               'c_' || h, typ, typ);
                EXECUTE format(
                    'CREATE FUNCTION _walcast_sub.%I(new %s, old %s) RETURNS jsonb'
                    ' LANGUAGE plpgsql STABLE SECURITY DEFINER'
                    ' SET transaction_read_only = on SET search_path = pg_catalog, pg_temp'
                    ' AS %L',
                    'c_' || h, typ, typ,
                    format('BEGIN RETURN _walcast_sub.%I(new, old); END', 'w_' || h));
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
        k := k + 1;
        -- This subscription's payload p_<k> (NULL: filtered out, or failed).
        seg := format(
            E'        vals := %s;\n' ||
            E'        IF vals IS NOT NULL THEN\n' ||
            E'            %I := base || jsonb_build_object(''tg_name'', %L, ''new'', %s,' ||
            E' ''old'', %s);\n',
            call_sql, 'p_' || k, sub.key, new_sql, old_sql);
        i := 0;
        FOR ext IN SELECT * FROM jsonb_array_elements(sub.payload_extensions) LOOP
            seg := seg || format(
                E'            %I := _walcast.jsonb_set_path(%I, %L, vals -> %s);\n',
                'p_' || k, 'p_' || k, string_to_array(ext ->> 'json_path', '.'), i);
            i := i + 1;
        END LOOP;
        seg := seg || E'        END IF;\n';
        fast := fast || seg;
        -- The same, alone: its failure quarantines its own event and nothing else.
        alone := alone || format(
            E'    BEGIN\n%s' ||
            E'    EXCEPTION WHEN OTHERS OR assert_failure OR query_canceled THEN\n' ||
            E'        %I := NULL;\n' ||
            E'        INSERT INTO _walcast.subscription_errors (key, stream_id, schema_name,' ||
            E' table_name, operation, sqlstate, message, new_row, old_row)\n' ||
            E'        VALUES (%L, %s, tg_table_schema, tg_table_name, tg_op, SQLSTATE, SQLERRM,' ||
            E' %s, %s);\n' ||
            E'        RAISE WARNING ''walcast: subscription %% failed on %%.%%: %% (event' ||
            E' quarantined in _walcast.subscription_errors)'', %L, tg_table_schema,' ||
            E' tg_table_name, SQLERRM;\n    END;\n',
            seg, 'p_' || k, sub.key, sub.stream_id,
            CASE WHEN p_operation = 'DELETE' THEN 'NULL' ELSE 'to_jsonb(new)' END,
            CASE WHEN p_operation = 'INSERT' THEN 'NULL' ELSE 'to_jsonb(old)' END,
            sub.key);
        decls := decls || format(E'    %I jsonb;\n', 'p_' || k);
        resets := resets || format(E'        %I := NULL;\n', 'p_' || k);
        rows_sql := rows_sql || CASE WHEN k > 1 THEN E',\n        ' ELSE '' END
            || format('(%s, %I, %L::jsonb, %s::bigint)', k, 'p_' || k, sub.metadata,
                      sub.stream_id);
    END LOOP;

    IF k = 0 THEN
        body := '';
    ELSIF k = 1 THEN
        body := alone;
    ELSE
        -- One subtransaction for all of them (each exception block is one); only when one
        -- fails are they evaluated again one by one, each in its own. The expressions are
        -- read-only (the shim), so evaluating one twice changes nothing.
        body := E'    BEGIN\n' || fast
            || E'    EXCEPTION WHEN OTHERS OR assert_failure OR query_canceled THEN\n' || resets
            || alone || E'    END;\n';
    END IF;
    IF k > 0 THEN
        -- One statement writes the row's events, in subscription (key) order.
        body := body || E'    INSERT INTO _walcast.events (payload, metadata, stream_id)\n'
            || E'    SELECT e.payload, e.metadata, e.stream_id FROM (VALUES\n        '
            || rows_sql || E')\n        AS e(n, payload, metadata, stream_id)\n'
            || E'     WHERE e.payload IS NOT NULL ORDER BY e.n;\n';
    END IF;

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
        E'DECLARE\n' || decls || E'    vals jsonb;\n    base jsonb := jsonb_build_object(' ||
        E'''tg_op'', tg_op, ''tg_table_name'', tg_table_name,' ||
        E' ''tg_table_schema'', tg_table_schema,' ||
        E' ''timestamp'', (extract(epoch from now()) * 1000)::bigint);\nBEGIN\n' || body ||
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

-- The statement that (re)creates _walcast_sub.w_<h>(new, old), the author's expression
-- function: NULL when when_clause is false, else the array of payload extension values.
-- It executes nothing; its caller runs the statement (install_expression_function, as the
-- author; this migration, over functions the author already owns).
--
-- PL/pgSQL, not SQL: a SQL function is planned again in every transaction that calls it
-- (its stored body parsed back into a tree first), which made the expressions most of a
-- subscription's cost per row; PL/pgSQL keeps the plan for the session. Its body is lexed
-- when a session first calls it, so the lexing rules the text was checked under are
-- pinned on the function (applied before the body is compiled, whoever calls it): standard
-- strings, and backslash_quote on (in E'...' a \' is an escaped quote, as the check reads
-- it, whatever the caller's client encoding). The body is one quoted literal (%L);
-- use_column: names resolve as in a SQL function.
CREATE OR REPLACE FUNCTION _walcast.expression_function_sql(s _walcast.subscriptions)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format(
        'CREATE OR REPLACE FUNCTION _walcast_sub.%I(new _walcast_sub.%I, old _walcast_sub.%I)'
        ' RETURNS jsonb LANGUAGE plpgsql STABLE SECURITY DEFINER'
        ' SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on'
        ' SET backslash_quote = on AS %L',
        'w_' || h, 'r_' || h, 'r_' || h,
        format(E'#variable_conflict use_column\nBEGIN\n    RETURN CASE WHEN (%s)::boolean' ||
               E' THEN jsonb_build_array(%s) END;\nEND',
               coalesce(s.when_clause, 'true'),
               (SELECT coalesce(string_agg(
                           format('(SELECT to_jsonb(x) FROM (SELECT (%s) AS x) AS _x)',
                                  e ->> 'expression'), ', ' ORDER BY o), '')
                  FROM jsonb_array_elements(s.payload_extensions) WITH ORDINALITY AS x(e, o))))
      FROM (SELECT _walcast.subscription_hash(s.key, s.author) AS h) AS _h
$$;

-- Validates the author's expressions and compiles them (expression_function_sql). SECURITY
-- INVOKER: it runs in the author's statement, as the author.
CREATE OR REPLACE FUNCTION _walcast.install_expression_function(s _walcast.subscriptions)
RETURNS void
LANGUAGE plpgsql
-- The text was checked under these lexing rules (backslashes only escape in E'...').
SET standard_conforming_strings = on
SET backslash_quote = on
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h text := _walcast.subscription_hash(s.key, s.author);
    signature text := format('_walcast_sub.%I(new _walcast_sub.%I, old _walcast_sub.%I)',
                             'w_' || h, 'r_' || h, 'r_' || h);
    value_sql text := '(SELECT to_jsonb(x) FROM (SELECT (%s) AS x) AS _x)';
    -- new and old as the author's function will see them: the readable columns.
    probe text := format('EXPLAIN (COSTS OFF) SELECT %%s FROM'
                         ' (SELECT (r).* FROM (SELECT NULL::_walcast_sub.%1$I AS r) AS _n) AS new,'
                         ' (SELECT (r).* FROM (SELECT NULL::_walcast_sub.%1$I AS r) AS _o) AS old',
                         'r_' || h);
    values_sql text;
    what text;
BEGIN
    -- Each expression alone first, so an error names the one that is wrong. EXPLAIN, as the
    -- author, parses, plans and checks the author's privileges on every table and function
    -- the expression uses; it runs in the author's own statement, never in anyone else's.
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
    EXECUTE _walcast.expression_function_sql(s);
    EXECUTE format('COMMENT ON FUNCTION %s IS %L', signature, 'walcast subscription ' || s.key);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', signature);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO walcast_sandbox', signature);
END
$$;

REVOKE ALL ON FUNCTION _walcast.expression_function_sql(_walcast.subscriptions) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION _walcast.expression_function_sql(_walcast.subscriptions)
    TO walcast_admin;

-- Existing subscriptions' expression functions become PL/pgSQL where the role running
-- this has the privileges of their author (a superuser, or a member): CREATE OR REPLACE
-- of the function the author owns, which stays the author's. Nothing of the author's
-- runs here: the text was validated when it was written and is only compiled (the
-- PL/pgSQL validator parses, executes nothing). No SET ROLE: code run as the author
-- could RESET ROLE back to the role running the migration. Functions of other authors
-- (and of roles since dropped) keep working as SQL functions, only slower, until the
-- author writes the subscription again.
DO $$
DECLARE
    s _walcast.subscriptions;
    h text;
BEGIN
    FOR s IN SELECT * FROM _walcast.subscriptions x ORDER BY x.key LOOP
        h := _walcast.subscription_hash(s.key, s.author);
        CONTINUE WHEN s.author IS NULL OR to_regrole(quote_ident(s.author)) IS NULL
            OR NOT _walcast.has_expressions(s)
            OR NOT pg_has_role(current_user, to_regrole(quote_ident(s.author)), 'USAGE')
            OR NOT EXISTS (SELECT 1 FROM pg_proc p
                            WHERE p.pronamespace = '_walcast_sub'::regnamespace
                              AND p.proname = 'w_' || h
                              AND p.proowner = to_regrole(quote_ident(s.author))
                              AND p.prosecdef);
        BEGIN
            EXECUTE _walcast.expression_function_sql(s);
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'walcast: the expressions of subscription % stay as they were: %',
                s.key, SQLERRM;
        END;
    END LOOP;
END
$$;

-- Rewrite every generated trigger with the code above. A target whose subscriptions no
-- longer pass the privilege checks keeps its current trigger, with a warning: writing
-- the subscription again (as its author) regenerates it.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT g.schema_name, g.table_name, g.operation FROM _walcast.generated_triggers g
    LOOP
        BEGIN
            PERFORM _walcast.generate_trigger(t.schema_name, t.table_name, t.operation);
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'walcast: the trigger for % on %.% was not rewritten: %',
                t.operation, t.schema_name, t.table_name, SQLERRM;
        END;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION _walcast.generate_trigger(text, text, text) FROM PUBLIC;
