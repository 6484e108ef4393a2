"""kafka2postgres: the change stream applied to another PostgreSQL (see
docs/kafka2postgres.md)."""

try:
    from services.kafka2postgres import _native  # noqa: F401 - built by pip install (Rust)
except ImportError as exc:  # pragma: no cover - an install without cargo
    raise ImportError(
        "kafka2postgres's compiled extension services.kafka2postgres._native is not built:"
        " install Rust (cargo) and run `pip install` again (deploy/local/walcast does both)"
    ) from exc
