-- pg2kafka V009: DDL events say which column is which.
--
-- Each column of a DDL event's table schema gains `num`, its pg_attribute.attnum: the
-- number a column keeps through RENAME and never reuses after DROP. Consumers tell a
-- rename (same number, new name) from a drop and an add (numbers gone / new) from it,
-- instead of reading the statement text: a migration that renamed one column and
-- dropped and added others in one message was once taken for the wrong rename.
-- Generated columns are left out: pgoutput does not send their values (before Postgres
-- 18), so a consumer that created them would hold them empty.
-- Idempotent.

CREATE OR REPLACE FUNCTION _walcast.table_schema(rel oid)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object(
        'schema', n.nspname,
        'table', c.relname,
        'columns', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'name', a.attname,
                       'type', t.typname,
                       'sql_type', format_type(a.atttypid, a.atttypmod),
                       'nullable', NOT a.attnotnull,
                       'num', a.attnum)
                   ORDER BY a.attnum)
              FROM pg_attribute a
              JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
               AND a.attgenerated = ''), '[]'::jsonb),
        'primary_key', coalesce((
            SELECT jsonb_agg(a.attname ORDER BY k.ord)
              FROM pg_index i
              CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE i.indrelid = c.oid AND i.indisprimary), '[]'::jsonb))
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = rel
$$;
