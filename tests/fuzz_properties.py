"""Property-based fuzzing of every consumer decoder (issue 36, finding 3), shared by the
short suite (``tests/unit/test_fuzz_decoders.py``) and the long run (``bench/fuzz.py``).

The property, for every target: a record — arbitrary bytes, or a valid record mutated
with knowledge of its structure — either decodes or is refused as an *unreadable record*
(:class:`~shared.contract.event.EventDecodeError`, with a reason of at most
:data:`~shared.contract.limits.MAX_REASON_CHARS` characters); no other exception, within
:data:`MAX_SECONDS`. The targets:

- ``walcast-json`` — the event contract's decoder, then kafka2search's document path
  (document id, row, bulk body) on what it accepts;
- ``debezium-json`` — :func:`shared.formats.debezium_input.translate` (the real
  connector's records of every column type, mutated), then the contract's decoder;
- ``avro-walcast`` / ``avro-debezium`` — :class:`shared.avro.RegistryDecoder` through
  confluent-kafka's ``mock://`` registry (walcast's events and the connector's records in
  the Confluent wire format; hostile writer schemas too), then as above;
- ``kafka2spark-translate`` — kafka2spark's translation UDF body (it never raises: a
  reason or the events);
- ``consumer-loop`` — records of all the kinds above through
  :meth:`shared.consumer.ConsumerLoop.handle` (``input_format: auto``, Avro on) into
  kafka2search's batch: each record is applied or dead-lettered, the loop never raises.

A target is ``(name, run)``; ``run(examples)`` checks the property on that many examples
(hypothesis, derandomized: the same examples every run) and returns its :class:`Stats`.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shared.avro import ConnectRegistryEncoder, RegistryDecoder, RegistryEncoder, frame
from shared.contract.event import EventDecodeError, EventView, decode
from shared.contract.limits import MAX_REASON_CHARS
from shared.formats.debezium_input import translate
from shared.records import change_events

MAX_SECONDS = 5.0
"""The CPU time one record may take on the decoding thread: a bound far above any
legitimate record (they take microseconds), which a record that makes work proportional
to a size it states (a scale of 10^15) exceeds. CPU time, not wall time: a loaded machine
must not fail the property."""

DATA = Path(__file__).parent / "unit" / "data" / "debezium_3.7.0_types.json"


@dataclass
class Stats:
    """What a target's run saw."""

    name: str
    examples: int = 0
    decoded: int = 0
    refused: int = 0
    max_us: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    def record(self, decoded: bool, us: float, reason: str = "") -> None:
        self.examples += 1
        if decoded:
            self.decoded += 1
        else:
            self.refused += 1
            kind = reason.split(":", 1)[0][:60]
            self.reasons[kind] = self.reasons.get(kind, 0) + 1
        self.max_us = max(self.max_us, us)

    def row(self) -> dict[str, Any]:
        return {"target": self.name, "examples": self.examples, "decoded": self.decoded,
                "refused": self.refused, "max_us": round(self.max_us, 1)}  # fmt: skip


@dataclass(frozen=True)
class Target:
    """A named property: ``run(examples)`` checks it and returns what it saw."""

    name: str
    run: Callable[[int], Stats]


def check(stats: Stats, decoder: Callable[[Any], object], sample: Any) -> None:
    """The property for one sample: decoded, or refused with a bounded reason; in time."""
    started = time.perf_counter()
    cpu = time.thread_time()
    try:
        decoder(sample)
        outcome, reason = True, ""
    except EventDecodeError as exc:
        outcome, reason = False, str(exc)
        assert reason, "an unreadable record without a reason"
        assert len(reason) <= MAX_REASON_CHARS + 200, f"a reason of {len(reason)} characters"
    seconds = time.perf_counter() - started
    cpu = time.thread_time() - cpu
    assert cpu < MAX_SECONDS, f"one record took {cpu:.2f} s of CPU"
    stats.record(outcome, seconds * 1e6, reason)


def runner(name: str, strategy: st.SearchStrategy[Any], decoder: Callable[[Any], object]) -> Target:
    def run(examples: int) -> Stats:
        stats = Stats(name)

        @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(strategy)
        def prop(sample: Any) -> None:
            check(stats, decoder, sample)

        prop()
        return stats

    return Target(name, run)


# -- hostile values and mutations ---------------------------------------------------------

_DEEP = "\x00deep:{}\x00"  # replaced by a nested array of that depth once serialized


def _deep(n: int) -> str:
    return _DEEP.format(n)


HOSTILE: list[Any] = [
    None, True, 0, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 1.5, 1e308,
    "", "x" * 3000, "\u0000", "é\u2028", "AQ==", "////", "=", "!!", "__debezium_unavailable_value",
    "1e400", "-10", "1000000000000000", "-1000000000000000", "9" * 40, "2024-02-30",
    "infinity", "P1Y2M", "10:61:00", "\\x41", [], {}, [None], ["__debezium_unavailable_value"],
    {"scale": -(10**15), "value": "AQ=="}, {"scale": 10**15, "value": "AQ=="},
    {"scale": "x", "value": 5}, {"value": "AQ=="},
    {"length": "1000000000000000"}, {"scale": "-1000000000000000"}, {"scale": "1000000000000"},
    {"type": "array", "items": {"type": "array", "items": {"type": "int32"}}},
    {"type": "map", "keys": {"type": "string"}, "values": {"type": "string"}},
    {"type": "struct", "fields": None}, {"type": "bytes", "name": "io.debezium.data.Bits"},
    {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"},
    {"type": "string", "name": "io.debezium.data.Json"},
    "org.apache.kafka.connect.data.Decimal", "io.debezium.data.Bits",
    "io.debezium.data.VariableScaleDecimal", "io.debezium.time.MicroTimestamp", "map", "array",
    _deep(40), _deep(300), _deep(600), _deep(2000), "[" * 300 + "]" * 300, "[" * 2000,
]  # fmt: skip


def _paths(doc: Any, limit: int = 3000) -> list[tuple[Any, Any]]:
    """(container, key) of every value in ``doc``, breadth first, at most ``limit``."""
    out: list[tuple[Any, Any]] = []
    todo = [doc]
    while todo and len(out) < limit:
        node = todo.pop(0)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.append((node, k))
            if isinstance(v, (dict, list)):
                todo.append(v)
    return out


def _mutate_tree(draw: st.DrawFn, doc: Any) -> Any:
    paths = _paths(doc)
    if not paths:
        return draw(st.sampled_from(HOSTILE))
    node, k = paths[draw(st.integers(0, len(paths) - 1))]
    op = draw(st.sampled_from(["hostile", "hostile", "delete", "wrap", "json", "copy"]))
    if op == "delete" and isinstance(node, dict):
        del node[k]
    elif op == "wrap":
        node[k] = [node[k]] if draw(st.booleans()) else {"x": node[k]}
    elif op == "json":
        node[k] = draw(_json_values)
    elif op == "copy":  # a value from elsewhere in the record
        other, j = paths[draw(st.integers(0, len(paths) - 1))]
        node[k] = copy.deepcopy(other[j]) if other is not node else node[k]
    else:
        node[k] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))
    return doc


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def dump(doc: Any) -> bytes:
    """A mutated record as JSON bytes (big integers and deep nesting as they are)."""
    text = json.dumps(doc, separators=(",", ":"))
    for n in (40, 300, 600, 2000):
        marker = json.dumps(_deep(n))
        if marker in text:
            text = text.replace(marker, "[" * n + "]" * n)
    return text.encode()


def _mutate_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not buf:
            break
        at = draw(st.integers(0, len(buf) - 1))
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup"]))
        if op == "flip":
            buf[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=9))
        else:
            buf[at:at] = buf[at : at + draw(st.integers(1, 16))]
    return bytes(buf)


def mutated(seeds: list[Any], *, byte_level: bool = True) -> st.SearchStrategy[bytes]:
    """Valid JSON records (``seeds``) with 1 to 3 structure-aware mutations, then sometimes
    byte-level ones."""

    @st.composite
    def gen(draw: st.DrawFn) -> bytes:
        doc = copy.deepcopy(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(1, 3))):
            doc = _mutate_tree(draw, doc)
        data = dump(doc)
        if byte_level and draw(st.integers(0, 4)) == 0:
            data = _mutate_bytes(draw, data)
        return data

    return gen()


# -- valid records ------------------------------------------------------------------------

TYPES = {"id": "int8", "amount": "numeric", "ratio": "float8", "flag": "bool", "blob": "bytea",
         "doc": "jsonb", "day": "date", "at": "timestamptz", "tags": "_text", "nums": "_int4",
         "body": "text"}  # fmt: skip
ROW = {"id": 1, "amount": "12345678901234567890.0001", "ratio": "NaN", "flag": True,
       "blob": "AAH/", "doc": {"k": [1, 2.5, None]}, "day": "-0043-03-15", "at": "infinity",
       "tags": ["a", None, "b c"], "nums": [1, None], "body": "x"}  # fmt: skip


def walcast_events() -> list[dict[str, Any]]:
    """Valid walcast events: a data event of each op, and control events."""
    base = {"v": 1, "op": "insert", "db": "app", "schema": "public", "table": "t", "lsn": 100,
            "seq": 0, "commit_lsn": 100, "xid": 7, "commit_ts": "2024-01-01T00:00:00.000000Z",
            "key": {"id": 1}, "new": dict(ROW), "old": None, "types": dict(TYPES)}  # fmt: skip
    return [
        base,
        {**base, "op": "update", "new": {"id": 1}, "unchanged_toast": ["body", "doc"]},
        {**base, "op": "delete", "new": None, "old": {"id": 1}},
        {**base, "op": "read", "snapshot": {"id": 5, "chunk": 1}, "epoch": 1},
        {**base, "key": {"tenant": "a", "id": 2}},
        {**base, "op": "ddl", "key": {}, "new": None, "types": {},
         "ddl": {"tag": "ALTER TABLE", "columns": [{"name": "id", "type": "int8"}]}},
        {**base, "op": "snapshot", "key": {}, "new": None, "snapshot": {"id": 5, "phase": "end"}},
        {**base, "op": "truncate", "key": {}, "new": None},
    ]  # fmt: skip


@cache
def connector_records() -> tuple[tuple[Any, Any], ...]:
    """The real connector's records (every column type it writes), as (key, value)."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    return tuple((k, v) for k, v in data["records"] if v is not None)


HOSTILE_FIELDS: list[dict[str, Any]] = [
    {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
    {"type": "bytes", "name": "io.debezium.data.Bits", "parameters": {"length": "8"}},
    {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2"}},
    {"type": "array", "items": {"type": "array", "items": {"type": "int32"}}},
    {"type": "string", "name": "io.debezium.data.Json"},
    {"type": "map", "keys": {"type": "string"}, "values": {"type": "string", "optional": True}},
]  # fmt: skip


def debezium_seeds() -> list[Any]:
    """The connector's values, and values with a column of each risky kind added."""
    seeds: list[Any] = [copy.deepcopy(v) for _, v in connector_records()]
    value = connector_records()[0][1]
    for f in HOSTILE_FIELDS:
        v = copy.deepcopy(value)
        for env in v["schema"]["fields"]:
            if env["field"] in ("before", "after"):
                env["fields"].append({**f, "optional": True, "field": "risky"})
        sample = {"struct": {"scale": 2, "value": "AQ=="}, "array": [[1]], "map": {"a": "1"}}
        v["payload"]["after"]["risky"] = sample.get(f["type"], "AQ==")
        seeds.append(v)
    return seeds


# -- the targets --------------------------------------------------------------------------


def _walcast(value: bytes) -> None:
    from services.kafka2search.documents import Batch, bulk_body, encode_sources
    from shared.interfaces import Origin

    ev = decode(value)
    if ev.op in ("insert", "update", "delete", "read"):
        _document(Batch, bulk_body, encode_sources, Origin, ev, value)


def _document(batch_cls: Any, body: Any, encode: Any, origin_cls: Any, ev: EventView,
              value: bytes) -> None:  # fmt: skip
    """kafka2search's document path on an accepted event: never raises for the record."""
    batch = batch_cls()
    batch.add("idx", ev, origin_cls("t", 0, 0, None, value))
    docs, _refused = encode(list(batch.docs.values()))
    body(docs)


def _debezium(sample: tuple[bytes | None, bytes]) -> None:
    for out in translate(*sample):
        _walcast(out)


@cache
def _registry() -> tuple[Any, RegistryDecoder, RegistryEncoder, ConnectRegistryEncoder]:
    from shared.avro import registry_client

    client = registry_client("mock://walcast-fuzz")
    return client, RegistryDecoder(client), RegistryEncoder(client), ConnectRegistryEncoder(client)


HOSTILE_AVRO_SCHEMAS: list[dict[str, Any]] = [
    {"type": "record", "name": "Value", "namespace": "dbz.s.t", "connect.name": "dbz.s.t.Value",
     "fields": [{"name": "h", "type": {"type": "map", "values": ["null", "string"]}}]},
    {"type": "record", "name": "Value", "namespace": "dbz.s.u", "connect.name": "dbz.s.u.Value",
     "fields": [{"name": "n", "type": {"type": "array", "items": "null"}}]},
    {"type": "record", "name": "Value", "namespace": "dbz.s.v", "connect.name": "dbz.s.v.Value",
     "fields": [{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
                {"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}},
                {"name": "u", "type": ["int", "string"]}]},
    {"type": "record", "name": "Value", "namespace": "dbz.s.w", "connect.name": "dbz.s.w.Value",
     "fields": [{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5,
                                      "scale": 2, "connect.name":
                                      "org.apache.kafka.connect.data.Decimal",
                                      "connect.parameters": {"scale": "1000000000000000"}}}]},
    {"type": "record", "name": "Event", "namespace": "walcast.a.b.c",
     "fields": [{"name": "v", "type": "int"}]},
]  # fmt: skip


@cache
def avro_seeds() -> tuple[tuple[int, ...], tuple[bytes, ...], tuple[bytes, ...]]:
    """(schema ids, walcast records, Debezium records) registered and encoded once."""
    from confluent_kafka.schema_registry import Schema

    client, _, walcast_enc, connect_enc = _registry()
    walcast = tuple(walcast_enc.encode("fuzz.cdc", ev) for ev in walcast_events()[:4])
    debezium = tuple(connect_enc.encode("dbz", v) for _, v in connector_records())
    keys = tuple(connect_enc.encode("dbz", k, key=True) for k, _ in connector_records())
    ids = {int.from_bytes(r[1:5], "big") for r in (*walcast, *debezium, *keys)}
    for i, s in enumerate(HOSTILE_AVRO_SCHEMAS):
        ids.add(int(client.register_schema(f"hostile-{i}", Schema(json.dumps(s), "AVRO"))))
    return tuple(sorted(ids)), walcast, debezium + keys


def _avro_strategy(pick: int) -> st.SearchStrategy[bytes]:
    """Wire-format records: any schema id (hostile ones too) with arbitrary or mutated
    payloads, and valid records mutated byte by byte."""

    @st.composite
    def gen(draw: st.DrawFn) -> bytes:
        ids, walcast, debezium = avro_seeds()
        valid = (walcast, debezium)[pick]
        kind = draw(st.integers(0, 3))
        if kind == 0:
            return frame(draw(st.sampled_from(ids)), draw(st.binary(max_size=300)))
        record = draw(st.sampled_from(valid))
        if kind == 1:  # a valid payload under another schema
            return frame(draw(st.sampled_from(ids)), record[5:])
        return record[:5] + _mutate_bytes(draw, record[5:])

    return gen()


def _avro_walcast(data: bytes) -> None:
    _walcast(_registry()[1].decode(data))


def _avro_debezium(data: bytes) -> None:
    _debezium((None, _registry()[1].decode(data)))


def _spark_translate(sample: tuple[bytes | None, bytes]) -> None:
    from services.kafka2spark import envelope
    from shared.settings import SchemaRegistrySettings

    url = "mock://walcast-fuzz"
    # The UDF's decoder per registry URL: the one holding the fuzz schemas (a new mock
    # client would be an empty registry).
    envelope._decoders.setdefault(url, _registry()[1])
    values, reason = envelope._translate_record("auto", SchemaRegistrySettings(url=url), *sample)
    if reason is not None:  # the UDF never raises: it returns the reason
        raise EventDecodeError(reason)
    assert isinstance(values, list)


def _debezium_samples() -> st.SearchStrategy[tuple[bytes | None, bytes]]:
    keys = [dump(k) for k, _ in connector_records()]
    return st.tuples(
        st.none() | st.sampled_from(keys) | mutated([k for k, _ in connector_records()]),
        mutated(debezium_seeds()) | st.binary(max_size=400),
    )


def _any_record() -> st.SearchStrategy[tuple[bytes | None, bytes]]:
    return (
        _debezium_samples()
        | st.tuples(st.none(), mutated(walcast_events()))
        | st.tuples(st.none(), _avro_strategy(0) | _avro_strategy(1))
        | st.tuples(st.none(), st.binary(max_size=400))
    )


class _Sink:
    """kafka2search's batch behind the loop, with a write that only builds the body."""

    def __init__(self) -> None:
        from services.kafka2search.documents import Batch

        self.batch_cls = Batch

    def new_batch(self) -> Any:
        return self.batch_cls()

    def add(self, batch: Any, event: EventView, origin: Any) -> str | None:
        reason: str | None = batch.add("idx", event, origin)
        return reason

    def write(self, batch: Any, sleep: Any, before: Any) -> list[Any]:
        from services.kafka2search.documents import bulk_body, encode_sources

        docs, refused = encode_sources(list(batch.docs.values()))
        bulk_body(docs)
        return refused

    def control(self, event: EventView) -> None:
        pass


def _loop() -> tuple[Any, list[Any]]:
    from shared.consumer import ConsumerLoop, ConsumerMetrics, DeadLetters
    from shared.kafka import KafkaOffsetCheckpointer
    from shared.retry import BackoffPolicy
    from shared.settings import BatchSettings, ConsumerSettings, KafkaSettings
    from tests.unit.test_consumer_loop import FakeConsumer

    sent: list[Any] = []

    class Dead(DeadLetters):
        def __init__(self) -> None:
            pass

        def send(self, origin: Any, reason: str, kind: str) -> None:
            sent.append((origin.offset, reason, kind))

        def flush(self, timeout_s: float) -> None:
            pass

        def close(self) -> None:
            pass

    loop: Any = ConsumerLoop(
        name="fuzz", kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        consumer=ConsumerSettings.model_validate({"input_format": "auto"}),
        batch=BatchSettings(concurrency=1), retry=BackoffPolicy(),
        metrics=ConsumerMetrics(CollectorRegistry(), "fuzz"), sink=_Sink(),
        stop_event=threading.Event(), dead_letters=Dead(),
        decoder=change_events("auto", _registry()[1]),
    )  # fmt: skip
    consumer = FakeConsumer(loop)
    loop.consumer = consumer
    loop.checkpointer = KafkaOffsetCheckpointer(consumer)
    loop.writer = ThreadPoolExecutor(1)
    return loop, sent


def _through_loop(sample: tuple[bytes | None, bytes]) -> None:
    from tests.unit.test_consumer_loop import Msg

    loop, sent = _loop()
    try:
        loop.handle(Msg(0, 7, sample[1], sample[0]))
        loop.flush()  # the batch written (its body built) and committed
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    if sent and sent[0][2] == "poison":
        raise EventDecodeError(sent[0][1])


def targets() -> list[Target]:
    """Every consumer decoder's property (kafka2webhook's receiver-side parsing adds its
    own targets in bench/fuzz.py)."""
    return [
        runner("walcast-json", mutated(walcast_events()) | st.binary(max_size=400), _walcast),
        runner("debezium-json", _debezium_samples(), _debezium),
        runner("avro-walcast", _avro_strategy(0) | st.binary(max_size=64), _avro_walcast),
        runner("avro-debezium", _avro_strategy(1), _avro_debezium),
        runner("kafka2spark-translate", _any_record(), _spark_translate),
        runner("consumer-loop", _any_record(), _through_loop),
    ]
