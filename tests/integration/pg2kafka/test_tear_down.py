"""tear-down removes what its stream owns, never what other streams hold in _walcast."""

from __future__ import annotations

import random

from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory


def test_tear_down_of_the_last_cdc_stream_keeps_other_streams_data(
    make_harness: HarnessFactory,
) -> None:
    """Before: the last CDC publication's tear-down dropped the whole _walcast schema,
    taking other streams' events, subscriptions and triggers with it."""
    h = make_harness()
    other = 4 * 10**9 + random.randint(0, 10**8)
    h.sql("INSERT INTO _walcast.streams (id) VALUES (%s)", [other])
    h.sql("INSERT INTO _walcast.events (payload, stream_id) VALUES ('{\"n\": 1}', %s)", [other])
    try:
        publications = h.sql("SELECT publication FROM _walcast.publications")
        assert publications == [(h.settings.replication.publication,)], "not the last stream"
        removed = admin.tear_down(h.settings)
        assert f"slot {h.settings.replication.slot}" in removed
        assert f"publication {h.settings.replication.publication}" in removed
        # the DDL capture serves CDC streams only: it went with the last one
        assert h.sql("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'walcast%'") == [
            (0,)
        ]
        # another stream's events are still there
        assert h.sql("SELECT count(*) FROM _walcast.events WHERE stream_id = %s", [other]) == [(1,)]
    finally:
        h.sql("DELETE FROM _walcast.events WHERE stream_id = %s", [other])
        h.sql("DELETE FROM _walcast.streams WHERE id = %s", [other])
    # with nothing of anyone's left, a tear-down removes the schema too
    admin.tear_down(h.settings)
    assert h.sql("SELECT to_regnamespace('_walcast')::text") == [(None,)]
