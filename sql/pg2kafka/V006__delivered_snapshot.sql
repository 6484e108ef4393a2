-- pg2kafka V006: what a subscription stream has handled, as a snapshot.
--
-- A replication slot can be invalidated (max_slot_wal_keep_size): the WAL after its
-- position is gone, so the slot cannot say which events are still undelivered. The
-- events table can, given a snapshot whose every visible transaction was delivered
-- (or queued for replay): the undelivered events are exactly those whose writing
-- transaction (events.xid) is not visible in it. pg2kafka stores such a snapshot here as
-- the slot's confirmed position passes it, and recovers from it after an invalidation.
-- Idempotent.

ALTER TABLE _walcast.streams ADD COLUMN IF NOT EXISTS delivered_snapshot pg_snapshot;
ALTER TABLE _walcast.streams ADD COLUMN IF NOT EXISTS delivered_snapshot_at timestamptz;

-- Recovery reads every event of a stream by visibility; the stream_id index keeps that
-- from scanning other streams' events.
CREATE INDEX IF NOT EXISTS events_stream_id_idx ON _walcast.events (stream_id, id);
