-- pg2kafka V019: keys of an incremental snapshot's chunk read again.
--
-- A row whose key changed inside a chunk's window is dropped from the chunk (the stream
-- carried that change). When the change was an update that left a TOAST value out
-- (pgoutput sends "unchanged"), a sink that never held the row cannot complete it from
-- that change: pg2kafka then adds a chunk of the same key range holding only those keys
-- (`only_keys`: a JSON array of the keys as the events carry them, each a JSON text), read
-- again in a later window with a fresh version. NULL: every row of the range.
-- Idempotent.

ALTER TABLE _walcast.snapshot_chunks ADD COLUMN IF NOT EXISTS only_keys jsonb;
