"""kafka2webhook wired together: ``build(settings)`` composes the service.

Each endpoint is a consumer-group member of its own group (``<consumer.group_id>.<name>``)
running the shared consumer loop (:mod:`shared.consumer`) on its own thread, with a
:class:`WebhookSink` that keeps the events the endpoint subscribed to and delivers a
batch through its :class:`~services.kafka2webhook.delivery.Deliverer`. So an endpoint that
is slow or down holds back only its own offsets: the others read and deliver on, its own
loop pauses its partitions while it retries (nothing more is fetched: memory stays within
one batch), and its lag grows in Kafka, not in this process. Offsets are committed once
the batch's every event was delivered or dead-lettered (checkpoint last); after a crash
the uncommitted events are delivered again with the same ``webhook-id`` (at least once).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import CollectorRegistry

from services.kafka2webhook.delivery import (
    Deliverer,
    Delivery,
    DeliveryMetrics,
    EndpointState,
)
from services.kafka2webhook.settings import (
    Condition,
    EndpointSettings,
    Kafka2WebhookSettings,
)
from services.kafka2webhook.untrusted import clean, id_part
from shared.consumer import ConsumerLoop, ConsumerMetrics, LoopLink
from shared.contract.event import EventDecodeError, EventView, decode
from shared.errors import ConfigError
from shared.interfaces import BatchSink, Origin, Rejection, Wait
from shared.naming import wildcard
from shared.service import Runner

log = logging.getLogger(__name__)

PREFIX = "walcast_kafka2webhook"


class Item(EventView, gc=False):
    """A record as an endpoint sees it: the event's envelope (for the table and operation
    tests), what is posted (``body``: the record's value as it is), the delivery's
    idempotency key (``ident``) and where it came from."""

    ident: str = ""
    body: bytes = b""
    subscription: Any = None  # events input: the subscription key (tg_name)
    doc: Any = None  # the parsed body, once a filter needed it
    origin: Any = None


def _origin(msg: Message, value: bytes) -> Origin:
    return Origin(msg.topic() or "", msg.partition() or 0, msg.offset() or 0, msg.key(), value)


def cdc_record(msg: Message) -> list[EventView]:
    """A change event, validated by the contract. Its id is a hash of its bytes: pg2kafka
    writes an event byte for byte the same on every redelivery, and two events never
    share bytes (``commit_lsn``, ``seq``)."""
    value = msg.value() or b""
    view = decode(value)
    fields = msgspec.structs.asdict(view)
    ident = "wc_" + hashlib.sha256(value).hexdigest()[:40]
    return [Item(**fields, ident=ident, body=value, origin=_origin(msg, value))]


def record_headers(msg: Message) -> dict[str, bytes]:
    headers: dict[str, bytes] = {}
    for pair in msg.headers() or []:
        name, raw = pair[0], pair[1]
        if isinstance(name, str) and isinstance(raw, bytes):
            headers[name] = raw
    return headers


def events_record(msg: Message) -> list[EventView]:
    """A subscription event: its payload is posted; its id is the events row's id (the
    ``walcast-event-id`` header pg2kafka sets), the same on every redelivery.

    The ids go into the ``webhook-id`` header as they are, so they must be what pg2kafka
    writes (:func:`~services.kafka2webhook.untrusted.id_part`: decimal ids pass). A
    record whose id headers are anything else (non-ASCII, CR / LF, spaces...) was not
    written by pg2kafka: EventDecodeError, so it goes to the dead-letter topic with the
    reason. An id made up for it (a hash of the bytes) would differ from the one the
    real event gets when pg2kafka sends it again, so a receiver could not de-duplicate
    the two. No id header at all: the id is a hash of the payload, as before."""
    value = msg.value() or b""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EventDecodeError("a subscription event's payload is not a JSON object")
    ident = event_ident(record_headers(msg), value)
    return [
        Item(
            v=1, op="event", schema=doc.get("tg_table_schema"), table=doc.get("tg_table_name"),
            key=msg.key(), ident=ident, body=value, subscription=doc.get("tg_name"), doc=doc,
            origin=_origin(msg, value),
        )
    ]  # fmt: skip


def event_ident(headers: dict[str, bytes], value: bytes) -> str:
    """A subscription event's ``webhook-id`` (see :func:`events_record`): always a safe
    header value, the same for the same record; EventDecodeError for id headers pg2kafka
    does not write."""
    raw_id = headers.get("walcast-event-id", b"")
    if not raw_id:
        return "evt_" + hashlib.sha256(value).hexdigest()[:40]
    raw_stream = headers.get("walcast-stream-id", b"")
    event_id = id_part(raw_id)
    stream = id_part(raw_stream) if raw_stream else ""
    if event_id is None or stream is None:
        shown = clean(repr((raw_stream, raw_id)), 200)
        raise EventDecodeError(
            "its walcast-stream-id / walcast-event-id headers are not ids pg2kafka writes"
            f" (1-128 of A-Z a-z 0-9 . _ -): {shown}"
        )
    return f"evt_{stream}_{event_id}"


def json_text(value: Any, limit: int = 1000) -> str:
    """``value`` as JSON for a reason or a log, whatever it holds (integers beyond 64
    bits, nesting deeper than the encoder goes: a placeholder)."""
    try:
        return clean(orjson.dumps(value).decode(), limit)
    except (orjson.JSONEncodeError, TypeError, RecursionError):
        return "(not printable as JSON)"


_MISSING = object()


def field_value(doc: Any, path: str) -> Any:
    node = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def holds(condition: Condition, doc: Any) -> bool:
    value = field_value(doc, condition.field)
    if condition.exists is not None:
        return (value is not _MISSING and value is not None) == condition.exists
    if value is _MISSING:
        return False
    if condition.one_of is not None:
        return value in condition.one_of
    return bool(value == condition.equals)


@dataclass
class Batch:
    """The records read since the last write, and the ones this endpoint wants."""

    items: list[Item] = field(default_factory=list)
    records: int = 0
    bytes: int = 0

    def __len__(self) -> int:
        return len(self.items)

    def clear(self) -> None:
        self.items.clear()
        self.records = 0
        self.bytes = 0


class WebhookSink(BatchSink[Batch]):
    """One endpoint: which events it gets (tables or subscriptions, operations, filter)
    and their delivery. ``add`` keeps what it wants; ``write`` delivers a batch over
    lanes (a key always in the same lane, so in order); ``control`` (a truncate or schema
    change the endpoint subscribed to) is delivered on the loop's thread, everything
    before it delivered first."""

    def __init__(
        self,
        endpoint: EndpointSettings,
        deliverer: Deliverer,
        lanes: int,
        wait: Wait,
        dead_letter: Callable[[Origin, str], None],
    ) -> None:
        self.endpoint = endpoint
        self.deliverer = deliverer
        self.lanes = lanes
        self.wait = wait
        self.dead_letter = dead_letter
        self.ops = frozenset(endpoint.operations)
        self.tables = [(wildcard(s), wildcard(t)) for s, t in
                       (p.split(".", 1) for p in endpoint.tables)]  # fmt: skip
        self.subs = [wildcard(p) for p in endpoint.subscriptions]
        self.events = endpoint.input == "events"

    def new_batch(self) -> Batch:
        return Batch()

    def wants(self, item: Item) -> bool:
        if self.events:
            sub = item.subscription
            if not isinstance(sub, str) or not any(p.match(sub) for p in self.subs):
                return False
        elif item.op not in self.ops or not any(
            s.match(item.schema) and t.match(item.table) for s, t in self.tables
        ):
            return False
        if self.endpoint.filter:
            if item.doc is None:
                item.doc = parse_body(item.body)
            return all(holds(c, item.doc) for c in self.endpoint.filter)
        return True

    def add(self, batch: Batch, event: EventView, origin: Origin) -> str | None:
        batch.records += 1
        batch.bytes += len(origin.value)
        assert isinstance(event, Item)
        if self.events and isinstance(event.doc, dict) and "walcast_oversized" in event.doc:
            # pg2kafka sent a reference for an event too large for the topic: which
            # subscription it belongs to is unknown here, so it is not lost silently.
            return (
                "a reference to an oversized subscription event (fetch it from"
                f" _walcast.events by id): {json_text(event.doc['walcast_oversized'])}"
            )
        try:
            wanted = self.wants(event)
        except EventDecodeError as exc:
            return f"its body could not be tested against the endpoint's filter: {exc}"
        if wanted:
            batch.items.append(event)
        return None

    def write(
        self, batch: Batch, sleep: Wait, before: tuple[Future[list[Rejection]], ...]
    ) -> list[Rejection]:
        for f in before:  # one write at a time (settings); never overtake one anyway
            f.exception()
        if not batch.items:
            return []
        return self.deliverer.deliver(self.split(batch.items), sleep)

    def split(self, items: Sequence[Item]) -> list[list[Delivery]]:
        """Items over lanes by their key (the row's key; a subscription event's Kafka
        key), each lane's items as deliveries of ``batch_size`` events at most."""
        lanes: list[list[Item]] = [[] for _ in range(self.lanes)]
        for item in items:
            lanes[zlib.crc32(lane_key(item)) % self.lanes].append(item)
        size = self.endpoint.batch_size
        batched = size > 1
        return [[as_delivery(lane[i : i + size], batched) for i in range(0, len(lane), size)]
                for lane in lanes if lane]  # fmt: skip

    def control(self, event: EventView) -> None:
        assert isinstance(event, Item)
        if event.op == "verify":  # walcast's own marker (docs/design.md#verification)
            return
        try:
            if not self.wants(event):
                return
        except EventDecodeError as exc:
            self.dead_letter(
                event.origin, f"its body could not be tested against the filter: {exc}"
            )
            return
        reason = self.deliverer.post(as_delivery([event], self.endpoint.batch_size > 1), self.wait)
        if reason is not None:
            self.dead_letter(event.origin, reason)


def parse_body(body: bytes) -> Any:
    """An event's body parsed for a filter; EventDecodeError when it cannot be (JSON
    nested deeper than the parser goes, which the contract's decoder may accept)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(f"not JSON to the filter's parser: {exc}") from None


def lane_key(item: Item) -> bytes:
    """The key that chooses an item's lane: the same for every event of one row (or one
    subscription event's Kafka key). A row key JSON cannot encode (an integer beyond 64
    bits, deep nesting) falls back to the record's Kafka key, the same for that row."""
    if item.op == "event":
        return item.origin.key or b""
    try:
        key = orjson.dumps(item.key)
    except (orjson.JSONEncodeError, TypeError, RecursionError):
        key = b"\x00" + (item.origin.key or b"")
    return f"{item.schema}.{item.table}".encode("utf-8", "surrogatepass") + key


def as_delivery(items: Sequence[Item], batched: bool = False) -> Delivery:
    """One event as its own body, or (``batched``: an endpoint with ``batch_size`` > 1)
    a JSON array of events, however many — with a delivery id over theirs, the same
    whenever the same events are batched together."""
    if not batched:
        assert len(items) == 1
        item = items[0]
        return Delivery(item.ident, item.body, (item.origin,))
    ident = "batch_" + hashlib.sha256(" ".join(i.ident for i in items).encode()).hexdigest()[:40]
    # Which events a batch holds depends on when they were read: receivers de-duplicate
    # by each element's id, which is the event's own.
    body = b"[" + b",".join(b'{"webhook_id":"' + i.ident.encode() + b'","event":' + i.body + b"}"
                            for i in items) + b"]"  # fmt: skip
    return Delivery(ident, body, tuple(i.origin for i in items), len(items))


@dataclass
class Endpoint:
    settings: EndpointSettings
    loop: ConsumerLoop[Batch]
    deliverer: Deliverer
    state: EndpointState


def endpoint_loop(
    settings: Kafka2WebhookSettings,
    endpoint: EndpointSettings,
    consumer_metrics: ConsumerMetrics,
    delivery_metrics: DeliveryMetrics,
    stop_event: threading.Event,
    *,
    group_id: str | None = None,
    start: Callable[[Consumer, list[TopicPartition]], None] | None = None,
    until: dict[tuple[str, int], int] | None = None,
) -> Endpoint:
    """One endpoint's consumer loop, sink and deliverer (``run``; ``replay`` passes
    ``start`` / ``until`` and a group of its own)."""
    state = EndpointState()
    deliverer = Deliverer(
        endpoint, settings.secret_of(endpoint), settings.delivery, delivery_metrics, state,
        stop=stop_event,
    )  # fmt: skip
    topics = [settings.events_topic] if endpoint.input == "events" else settings.consumer.topics
    consumer = settings.consumer.model_copy(update={"topics": topics})
    metrics = consumer_metrics.member(endpoint.name)
    link = LoopLink(stop_event)
    sink = WebhookSink(
        endpoint, deliverer, settings.delivery.parallel_keys, link.wait, link.dead_letter
    )
    loop = ConsumerLoop[Batch](
        name=f"deliver to {endpoint.name}",
        kafka=settings.kafka,
        consumer=consumer,
        batch=settings.batch,
        retry=settings.retry,
        metrics=metrics,
        sink=sink,
        link=link,
        stop_event=stop_event,
        group_id=group_id or f"{settings.consumer.group_id}.{endpoint.name}",
        start=start,
        until=until,
        decoder=events_record if endpoint.input == "events" else cdc_record,
        dead_letter_headers=[("walcast-endpoint", endpoint.name.encode())],
    )
    return Endpoint(endpoint, loop, deliverer, state)


@dataclass
class Service:
    settings: Kafka2WebhookSettings
    runner: Runner
    endpoints: list[Endpoint]

    @property
    def registry(self) -> CollectorRegistry:
        return self.runner.registry

    def run(self) -> None:
        first, *others = self.endpoints
        self.runner.run(
            first.loop.run,
            beside=[(e.settings.name, e.loop.run) for e in others],
            cleanup=self.close,
        )

    def close(self) -> None:
        for e in self.endpoints:
            e.deliverer.close()

    def stop(self, *_: object) -> None:
        self.runner.stop()

    def install_signal_handlers(self) -> None:
        self.runner.install_signal_handlers("after the deliveries in hand")

    def status(self) -> dict[str, dict[str, object]]:
        return {e.settings.name: e.state.snapshot() for e in self.endpoints}


def build(settings: Kafka2WebhookSettings) -> Service:
    """Wire the service: one consumer loop, sink and deliverer per endpoint, metrics and
    the ops endpoint."""
    if not settings.endpoints:
        raise ConfigError(
            "no endpoints configured",
            hint="set endpoints (YAML, or KAFKA2WEBHOOK_ENDPOINTS as a JSON list)",
        )
    runner = Runner(settings.http)
    consumer_metrics = ConsumerMetrics(runner.registry, PREFIX, member_label="webhook")
    delivery_metrics = DeliveryMetrics(runner.registry, PREFIX)
    endpoints = [
        endpoint_loop(settings, e, consumer_metrics, delivery_metrics, runner.stop_event)
        for e in settings.endpoints
    ]
    for e in endpoints:
        alive, joined = e.loop.checks()
        runner.health(f"loop_{e.settings.name}", alive)
        # Ready = consuming: a failing endpoint does not make the pod unready (restarting
        # it would not help the receiver); its metrics and `status` say it fails.
        runner.ready(f"consuming_{e.settings.name}", joined)
    service = Service(settings, runner, endpoints)
    runner.status(service.status)
    return service


__all__ = ["Batch", "Item", "Service", "WebhookSink", "build", "endpoint_loop"]
