"""How a snapshot chunk's rows become Kafka records: one strategy per output format,
chosen once per reader (:func:`read_records`), so a reader's loop is the same whatever
the format.

- **walcast events, fast**: a table with no transform rule whose every column Postgres
  can write as JSON, encoded as JSON — Postgres writes each row's key, new image and row
  hash itself; a record is the event's frame around them (:func:`.chunks.pg_json_frame`),
  one join per row.
- **walcast events, built**: every other table (or Avro): the builder makes each event
  from the columns' text, the producer's encoder encodes it.
- **Debezium**: the connector's ``r`` records (:mod:`services.pg2kafka.debezium_format`).

A record too large for its topic follows the format's rule,
:class:`services.pg2kafka.output.Oversized`. Each strategy hands its records to the
reader's producer itself, yielding every ``every`` rows so the reader can serve Kafka's
acknowledgements and look at its halt flag: a call per row would cost the fast path about
a tenth of its speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import psycopg

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder, append_only, set_epoch
from services.pg2kafka.debezium_format import DebeziumRecords, SnapshotRead
from services.pg2kafka.output import Oversized, ValueEncoder
from services.pg2kafka.routing import Routing, row_key, table_key
from services.pg2kafka.snapshots.chunks import Job, pg_json_frame, pg_json_table
from shared.contract.event import SnapshotInfo
from shared.kafka import BulkKafkaSink

Row = tuple[str | None, ...]
# Sends a chunk's rows (the COPY's) to Kafka in the order read, a record per row — the
# n-th is row n of the chunk (insert-only tables' rows are numbered so) — yielding how
# many rows it handed over since it last yielded: ``every`` each time, then the rest
# (less than ``every``, possibly 0) once the rows are done.
Send = Callable[[Iterable[Row], BulkKafkaSink, int], Iterator[int]]


@dataclass(frozen=True)
class ChunkRows:
    """What every row of one chunk shares: its table, whether its query asks for the rows
    as JSON (:meth:`ReadRecords.json_columns`), the version its rows carry
    (docs/snapshots.md), when it was read, its snapshot's id and chunk, the source's
    epoch, and its topic with the largest record (key and value) that takes."""

    rel: pg.Relation
    json_columns: bool
    version: int
    read_at: str
    info: SnapshotInfo
    epoch: int
    topic: str
    limit: int


class ReadRecords(Protocol):
    """An output format's records of a snapshot's rows, for one reader (not shared
    between threads). Per chunk, the reader asks :meth:`topic` and :meth:`json_columns`
    to build its query, then — inside the chunk's transaction, before its COPY starts —
    :meth:`begin`, and feeds the COPY's rows to what it returns. A failure (a row too
    large for a format without references) is raised from that iteration and fails the
    chunk, which stays claimed and is read again."""

    def topic(self, rel: pg.Relation) -> str:
        """The topic the table's rows go to."""
        ...

    def json_columns(self, rel: pg.Relation) -> bool:
        """Whether the chunk's query asks Postgres for each row's key and new image as
        JSON (two texts per row) rather than each column's text."""
        ...

    def begin(self, conn: psycopg.Connection[Any], chunk: ChunkRows) -> Send:
        """What sends the chunk's rows, made in its transaction on ``conn`` (which it may
        query: the COPY has not begun)."""
        ...


class WalcastReads:
    """walcast's read events (docs/events.md): fast where Postgres can write the JSON,
    built from the columns' text elsewhere."""

    def __init__(
        self,
        database: str,
        builder: EventBuilder,
        values: ValueEncoder,
        routing: Routing,
        oversized: Oversized,
    ) -> None:
        self.database = database
        self.builder = builder
        self.values = values
        self.routing = routing
        self.oversized = oversized

    def topic(self, rel: pg.Relation) -> str:
        return self.routing.topic(self.database, rel.schema, rel.table)

    def json_columns(self, rel: pg.Relation) -> bool:
        # Never for a table a transform rule touches: its values must pass the rules.
        transforms = self.builder.transforms
        return (
            self.values.writes_json
            and (transforms is None or not transforms.touches(rel.schema, rel.table))
            and pg_json_table(rel, self.builder.types)
        )

    def begin(self, conn: psycopg.Connection[Any], chunk: ChunkRows) -> Send:
        if chunk.json_columns:
            return self._fast(chunk)
        return self._built(chunk)

    def _fast(self, chunk: ChunkRows) -> Send:
        return _FastJson(chunk, self.database, self.builder, self.routing, self.oversized)

    def _built(self, chunk: ChunkRows) -> Send:
        rel, limit, topic, epoch = chunk.rel, chunk.limit, chunk.topic, chunk.epoch
        read = self.builder.read
        encode = self.values.encode
        key_of = self.routing.key
        oversized = self.oversized

        def record(n: int, values: Row) -> tuple[bytes, bytes | None]:
            ev = read(rel, values, chunk.version, n, chunk.read_at, chunk.info)
            set_epoch(ev, epoch)
            value = encode(topic, ev)
            key = key_of(ev)
            if len(value) + len(key) > limit:
                value = oversized.event(topic, ev, len(value))
            return value, key

        return lambda rows, sink, every: _send(rows, record, topic, sink, every)


class _FastJson:
    """Sends a chunk's rows as Postgres wrote their JSON (see :data:`Send`)."""

    def __init__(
        self,
        chunk: ChunkRows,
        database: str,
        builder: EventBuilder,
        routing: Routing,
        oversized: Oversized,
    ) -> None:
        rel = chunk.rel
        self.limit, self.topic, self.oversized = chunk.limit, chunk.topic, oversized
        self.frame = pg_json_frame(
            database, rel, chunk.version, chunk.read_at, chunk.info, builder, chunk.epoch,
            append_only=append_only(rel),
        )  # fmt: skip
        self.keyless = not any(c.is_key for c in rel.columns)
        self.per_row_key = routing.mode == "primary_key" and not self.keyless
        self.fixed_key = (
            rel.schema.encode() if routing.mode == "schema" else table_key(rel.schema, rel.table)
        )
        self.schema, self.table = rel.schema, rel.table

    def __call__(self, rows: Iterable[Any], sink: BulkKafkaSink, every: int) -> Iterator[int]:
        # ``rows``: (key JSON or None, new JSON, row hash) each. The hot loop: a read row
        # costs its bytes, one join and one produce call (the loop of :func:`_send`,
        # written out, everything it reads in local variables).
        head, middle, hash_field, tail = self.frame
        keyless, per_row_key, fixed_key = self.keyless, self.per_row_key, self.fixed_key
        schema, table, limit, topic = self.schema, self.table, self.limit, self.topic
        produce, join, loads = sink.producer.produce, b"".join, orjson.loads
        new_field = b',"new":'
        n = 0
        for key_json, new_json, row_hash in rows:
            if key_json is None:
                key_json = "{}" if keyless else new_json
            value = join((head, str(n).encode(), middle, key_json.encode(), new_field,
                          new_json.encode(), hash_field, row_hash.encode(), tail))  # fmt: skip
            key = row_key(schema, table, loads(key_json)) if per_row_key else fixed_key
            if len(value) + len(key) > limit:
                value = self.oversized.event(topic, loads(value), len(value))
            try:
                produce(topic, value, key)
            except BufferError:
                sink.write(topic, value, key)
            n += 1
            if n % every == 0:
                yield every
        yield n % every


class DebeziumReads:
    """The Debezium connector's ``r`` records; ``job``: the snapshot whose start they
    carry."""

    def __init__(self, records: DebeziumRecords, job: Job) -> None:
        self.records = records
        self.job = job

    def topic(self, rel: pg.Relation) -> str:
        return self.records.table(rel).topic

    def json_columns(self, rel: pg.Relation) -> bool:
        return False

    def begin(self, conn: psycopg.Connection[Any], chunk: ChunkRows) -> Send:
        snap = snapshot_read(conn, self.job, chunk.version)
        rel, limit, topic = chunk.rel, chunk.limit, chunk.topic
        read = self.records.read

        def record(_n: int, values: Row) -> tuple[bytes, bytes | None]:
            made = read(rel, values, snap)
            assert made.value is not None
            size = len(made.value) + len(made.key or b"")
            if size > limit:
                raise Oversized.record(f"a row of {rel.schema}.{rel.table}", topic, size, limit)
            return made.value, made.key

        return lambda rows, sink, every: _send(rows, record, topic, sink, every)


def _send(
    rows: Iterable[Row],
    record: Callable[[int, Row], tuple[bytes, bytes | None]],
    topic: str,
    sink: BulkKafkaSink,
    every: int,
) -> Iterator[int]:
    """The rows' records (``record(n, row)``) to ``topic``, as :data:`Send` says."""
    produce = sink.producer.produce
    n = 0
    for values in rows:
        value, key = record(n, values)
        try:
            produce(topic, value, key)
        except BufferError:
            sink.write(topic, value, key)
        n += 1
        if n % every == 0:
            yield every
    yield n % every


def snapshot_read(conn: psycopg.Connection[Any], job: Job, version: int) -> SnapshotRead:
    """The Debezium ``source`` of a chunk's rows, read in its transaction: ``lsn`` the
    slot's restart position (``version`` + 1) — not its consistent point, as the
    connector writes: a transaction that began before that point and committed after it
    is streamed with changes below it, and a sink ordering by LSN would keep the read row
    over them (docs/snapshots-design.md); below every streamed change, the row loses to
    each. Also the run's start and the first transaction the snapshot does not see."""
    row = conn.execute(
        "SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint"
    ).fetchone()
    assert row is not None
    return SnapshotRead(lsn=version + 1, started_us=job.started_us, xid=int(row[0]))
