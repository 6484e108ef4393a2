"""ReplicationSession.dispatch: the transaction bookkeeping around a handler."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.session import Liveness, ReplicationSession
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.topics import StreamTarget
from shared.settings import load_settings

REL = pg.Relation(16384, "app", "users", "d", (pg.Column("id", 23, -1, True),))


class Recorder:
    """Records what it is handed and whether the transaction was still open then."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def handle(self, session: ReplicationSession, lsn: int, msg: pg.Decoded) -> None:
        open_txn = session.builder.txn is not None and not session.tracker.idle()
        self.seen.append((type(msg).__name__, open_txn))

    def housekeeping(self, session: ReplicationSession) -> bool:
        return False

    def while_waiting(self, session: ReplicationSession) -> None:
        pass

    def close(self) -> None:
        pass


def session() -> ReplicationSession:
    settings = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False},
        kafka={"bootstrap_servers": "127.0.0.1:1"},
    )  # fmt: skip
    return ReplicationSession(
        settings, StreamTarget.cdc(settings), Metrics(CollectorRegistry()), threading.Event(),
        Liveness(),
    )  # fmt: skip


def test_the_handler_sees_changes_and_the_commit_while_the_transaction_is_open() -> None:
    s = session()
    r = Recorder()
    try:
        messages: list[Any] = [
            pg.Begin(100, 0, 7),
            REL,
            pg.Insert(16384, ("1",)),
            pg.Commit(100, 120, 0),
        ]
        for lsn, msg in enumerate(messages, 90):
            s.dispatch(r, lsn, msg)
        # Begin and Relation are the session's; the Commit comes before the transaction
        # is closed, so a handler can make its work durable before it may be confirmed.
        assert r.seen == [("Insert", True), ("Commit", True)]
        assert s.tracker.idle()  # closed after the handler, nothing sent: confirmable
        assert s.builder.relations[16384] == REL
    finally:
        s.sink.close()
