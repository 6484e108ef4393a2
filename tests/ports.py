"""Ports for the servers a test starts, chosen so that nothing else takes them first.

Binding port 0 and closing the socket hands out a port from the kernel's ephemeral range
(32768-60999 on Linux), the same range every outgoing connection (Kafka clients, Spark,
Postgres) draws its local port from: between the test choosing the port and the service
binding it, a connection of another test could take it ("Address already in use", seen in
CI). These ports come from 20000-28999 instead, below the ephemeral range and the local
stack's ports, split between the xdist workers so that two workers never hand out the same
one, and handed out in turn within a worker so that one is not given twice while in use.
"""

from __future__ import annotations

import itertools
import os
import socket

_LOW, _HIGH = 20000, 29000


def _range() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (_HIGH - _LOW) // max(count, 1)
    start = _LOW + index * size
    return range(start + (os.getpid() % 97), start + size)


_next = itertools.cycle(_range())


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and no other test is handed."""
    for _ in range(2000):
        port = next(_next)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_range()} on 127.0.0.1")
