"""The quarantined-events gauge follows _walcast.subscription_errors of the stream."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import psycopg
from prometheus_client import CollectorRegistry

from services.pg2kafka import admin
from services.pg2kafka.app import Maintenance, Metrics
from shared.migrations import migrate
from tests.integration.conftest import make_settings


def test_quarantined_events_gauge(
    env_file: Path, stack_env: dict[str, str], unique_name: str
) -> None:
    dsn = stack_env["WALCAST_PG_DSN"]
    stream = random.randint(10**9, 2 * 10**9)
    settings = make_settings(
        env_file, unique_name, subscriptions={"enabled": True, "stream_id": stream}
    )
    with psycopg.connect(dsn, autocommit=True) as c:
        migrate(c)
        # Another test's tear-down of the database's last CDC stream may have removed the
        # DDL capture (init puts it back); this test checks that deleting a subscription
        # stream leaves it in place, so it starts with it installed.
        admin.install_ddl_capture(c)
        c.execute(
            "INSERT INTO _walcast.subscription_errors (key, stream_id, schema_name, table_name,"
            " operation, sqlstate, message) VALUES ('k', %s, 's', 't', 'INSERT', '22012',"
            " 'division by zero'), ('k', %s, 's', 't', 'INSERT', '22012', 'division by zero')",
            [stream, stream],
        )
    registry = CollectorRegistry()
    metrics = Metrics(registry, prefix="walcast_test")

    def gauge() -> float | None:
        return registry.get_sample_value("walcast_test_quarantined_events")

    stop = threading.Event()
    Maintenance.QUARANTINE_POLL_S = 0.2
    thread = threading.Thread(target=Maintenance(settings, stop, metrics).run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while gauge() != 2:
            assert time.monotonic() < deadline, f"gauge at {gauge()}, expected 2"
            time.sleep(0.1)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DELETE FROM _walcast.subscription_errors WHERE stream_id = %s", [stream])
        while gauge() != 0:
            assert time.monotonic() < deadline, f"gauge at {gauge()}, expected 0"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(30)
        Maintenance.QUARANTINE_POLL_S = 15.0
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DELETE FROM _walcast.streams WHERE id = %s", [stream])
            # The stack's owner is a superuser: DDL capture is installed.
            assert admin.ddl_capture_installed(c)
