"""Snapshots: the rows tables already hold, into the stream as ``op: read`` events.

The initial snapshot (``snapshot.mode`` ``initial`` / ``initial_only``) runs when pg2kafka
finds no slot: it creates the slot with an exported snapshot, reads every published
table under that snapshot, and only then starts streaming. A transaction visible in the
exported snapshot is never streamed by the new slot and one not visible always is, so
every row arrives exactly once, as a read row or later as a change; and since streaming
starts only after Kafka acknowledged the whole snapshot, a row's read precedes its
changes in its partition.

The version a read row carries (its ``lsn``) is the slot's ``restart_lsn`` read before the
read, minus one: below every change the read did not see, so such a change wins in every
sink whichever arrives first (the proof: docs/snapshots-design.md). Before streaming
starts the slot does not move, so every chunk of an initial snapshot carries the same
version, also when read again after a restart.

Work is split into chunks: page ranges (``ctid``) of each table, or of each partition
of a partitioned one, ``snapshot.chunk_pages`` pages each, the last open-ended. Readers
(``snapshot.workers`` threads, each with its own connection and producer) claim chunks
from ``_walcast.snapshot_chunks`` (``FOR UPDATE SKIP LOCKED``), so one big table is read
by every reader at once. A chunk is recorded done only after Kafka acknowledged each of
its events (checkpoint last): a run killed at any point resumes at the first unfinished
chunk; the exported snapshot is gone by then, so the rest is read fresh — still exact:
the slot has not moved, every change since its creation is streamed after the snapshot
and wins by version.

Per table, a ``snapshot`` marker with ``phase: start`` goes before its rows and one with
``phase: end`` after them (both carry the table's start version S): at the end marker a
sink removes what it holds of the table with a version below S, i.e. rows that no longer
exist (the end marker of an initial snapshot taken after the slot was lost clears what
was deleted meanwhile).

Row building: a table whose columns are all of types whose JSON Postgres writes exactly
as the stream's conversion does (booleans, integers, text, uuid) has its rows written as
JSON by Postgres (``to_json``), several times faster than converting in Python; any
other table goes through the stream's own converters (:class:`EventBuilder`), from the
same text output pgoutput sends.

The package's parts: :mod:`.chunks` (the tables as snapshots see them, their chunks and
the queries that read one), :mod:`.store` (the durable state of runs, tables and chunks:
the ``SnapshotStore`` protocol and its Postgres implementation; :mod:`.memory` holds the
in-memory one the unit tests use), :mod:`.readers` (reader threads and processes, the
producer they share), :mod:`.progress` (the run's log, bar and metrics),
:mod:`.initial` (the initial snapshot and what follows a new source) and
:mod:`.incremental` (snapshots on a running pipeline).
"""
