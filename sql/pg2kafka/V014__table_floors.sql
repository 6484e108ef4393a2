-- pg2kafka V014: table-level positions survive a restart.
--
-- Sinks keep out every change at or below a table's last truncate or creation (its
-- "floor"), so the rows an incremental snapshot reads must carry a version above it
-- (shared/contract/event.py, "Versions"). pg2kafka knew the floor only in memory, or in
-- _walcast.snapshot_tables for runs already running when it happened: a table created
-- after the slot and snapshotted later (pgbench -i, pg_restore: create, fill, add the key)
-- lost its creation position with a restart, and the resumed chunks' rows went out below
-- it — refused by the search index as stale, silently. Now every truncate and creation of
-- a streamed table is recorded here, on the stream's thread, before its position can be
-- confirmed. One row per (slot, table); the floor only rises. The owner's alone.
-- Idempotent.

CREATE TABLE IF NOT EXISTS _walcast.table_floors (
    slot text NOT NULL,
    schema_name text NOT NULL,
    table_name text NOT NULL,
    floor_lsn pg_lsn NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot, schema_name, table_name)
);
REVOKE ALL ON _walcast.table_floors FROM PUBLIC;
