"""What ``pg2kafka init`` did, for its summary: a module of its own so that the helpers
``init`` calls (the insert-only publication's) fill it without importing ``admin``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class InitReport:
    """Lines of ``init``'s summary, by kind: objects created, found in place, warnings for
    the operator, and what happens later (at ``run``)."""

    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    later: list[str] = field(default_factory=list)
