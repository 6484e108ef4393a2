"""pg2kafka's compiled per-event path (Rust: ``services/pg2kafka/native/src/lib.rs``),
built by ``pip install`` (setuptools-rust). Its contracts are in the Rust doc comments;
in short:"""

from collections.abc import Callable

class RowEncoder:
    """One relation's columns: names, conversion specs (see
    :mod:`services.pg2kafka.types`), which are key columns."""

    def __init__(self, names: list[str], specs: list[str], key: list[bool]) -> None: ...
    def encode(
        self, values: tuple[object, ...]
    ) -> tuple[bytes, bytes | None, list[str] | None, list[tuple[str, str]] | None]:
        """(row JSON, key JSON or None without key columns, unchanged-TOAST column names
        or None, ``(column, reason)`` of values kept as text or None). A value is str,
        None (NULL) or anything else (unchanged TOAST)."""

class RowHasher:
    """One relation's columns (the stream's names, before any transform) for the row hash
    of shared/contract/rowhash.py."""

    def __init__(self, names: list[str]) -> None: ...
    def hash(self, values: tuple[object, ...]) -> int | None:
        """The row's hash; None when a value is neither str nor None (an unchanged TOAST
        value: the row's text is not all here)."""

def decode_tuple(
    buf: bytes, pos: int, toast: object, undecodable: Callable[[bytes], str]
) -> tuple[tuple[object, ...], int]:
    """A pgoutput TupleData at ``pos``: (values, position after it); ValueError when the
    message does not follow the protocol."""

def convert_value(spec: str, value: str) -> bytes:
    """One value as JSON; ValueError when it does not convert."""
