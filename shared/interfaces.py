"""The roles every walcast pipeline is made of: source, sink, checkpointer, serializer,
and the batch sink a consumer loop feeds.

Each is a :class:`typing.Protocol` whose methods are the real signatures of its
implementations (named after their technology: ``PostgresReplicationSource``,
``KafkaSink``, ``KafkaOffsetCheckpointer``, ``JsonEventSerializer``, kafka2search's
``Indexer``); implementations name the protocol as a base so mypy holds them to it, and
unit tests use fakes that implement the same protocol rather than subclass a concrete
class.

The delivery contract across all of them is *at-least-once*: a crash may redeliver the
unconfirmed tail, so every sink must tolerate duplicates (idempotent writes keyed by LSN).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol, TypeVar

import msgspec

from shared.contract.event import EventView

Item = TypeVar("Item")
Item_co = TypeVar("Item_co", covariant=True)
Item_contra = TypeVar("Item_contra", contravariant=True)
Position = TypeVar("Position")
Position_contra = TypeVar("Position_contra", contravariant=True)


class Serializer(Protocol[Item]):
    """Turns items into bytes and back.

    ``encode`` is pure and deterministic (the same item always gives the same bytes), so a
    redelivered item is byte-identical. ``decode`` raises ``ValueError`` (or a subclass)
    for bytes it cannot parse; callers route those to a dead-letter destination.
    """

    def encode(self, item: Item) -> bytes: ...

    def decode(self, data: bytes) -> Item: ...


class Checkpointer(Protocol[Position]):
    """Records how far the pipeline has *durably* delivered.

    ``commit(position)`` is called only after the sink acknowledged every item up to and
    including ``position`` (checkpoint last). Positions passed are non-decreasing;
    committing the same position twice is harmless. ``wait=False`` may return before the
    store answered (a later ``wait=True`` commit covers it). A failure raises; the caller
    retries or stops, and in either case the source will redeliver from the last
    committed position, never skip past it.
    """

    def commit(self, position: Position, *, wait: bool = True) -> None: ...

    def committed(self) -> Position | None:
        """The last position known to be committed (None before the first)."""
        ...


class Sink(Protocol[Item_contra, Position]):
    """Where items go.

    ``write`` hands an item over and may return before the item is durable; the listener
    given to ``set_listener`` is called with the item's position once it is — possibly on
    another thread, in any order across partitions. ``flush`` blocks until everything
    written so far is durable or raises. ``write`` may block when the sink's memory
    budget is used up (backpressure); it never drops an item.
    """

    def set_listener(self, on_durable: Callable[[Position], None]) -> None: ...

    def write(self, item: Item_contra, position: Position) -> None: ...

    def flush(self, timeout_s: float) -> None: ...

    def close(self) -> None: ...


class Source(Protocol[Item_co, Position_contra]):
    """Where items come from, in order.

    ``start`` connects and resumes after the last confirmed position; ``poll_batch``
    returns up to ``max_items`` items with their positions (possibly none within
    ``timeout_s``), in source order (for Postgres: commit order, changes of a transaction
    together). ``confirm`` tells the source everything up to a position is durable
    downstream: only then may it be forgotten. After a restart items after the last
    confirmed position are redelivered, never skipped.
    """

    def start(self) -> None: ...

    def poll_batch(self, max_items: int, timeout_s: float, /) -> Sequence[tuple[int, Item_co]]: ...

    def confirm(self, position: Position_contra, /) -> None: ...

    def close(self) -> None: ...


# -- the batch sink a consumer loop feeds (shared.consumer) -------------------------------


class Origin(msgspec.Struct, frozen=True, gc=False):
    """Where a record came from; a dead letter carries it. (A struct: one is made per
    record, and its constructor runs in C.)"""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


Rejection = tuple[Origin, str]
"""A record the sink refused for good, and the sink's reason."""

Wait = Callable[[float], object]
"""Sleep this long without leaving the consumer group (partitions paused, consumer
polled)."""


class SinkBatch(Protocol):
    """What the loop needs of a sink's batch: its size, to decide when to flush."""

    records: int  # records folded in (including those reduced away or refused)
    bytes: int  # bytes of those records: the memory budget is on what was consumed

    def __len__(self) -> int:
        """Items the write will carry (after the sink's reduction)."""
        ...

    def clear(self) -> None: ...


B = TypeVar("B", bound=SinkBatch)


class BatchSink(Protocol[B]):
    """The sink side of :class:`shared.consumer.ConsumerLoop`.

    Ordering: ``add`` and ``control`` are called on the loop's thread, in partition order.
    ``write`` runs on a writer thread; up to ``batch.concurrency`` writes overlap, handed
    over in order, and ``before`` holds the futures of the writes handed over earlier
    (running or done), for a sink that must not overtake them.

    Idempotency: after a failure or a crash the uncommitted records are read again, so a
    batch or a control event may be applied twice, and an older change may arrive after a
    newer one was written. Sinks version by the event's ``lsn``.

    Failure: ``add`` returns a reason for an event that can never be written (the loop
    dead-letters it and goes on); ``write`` returns the records it refused for good and
    raises for anything else (nothing of that batch is committed; the loop reconnects and
    re-reads). ``control`` raises likewise. Offsets move only after ``write`` returned and
    its refusals reached the dead-letter topic.
    """

    def new_batch(self) -> B: ...

    def add(self, batch: B, event: EventView, origin: Origin) -> str | None: ...

    def write(
        self, batch: B, sleep: Wait, before: tuple[Future[list[Rejection]], ...]
    ) -> list[Rejection]: ...

    def control(self, event: EventView) -> None:
        """A truncate or DDL event, with nothing in flight and everything before it
        committed."""
        ...
