"""The roles every walcast pipeline is made of: source, sink, checkpointer, serializer.

Each service wires one implementation of each role in its ``build(settings)``;
implementations are named after their technology (``PostgresReplicationSource``,
``KafkaSink``...). Unit tests use fakes that subclass these same bases.

The delivery contract across all of them is *at-least-once*: a crash may redeliver the
unconfirmed tail, so every sink must tolerate duplicates (idempotent writes keyed by LSN).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Position = TypeVar("Position")


class Serializer(ABC, Generic[Item]):
    """Turns items into bytes and back.

    ``encode`` is pure and deterministic (the same item always gives the same bytes), so a
    redelivered item is byte-identical. ``decode`` raises ``ValueError`` (or a subclass)
    for bytes it cannot parse; callers route those to a dead-letter destination.
    """

    @abstractmethod
    def encode(self, item: Item) -> bytes: ...

    @abstractmethod
    def decode(self, data: bytes) -> Item: ...


class Checkpointer(ABC, Generic[Position]):
    """Records how far the pipeline has *durably* delivered.

    ``commit(position)`` is called only after the sink acknowledged every item up to and
    including ``position`` (checkpoint last). Positions passed are non-decreasing;
    committing the same position twice is harmless. A failure raises; the caller retries
    or stops, and in either case the source will redeliver from the last committed
    position, never skip past it.
    """

    @abstractmethod
    def commit(self, position: Position) -> None: ...

    @abstractmethod
    def committed(self) -> Position | None:
        """The last position known to be committed (None before the first)."""


class Sink(ABC, Generic[Item, Position]):
    """Where items go.

    ``write`` hands an item over and may return before the item is durable; ``on_durable``
    (given at construction or by ``set_listener``) is called with the item's position once
    it is — possibly on another thread, in any order across partitions. ``flush`` blocks
    until everything written so far is durable or raises. ``write`` may block when the
    sink's memory budget is used up (backpressure); it never drops an item.
    """

    @abstractmethod
    def set_listener(self, on_durable: Callable[[Position], None]) -> None: ...

    @abstractmethod
    def write(self, item: Item, position: Position) -> None: ...

    @abstractmethod
    def flush(self, timeout_s: float) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class Source(ABC, Generic[Item, Position]):
    """Where items come from, in order.

    ``poll`` returns the next item with its position, or None when nothing arrived within
    ``timeout_s``. Items come in source order (for Postgres: commit order, changes of a
    transaction together). After a restart the source resumes after the last position the
    checkpointer committed, so items after it are redelivered, never skipped.
    """

    @abstractmethod
    def poll(self, timeout_s: float) -> tuple[Item, Position] | None: ...

    @abstractmethod
    def close(self) -> None: ...
