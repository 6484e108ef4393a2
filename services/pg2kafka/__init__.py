"""pg2kafka: a Postgres logical replication slot into Kafka (see docs/pg2kafka.md)."""

try:
    from services.pg2kafka import _native  # noqa: F401 - built by pip install (Rust)
except ImportError as exc:  # pragma: no cover - an install without cargo
    raise ImportError(
        "pg2kafka's compiled extension services.pg2kafka._native is not built: install Rust"
        " (cargo) and run `pip install` again (deploy/local/walcast does both)"
    ) from exc
