-- pg2kafka V015: DDL messages say which table is which.
--
-- Each table of a DDL message gains `oid`, its pg_class oid, which a table keeps through
-- RENAME and SET SCHEMA. pg2kafka's transform rules follow a table by it: a table renamed
-- away from a rule that names it stops the stream at the DDL itself, before the DDL event
-- or any row of the new name is sent (services/pg2kafka/transform_shapes.py). DDL events
-- in Kafka are unchanged (the oid is not part of them).
-- Idempotent.

CREATE OR REPLACE FUNCTION _walcast.table_schema(rel oid)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object(
        'oid', c.oid,
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
