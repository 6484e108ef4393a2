-- Versions updated in place (HOT): an update of a row's version touches neither index of
-- "_walcast_target"."rows" when no indexed column changes and its page has room.
-- * "at" is read only for deleted rows (tombstones are forgotten by it): from this
--   version on, kafka2postgres sets it when a row is recorded or deleted and leaves it as
--   it is on other updates (it is in the tombstones' partial index, so changing it on
--   every update made every update a new index entry in both indexes);
-- * pages keep a fifth free for the updated versions (the bulk path COPYs versions
--   into full pages otherwise). Existing pages keep their fill until rewritten.
-- Measured: TPC-B on 10M rows (bench/kafka2postgres_bench.py, docs/benchmarks.md).
-- Idempotent.

ALTER TABLE "_walcast_target"."rows" SET (fillfactor = 80);
