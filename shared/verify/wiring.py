"""How a sink service runs ``verify`` — once (its ``verify`` command) or continuously
(``verify.interval_s`` in ``run``) — given only how to make its target: the Postgres
side, the key shapes the target needs, the plan from the settings, the errors turned into
what the operator reads. Each sink supplies a :data:`MakeTarget` and where outcomes go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shared.errors import PermanentError, RetriableError, RetriesExhaustedError
from shared.formats import debezium
from shared.settings import VerifySettings
from shared.verify.continuous import Continuous, VerifyMetrics
from shared.verify.core import VerifyTarget
from shared.verify.postgres import PostgresSource
from shared.verify.repair import Repairer, RepairReport
from shared.verify.run import Plan, TableReport, Verifier

KeyShape = Callable[[tuple[str, str]], tuple[tuple[str, ...], tuple[str, ...]]]
"""A table's key columns and their types, as the source reads them."""


class ClosingTarget(VerifyTarget, Protocol):
    def close(self) -> None:
        """Release what the target holds (its Kafka consumer)."""
        ...


MakeTarget = Callable[[str, KeyShape], ClosingTarget]
"""A sink's target for the tables of the source database named by the first argument."""


def _source(v: VerifySettings, input_format: str) -> tuple[PostgresSource, KeyShape]:
    # Row hashes are of the text pg2kafka read: its Debezium format reads money under
    # lc_monetary=C, so verify does too.
    options = debezium.SESSION_OPTIONS if input_format == "debezium" else ""
    source = PostgresSource(
        v.postgres.conninfo(), rows_per_s=v.rows_per_s, workers=v.workers,
        session_options=options,
    )  # fmt: skip

    def key_shape(table: tuple[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        shape = source.shape(table)
        return shape.key, shape.key_types

    return source, key_shape


def _plan(v: VerifySettings) -> Plan:
    return Plan(v.range_rows, v.rounds, v.mark_timeout_s, v.slot, v.retry, v.horizon_wait_s)


def verify_once(
    v: VerifySettings,
    service: str,
    make_target: MakeTarget,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[TableReport], None] | None = None,
    input_format: str = "walcast",
) -> list[TableReport]:
    """Each of ``tables`` compared with Postgres; a transient failure that outlasted its
    retries becomes a PermanentError saying what to look at."""
    source, key_shape = _source(v, input_format)
    target = make_target(source.database(), key_shape)
    try:
        return Verifier(source, target, _plan(v), service, progress).tables(tables)
    except (RetriableError, RetriesExhaustedError) as exc:
        raise PermanentError(str(exc), hint=f"is pg2kafka streaming, {service} running?") from exc
    finally:
        target.close()


def repair_once(
    v: VerifySettings,
    service: str,
    make_target: MakeTarget,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[str], None] | None = None,
    input_format: str = "walcast",
) -> list[RepairReport]:
    """Each of ``tables`` verified and, where it differs, repaired (shared/verify/repair.py);
    failures as in :func:`verify_once`."""
    source, key_shape = _source(v, input_format)
    target = make_target(source.database(), key_shape)
    try:
        verifier = Verifier(source, target, _plan(v), service)
        repairer = Repairer(verifier, source, v.mark_timeout_s, v.repair_attempts, progress)
        return [repairer.table(t) for t in tables]
    except (RetriableError, RetriesExhaustedError) as exc:
        raise PermanentError(str(exc), hint=f"is pg2kafka streaming, {service} running?") from exc
    finally:
        target.close()


def verify_continuously(
    v: VerifySettings,
    service: str,
    make_target: MakeTarget,
    tables: Callable[[], Sequence[tuple[str, str]]],
    metrics: VerifyMetrics,
    record: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    input_format: str = "walcast",
) -> Continuous | None:
    """The continuous mode when ``verify.interval_s`` is set (None otherwise). Postgres is
    asked nothing until the first verification (the service starts without it)."""
    if not v.interval_s:
        return None
    source, key_shape = _source(v, input_format)
    made: list[Verifier] = []

    def verify_one(table: tuple[str, str]) -> TableReport:
        if not made:
            target = make_target(source.database(), key_shape)
            made.append(Verifier(source, target, _plan(v), service))
        return made[0].table(table)

    return Continuous(v.interval_s, tables, verify_one, metrics, record, stop)
