"""The continuous mode (shared/verify/continuous.py): tables verified one per interval in
rotation; a finished report sets the metrics (rows by result, differing rows, the time of
the last equal result) and is recorded for ``status``; a verification that fails is
counted, logged and recorded, and the next table comes next time."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from shared.verify.continuous import Continuous, VerifyMetrics
from shared.verify.run import TableReport

A, B = ("app", "a"), ("app", "b")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_tables_in_rotation_metrics_and_records() -> None:
    registry = CollectorRegistry()
    recorded: list[dict[str, object]] = []
    calls: list[tuple[str, str]] = []

    def verify_one(table: tuple[str, str]) -> TableReport:
        calls.append(table)
        if len(calls) == 3:
            raise RuntimeError("Postgres went away")
        r = TableReport(table, rows=10)
        if table == B:
            r.missing.append((4,))
        return r

    c = Continuous(60, lambda: [A, B], verify_one, VerifyMetrics(registry), recorded.append,
                   threading.Event())  # fmt: skip
    for _ in range(4):
        c.once()
    assert calls == [A, B, A, B]
    assert [o["table"] for o in recorded] == ["app.a", "app.b", "app.a", "app.b"]
    assert recorded[2]["ok"] is None
    assert "Postgres went away" in str(recorded[2]["error"])
    assert sample(registry, "walcast_verify_rows_total", table="app.a", result="checked") == 10
    assert sample(registry, "walcast_verify_rows_total", table="app.b", result="missing") == 2
    assert sample(registry, "walcast_verify_differences", table="app.b") == 1
    assert sample(registry, "walcast_verify_differences", table="app.a") == 0
    assert (sample(registry, "walcast_verify_last_success_timestamp", table="app.a") or 0) > 0
    assert sample(registry, "walcast_verify_last_success_timestamp", table="app.b") is None
    assert sample(registry, "walcast_verify_failures_total", table="app.a") == 1


def test_no_table_yet_is_nothing_to_do() -> None:
    c = Continuous(60, lambda: [], lambda t: TableReport(t), VerifyMetrics(CollectorRegistry()),
                   lambda o: None, threading.Event())  # fmt: skip
    assert c.once() is None


def test_the_thread_ends_with_the_service() -> None:
    stop = threading.Event()
    c = Continuous(0.01, lambda: [A], lambda t: TableReport(t),
                   VerifyMetrics(CollectorRegistry()), lambda o: None, stop)  # fmt: skip
    c.start()
    stop.set()
    c.thread.join(5)
    assert not c.thread.is_alive()
