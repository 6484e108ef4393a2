"""Avro encoders for walcast's change event, measured in one run: which one pg2kafka uses.

    .venv/bin/python bench/avro_bench.py [--events 200000] [--rounds 3]

Encodes (and decodes) the same events, in process, with no broker (confluent-kafka's
``mock://`` registry: the registry is asked once per schema either way):

- ``json`` — walcast's JSON event (``orjson``), the baseline;
- ``fastavro`` — :class:`shared.avro.RegistryEncoder` / ``RegistryDecoder`` (fastavro's
  schemaless writer and reader behind the Confluent wire-format header);
- ``confluent`` — confluent-kafka's own ``AvroSerializer`` / ``AvroDeserializer`` (fastavro
  too, behind its serialization context, subject lookup and rule hooks) on the same
  datums (:func:`shared.avro.event_to_avro`), with the same schema.

Two event shapes: pgbench's account row (int keys, a 84-character filler) and a row of
mixed types (numeric, float, bytea, jsonb, date, timestamptz, arrays). The encoders run
in mirrored rounds (a, b, c, c, b, a, ...) and the best round of each counts. Prints a
table (events/s, µs per event, bytes per event, each as a ratio to JSON) and writes
``bench/results/avro.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.avro import (
    RegistryDecoder,
    RegistryEncoder,
    event_to_avro,
    registry_client,
    subject,
)

SHAPES: dict[str, tuple[dict[str, str], Callable[[int], dict[str, Any]]]] = {
    "pgbench_accounts": (
        {"aid": "int4", "bid": "int4", "abalance": "int4", "filler": "bpchar"},
        lambda i: {"aid": i, "bid": 1 + i // 100000, "abalance": i % 1000 - 500,
                   "filler": " " * 84},
    ),
    "mixed": (
        {"id": "int8", "amount": "numeric", "ratio": "float8", "blob": "bytea",
         "doc": "jsonb", "day": "date", "at": "timestamptz", "tags": "_text", "ok": "bool"},
        lambda i: {"id": i, "amount": f"{i}.{i % 100:02d}", "ratio": i / 7, "blob": "AAH/",
                   "doc": {"n": i, "tags": ["a", "b"]}, "day": "2024-02-29",
                   "at": "2024-02-29T13:45:56.123456+00:00", "tags": ["x", str(i)],
                   "ok": i % 2 == 0},
    ),
}  # fmt: skip


def events(shape: str, n: int) -> list[dict[str, Any]]:
    types, row = SHAPES[shape]
    key = next(iter(types))
    return [
        {"v": 1, "op": "update", "db": "bench", "schema": "public", "table": shape,
         "lsn": 1000 + i, "seq": i % 100, "commit_lsn": 1000 + i - i % 100, "xid": 5 + i // 100,
         "commit_ts": "2024-01-01T00:00:00.000000Z", "key": {key: i}, "new": row(i),
         "old": None, "types": types}
        for i in range(n)
    ]  # fmt: skip


def measure(fn: Callable[[], int], n: int) -> tuple[float, int]:
    started = time.perf_counter()
    size = fn()
    return n / (time.perf_counter() - started), size


def run(n: int, rounds: int) -> dict[str, Any]:
    client = registry_client("mock://walcast-bench")
    topic = "bench.cdc"
    ours = RegistryEncoder(client, "topic_record")
    decoder = RegistryDecoder(client)
    results: dict[str, Any] = {}
    for shape in SHAPES:
        results[shape] = _shape(shape, n, rounds, client, ours, decoder, topic)
    return results


def _shape(shape: str, n: int, rounds: int, client: Any, ours: RegistryEncoder,
           decoder: RegistryDecoder, topic: str) -> dict[str, Any]:  # fmt: skip
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    evs = events(shape, n)
    _, _, schema = ours.schema_for(topic, evs[0])
    datums = [event_to_avro(e, schema) for e in evs]
    schema_text = json.dumps(schema)
    theirs = AvroSerializer(
        client, schema_text,
        conf={"auto.register.schemas": True,
              "subject.name.strategy": lambda _ctx, name: subject("topic_record", topic,
                                                                   name)},
    )  # fmt: skip
    their_reader = AvroDeserializer(client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    encoded_ours = [ours.encode(topic, e) for e in evs]
    encoded_theirs = [theirs(d, ctx) for d in datums]
    assert encoded_ours[0][5:] == encoded_theirs[0][5:], "the same Avro bytes"

    def enc_json() -> int:
        return sum(len(orjson.dumps(e)) for e in evs)

    def enc_fastavro() -> int:
        return sum(len(ours.encode(topic, e)) for e in evs)

    def enc_confluent() -> int:
        # Their serializer takes the datum; the event → datum step is the same
        # function ours runs, so it is counted for both.
        return sum(len(theirs(event_to_avro(e, schema), ctx)) for e in evs)

    json_blobs = [orjson.dumps(e) for e in evs]

    def dec_json() -> int:
        return sum(len(orjson.loads(b)) for b in json_blobs)

    def dec_fastavro() -> int:
        return sum(len(decoder.decode(b)) for b in encoded_ours)

    def dec_confluent() -> int:
        return sum(len(their_reader(b, ctx)) for b in encoded_theirs)

    cases = {"encode json": enc_json, "encode fastavro": enc_fastavro,
             "encode confluent": enc_confluent, "decode json": dec_json,
             "decode fastavro": dec_fastavro, "decode confluent": dec_confluent}  # fmt: skip
    order = list(cases)
    best: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            rate, size = measure(cases[name], n)
            best[name] = max(best.get(name, 0.0), rate)
            sizes[name] = size
    out: dict[str, Any] = {
        name: {
            "events_per_s": round(best[name]),
            "us_per_event": round(1e6 / best[name], 2),
            "ratio_to_json": round(best[name] / best[name.split()[0] + " json"], 3),
        }
        for name in order
    }
    out["bytes_per_event"] = {
        "json": round(sizes["encode json"] / n, 1),
        "avro (fastavro)": round(sizes["encode fastavro"] / n, 1),
        "avro (confluent)": round(sizes["encode confluent"] / n, 1),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = run(args.events, args.rounds)
    for shape, r in results.items():
        print(f"\n{shape} ({args.events:,} events, best of {args.rounds} rounds)")
        print(f"{'':18} {'events/s':>10} {'µs/event':>9} {'vs json':>8}")
        for name, m in r.items():
            if name != "bytes_per_event":
                print(f"{name:18} {m['events_per_s']:>10,} {m['us_per_event']:>9} "
                      f"{m['ratio_to_json']:>8}")  # fmt: skip
        print("bytes per event: " + ", ".join(f"{k} {v}" for k, v in r["bytes_per_event"].items()))
    out = Path(__file__).parent / "results" / "avro.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"events": args.events, "rounds": args.rounds, **results},
                              indent=2))  # fmt: skip
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
