"""kafka2postgres's compiled bulk path (services/kafka2postgres/native, Rust)."""

def copy_rows(
    rows: list[bytes],
    columns: list[tuple[str, str]],
    key_at: list[int],
    key_types: list[str],
    tbl: int,
    versions: list[int],
    hashes: list[int | None],
    xids: list[int],
) -> tuple[bytes, bytes | None, list[bytes]]: ...
