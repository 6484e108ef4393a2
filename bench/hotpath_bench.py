"""Per-record cost of the hot paths, in process, no stack needed.

What every record pays, measured on this machine against a baseline in the same run:

* **pg2kafka**: a pgoutput Insert message (raw bytes) → decoded → change event → encoded
  JSON. Baseline: the least any producer does with the same row — zip the column texts
  into a dict and ``orjson.dumps`` it.
* **pg2kafka-stream**: the same messages, decoded, through the CDC stream's whole
  per-message path (transaction bookkeeping, event, filter, key, topic, encoding, ack
  tracker; the Kafka sink a null one). Same baseline.
* **pg2kafka-snapshot**: a chunk of a snapshot, as Postgres's COPY gives it on the fast
  path (each row's key and new image as JSON), through the reader's whole per-row path
  (``Reader.read``: the frame, the key, the size check, the produce call) — Postgres a
  stand-in connection, the producer a null one. Baseline: join the same two texts into
  one value.
* **kafka2search**: a CDC record → the consumer loop's ``handle`` (the contract's
  decoder, the index lookup, folding into the batch, the offset) → its bulk-body lines.
  Baseline: ``orjson.loads`` of the same record.

Each case runs ``--rounds`` times over ``--records`` records and keeps the best round
(the least disturbed by the rest of the machine). ``--ref GIT_REF`` also measures the
code of another commit (a temporary worktree, same records, rounds interleaved with this
tree's) so a change can be compared with its parent in one run: ``--ref HEAD~1``.

Prints a table; writes ``bench/results/hotpath.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

COLUMNS = [("id", 23), ("email", 25), ("name", 1043), ("score", 1700), ("active", 16),
           ("created", 1184), ("tags", 1009), ("payload", 3802)]  # fmt: skip


def _texts(i: int) -> list[str]:
    return [
        str(i), f"user{i}@example.com", f"User Number {i}", f"{i % 1000}.{i % 100:02d}",
        "t" if i % 2 else "f", "2026-11-23 10:11:12.123456+00", '{a,"b c",NULL}',
        f'{{"n": {i}, "k": ["x", "y"]}}',
    ]  # fmt: skip


def _insert_bytes(oid: int, texts: list[str]) -> bytes:
    out = [b"I", struct.pack("!I", oid), b"N", struct.pack("!h", len(texts))]
    for t in texts:
        data = t.encode()
        out += [b"t", struct.pack("!i", len(data)), data]
    return b"".join(out)


def _relation_bytes(oid: int) -> bytes:
    out = [b"R", struct.pack("!I", oid), b"public\0", b"users\0", b"d",
           struct.pack("!h", len(COLUMNS))]  # fmt: skip
    for i, (name, type_oid) in enumerate(COLUMNS):
        out += [struct.pack("!b", 1 if i == 0 else 0), name.encode() + b"\0",
                struct.pack("!Ii", type_oid, -1)]  # fmt: skip
    return b"".join(out)


def pg2kafka_case(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(walcast, baseline) over ``n`` Insert messages."""
    import orjson

    from services.pg2kafka import pgoutput as pg
    from services.pg2kafka.changes import EventBuilder
    from services.pg2kafka.types import TypeRegistry

    try:
        from shared.contract.event import encode
    except ImportError:  # before the contract package
        from shared.events import JsonEventSerializer

        encode = JsonEventSerializer().encode

    oid = 16400
    messages = [_insert_bytes(oid, _texts(i)) for i in range(n)]
    rows = [_texts(i) for i in range(n)]
    names = [c for c, _ in COLUMNS]
    builder = EventBuilder("bench", TypeRegistry())
    relation = pg.decode(_relation_bytes(oid))
    assert isinstance(relation, pg.Relation)
    builder.relation(relation)
    begin = pg.Begin(1 << 32, 0, 1)

    def walcast() -> None:
        builder.begin(begin)
        decode, change = pg.decode, builder.change
        for lsn, m in enumerate(messages):
            msg = decode(m)
            assert isinstance(msg, pg.Insert)
            for ev in change(msg, lsn):
                encode(ev)
        builder.txn = None

    def baseline() -> None:
        dumps = orjson.dumps
        for texts in rows:
            dumps(dict(zip(names, texts, strict=True)))

    return walcast, baseline


class _NullSink:
    """Stands in for the Kafka sink: takes records, keeps nothing."""

    inflight_bytes = 0
    waits = 0

    def write(self, item: Any, position: int) -> None:
        pass

    def close(self) -> None:
        pass


def _stream_dispatch() -> tuple[Callable[[int, Any], None], Any]:
    """(handle one decoded message, the session) of pg2kafka's CDC stream, whichever
    shape this tree's code has; the Kafka sink is a null one."""
    import threading

    from prometheus_client import CollectorRegistry

    from services.pg2kafka.settings import Pg2KafkaSettings
    from shared.settings import load_settings

    settings = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False},
        kafka={"bootstrap_servers": "127.0.0.1:1"},
    )  # fmt: skip
    try:
        import services.pg2kafka.cdc as cdc
        from services.pg2kafka.metrics import Metrics
        from services.pg2kafka.session import Liveness, ReplicationSession
        from services.pg2kafka.topics import StreamTarget

        target = StreamTarget.cdc(settings)
        session = ReplicationSession(
            settings, target, Metrics(CollectorRegistry()), threading.Event(), Liveness()
        )
        # cdc_handler: the format's handler (before it, one CdcHandler for every format)
        handler = getattr(cdc, "cdc_handler", cdc.CdcHandler)(settings, target)
        session.sink.close()
        session.sink = _NullSink()  # type: ignore[assignment]
        # The topic as if learnt from Kafka at start-up (no broker here).
        topics = getattr(session, "topics", None)
        if topics is not None and hasattr(topics, "max_value_bytes"):
            topics.partitions[target.topic] = 1
            topics.max_value_bytes[target.topic] = settings.producer.max_message_bytes

        def dispatch(lsn: int, msg: Any) -> None:
            session.dispatch(handler, lsn, msg)

        return dispatch, session
    except ImportError:  # before the split: Pipeline and _Stream
        from services.pg2kafka.app import Metrics as OldMetrics
        from services.pg2kafka.app import Pipeline, _Stream
        from services.pg2kafka.app import StreamTarget as OldTarget

        pipeline = Pipeline(
            settings, OldMetrics(CollectorRegistry()), threading.Event(), OldTarget.cdc(settings)
        )
        st = _Stream(pipeline, settings.postgres.conninfo())
        st.sink.close()
        st.sink = _NullSink()
        return st.handle, st


def pg2kafka_stream_case(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """Decoded Insert messages through the CDC stream's whole per-message path: the
    transaction bookkeeping, the event, the filter, key and topic, the encoding, the
    tracker and the (null) sink."""
    import orjson

    from services.pg2kafka import pgoutput as pg

    oid = 16400
    raw = [_insert_bytes(oid, _texts(i)) for i in range(n)]
    rows = [_texts(i) for i in range(n)]
    names = [c for c, _ in COLUMNS]
    dispatch, holder = _stream_dispatch()
    dispatch(0, pg.decode(_relation_bytes(oid)))
    txn = [0]

    def walcast() -> None:
        txn[0] += 1
        base = txn[0] << 32
        dispatch(base, pg.Begin(base + n + 1, 0, txn[0]))
        decode = pg.decode
        for i, m in enumerate(raw):
            dispatch(base + i, decode(m))
        dispatch(base + n, pg.Commit(base + n, base + n + 1, 0))
        holder.tracker = type(holder.tracker)()  # no acks come: start each round afresh

    def baseline() -> None:
        dumps = orjson.dumps
        for texts in rows:
            dumps(dict(zip(names, texts, strict=True)))

    return walcast, baseline


class _Msg:
    """The parts of a confluent_kafka Message the consumer loop reads."""

    __slots__ = ("_o", "_v")

    def __init__(self, offset: int, value: bytes) -> None:
        self._o, self._v = offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "bench.cdc"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return self._v

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)  # TIMESTAMP_CREATE_TIME, at 0 ms


def _loop_handle() -> tuple[Callable[[Any], None], Callable[[], Any], Callable[[], None]]:
    """(handle one message, the batch in hand, start a new batch) of kafka2search's
    consumer loop, whichever shape this tree's code has; the engine is a fake that knows
    the bench's index, so nothing leaves the process."""
    import threading

    from prometheus_client import CollectorRegistry

    from services.kafka2search.engines import SearchEngine
    from services.kafka2search.settings import Kafka2SearchSettings
    from shared.settings import load_settings

    class NotFoundError(Exception):
        status_code = 404

    class Engine(SearchEngine):
        name = "bench engine"

        def __init__(self, client: Any = None) -> None:
            pass

        def resolve_alias(self, alias: str) -> str | None:
            return None

        def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            # The index registry: nothing registered yet (a new index, not a lost one).
            if method == "GET":
                raise NotFoundError(path)
            return {}

        def create_index(self, *args: Any, **kwargs: Any) -> bool:
            return True

    settings = load_settings(
        Kafka2SearchSettings, env_file=None, http={"enabled": False},
        kafka={"bootstrap_servers": "127.0.0.1:1"}, batch={"max_docs": 10**9},
    )  # fmt: skip
    engine = Engine(client=None)
    try:
        from services.kafka2search.app import consumer_loop

        loop, _ = consumer_loop(settings, engine, CollectorRegistry(), threading.Event())

        def reset() -> None:
            loop.batch = loop.sink.new_batch()

        return loop.handle, lambda: loop.batch, reset
    except ImportError:  # before the shared consumer loop
        from services.kafka2search.app import Metrics, SearchPipeline
        from services.kafka2search.documents import Batch

        p = SearchPipeline(settings, engine, Metrics(CollectorRegistry()), threading.Event())

        def reset_old() -> None:
            p.batch = Batch()

        return p.handle, lambda: p.batch, reset_old


def kafka2search_case(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
    import orjson

    from services.kafka2search.documents import bulk_body

    records = [
        orjson.dumps(
            {"v": 1, "op": "insert", "db": "bench", "schema": "public", "table": "users",
             "lsn": 1000 + i, "seq": 0, "commit_lsn": 1000 + i, "xid": 7,
             "commit_ts": "2026-11-23T10:11:12.123456Z", "key": {"id": i},
             "new": {"id": i, "email": f"user{i}@example.com", "name": f"User {i}",
                     "score": "12.50", "active": True, "tags": ["a", "b c", None]},
             "old": None,
             "types": {"id": "int4", "email": "text", "name": "varchar", "score": "numeric",
                       "active": "bool", "tags": "_text"}}
        )
        for i in range(n)
    ]  # fmt: skip
    messages = [_Msg(offset, value) for offset, value in enumerate(records)]
    handle, batch, reset = _loop_handle()

    def walcast() -> None:
        reset()
        for msg in messages:
            handle(msg)
            if len(batch()) >= 1000:
                bulk_body(list(batch().docs.values()))
                reset()
        if batch().records:
            bulk_body(list(batch().docs.values()))

    def baseline() -> None:
        loads = orjson.loads
        for value in records:
            loads(value)

    return walcast, baseline


SNAPSHOT_COLUMNS = [("id", 23), ("email", 25), ("name", 1043), ("score", 20), ("active", 16)]


class _Copy:
    """psycopg's COPY as the reader uses it: the rows, as texts."""

    def __init__(self, rows: list[tuple[str, ...]]) -> None:
        self._rows = rows

    def __enter__(self) -> _Copy:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_types(self, types: list[str]) -> None:
        pass

    def rows(self) -> Any:
        return iter(self._rows)


class _Conn:
    """A connection that answers the reader's few questions (a table's name, a key
    column's type) and hands it the chunk's COPY."""

    def __init__(self, rows: list[tuple[str, ...]]) -> None:
        self._rows = rows

    def transaction(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def execute(self, query: Any, params: Any = None) -> Any:
        class _Result:
            def fetchone(self) -> tuple[str, str]:
                return ("public", "users")

        return _Result()

    def cursor(self) -> Any:
        rows = self._rows

        class _Cursor:
            def copy(self, query: Any) -> _Copy:
                return _Copy(rows)

        return _Cursor()

    def cancel_safe(self) -> None:
        pass


class _NullProducer:
    def produce(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        pass


class _NullBulkSink:
    """Stands in for the snapshot's bulk producer: takes records, keeps nothing."""

    producer = _NullProducer()

    def write(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self) -> None:
        pass

    def close(self) -> None:
        pass


def pg2kafka_snapshot_case(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(walcast, baseline) over a chunk of ``n`` rows read on the fast path."""
    import threading

    from services.pg2kafka import pgoutput as pg
    from services.pg2kafka.settings import Pg2KafkaSettings
    from services.pg2kafka.snapshots.chunks import Chunk, Job, TableSpec
    from services.pg2kafka.snapshots.readers import Reader, RunControl, SnapshotProducer
    from shared.settings import load_settings

    settings = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False},
        kafka={"bootstrap_servers": "127.0.0.1:1"},
    )  # fmt: skip
    columns = tuple(
        pg.Column(name, oid, -1, i == 0) for i, (name, oid) in enumerate(SNAPSHOT_COLUMNS)
    )
    rel = pg.Relation(16401, "public", "users", "d", columns)
    rows: list[tuple[str, ...]] = [
        (f'{{"id":{i}}}', f'{{"id":{i},"email":"user{i}@example.com","name":"User Number {i}",'
                          f'"score":{i * 7},"active":{"true" if i % 2 else "false"}}}')
        for i in range(n)
    ]  # fmt: skip
    import importlib.util

    if importlib.util.find_spec("shared.contract.rowhash") is not None:
        # A tree whose fast path has Postgres write each row's hash too (issue 39): the
        # COPY gives three texts per row.
        rows = [(k, v, str(3_000_000_000 + i)) for i, (k, v) in enumerate(rows)]
    job = Job(1, "bench", "initial", 100, "running")
    producer = SnapshotProducer(settings, 64 * 1024 * 1024)
    producer.sink.close()
    producer.sink = _NullBulkSink()  # type: ignore[assignment]
    producer.topics.value_limit = lambda topic: 1 << 30  # type: ignore[method-assign]
    producer.routing.topic = lambda db, schema, table: "walcast.bench"  # type: ignore[method-assign]
    spec = TableSpec(rel, ((rel.oid, 1),), n)
    reader = Reader(settings, job, {("public", "users"): spec},
                    RunControl(threading.Event(), None), None, producer)  # fmt: skip
    chunk = Chunk(1, "public", "users", 0, rel.oid, None, None)
    conn: Any = _Conn(rows)

    def walcast() -> None:
        assert reader.read(conn, chunk, 100) == n

    def baseline() -> None:
        join = b"".join
        for texts in rows:
            join([t.encode() for t in texts])

    return walcast, baseline


CASES = {
    "pg2kafka": pg2kafka_case,
    "pg2kafka-stream": pg2kafka_stream_case,
    "pg2kafka-snapshot": pg2kafka_snapshot_case,
    "kafka2search": kafka2search_case,
}


def _time(fn: Callable[[], None]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(records: int) -> dict[str, dict[str, float]]:
    """One round of every case: seconds for walcast and for the baseline."""
    out: dict[str, dict[str, float]] = {}
    for name, make in CASES.items():
        walcast, baseline = make(records)
        walcast()  # warm: caches, first-call costs
        out[name] = {"walcast": _time(walcast), "baseline": _time(baseline)}
    return out


def _worktree(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="walcast-hotpath-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), ref],
                   check=True, capture_output=True)  # fmt: skip
    _build_native(path)
    return path


def _build_native(tree: Path) -> None:
    """A tree with pg2kafka's Rust extension gets it built in place (as ``pip install``
    would), sharing this tree's cargo target directory so only changed crates compile."""
    crate = tree / "services" / "pg2kafka" / "native"
    if not (crate / "Cargo.toml").exists():
        return  # before the extension
    target = REPO / "services" / "pg2kafka" / "native" / "target"
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(crate / "Cargo.toml"),
         "--target-dir", str(target)],
        check=True,
    )  # fmt: skip
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shutil.copy(target / "release" / "lib_native.so", crate.parent / f"_native{suffix}")


def _round_in(tree: Path, records: int) -> dict[str, dict[str, float]]:
    """One round measured by the code in ``tree`` (a subprocess importing from it)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hotpath_bench.py"), "--one-round",
         "--records", str(records)],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, dict[str, float]] = json.loads(proc.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ref", help="also measure this git ref's code, in the same run")
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_round:
        print(json.dumps(measure(args.records)))
        return

    trees: dict[str, Path] = {"this tree": REPO}
    if args.ref:
        trees[args.ref] = _worktree(args.ref)
    best: dict[str, dict[str, dict[str, float]]] = {label: {} for label in trees}
    try:
        for r in range(args.rounds):
            for label, tree in trees.items():
                got = _round_in(tree, args.records)
                for case, times in got.items():
                    mine = best[label].setdefault(case, dict(times))
                    for k, v in times.items():
                        mine[k] = min(mine[k], v)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        if args.ref:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(trees[args.ref])], check=False)  # fmt: skip

    n = args.records
    rows: list[dict[str, Any]] = []
    print(f"\nper-record cost, best of {args.rounds} rounds of {n:,} records")
    print(f"{'case':<18} {'code':<12} {'walcast µs':>11} {'baseline µs':>12} {'ratio':>7}")
    for case in CASES:
        for label in trees:
            t = best[label][case]
            w, b = t["walcast"] / n * 1e6, t["baseline"] / n * 1e6
            rows.append({"case": case, "code": label, "walcast_us": w, "baseline_us": b,
                         "ratio": w / b})  # fmt: skip
            print(f"{case:<18} {label:<12} {w:>11.2f} {b:>12.2f} {w / b:>7.2f}")
    if args.ref:
        print(f"\nthis tree vs {args.ref} (walcast cost / its cost, each over its own baseline)")
        for case in CASES:
            mine = best["this tree"][case]
            theirs = best[args.ref][case]
            ratio = (mine["walcast"] / mine["baseline"]) / (theirs["walcast"] / theirs["baseline"])
            print(f"{case:<18} {ratio:.3f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "hotpath.json"
    out.write_text(json.dumps({"records": n, "rounds": args.rounds, "rows": rows}, indent=2))
    print(f"\nwritten: {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
