-- pg2kafka V016: a stop for a column that lost its transform rule survives a restart.
--
-- When a column a transform rule covered shows up under a name no rule covers (a column
-- or table renamed, moved to another schema), pg2kafka stops before anything of that
-- shape is sent (services/pg2kafka/transform_shapes.py) and records the column here, by
-- its table's oid and its attribute number, which a rename does not change. At start-up
-- every record of the stream's slot is resolved against the catalog: a column that still
-- exists and that no rule covers under its current name refuses the start (pgoutput sends
-- the new shape once only, and a wildcard rule that still matches another column of the
-- table would otherwise let the renamed one stream in the clear); a covered or vanished
-- column's record is deleted. One row per (slot, table, column). The owner's alone.
-- Idempotent.

CREATE TABLE IF NOT EXISTS "_walcast"."transform_stops" (
    "slot" text NOT NULL,
    "table_oid" oid NOT NULL,
    "attnum" int2 NOT NULL,
    "schema_name" text NOT NULL,
    "table_name" text NOT NULL,
    "column_name" text NOT NULL,
    "rule" text NOT NULL,
    "stopped_at" timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY ("slot", "table_oid", "attnum")
);
REVOKE ALL ON "_walcast"."transform_stops" FROM PUBLIC;
