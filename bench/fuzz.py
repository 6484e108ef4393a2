"""The long run of the fuzz properties: every consumer decoder (``tests/fuzz_properties.py``)
and every receiver-controlled parse of kafka2webhook (``tests/fuzz_webhook_properties.py``),
issue 36, with many more examples than the unit suite.

    .venv/bin/python bench/fuzz.py [--examples 20000] [--only NAME ...]

Each target checks its property on ``--examples`` derandomized examples (hypothesis: the
same ones every run for the same count) and fails loudly with the smallest example it
finds. Prints a table (target, examples, decoded, refused, max µs per record) and writes
``bench/results/fuzz.json``.

Targets come from :data:`TARGET_SOURCES` (the consumer decoders; kafka2webhook's
receiver- and record-controlled parsing); to add some, append a function returning a list
of :class:`tests.fuzz_properties.Target`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fuzz_properties
from tests.fuzz_properties import Stats, Target


def webhook_targets() -> list[Target]:
    """kafka2webhook's receiver- and record-controlled parsing
    (``tests/fuzz_webhook_properties.py``): each property raises on a violation. The raw
    exchange goes over real sockets: a fifth of the examples."""
    from hypothesis import HealthCheck, given, settings

    from tests.fuzz_webhook_properties import TARGETS

    def target(name: str, strategy: Any, prop_check: Callable[[Any], None], share: float) -> Target:
        def run(examples: int) -> Stats:
            stats = Stats(name)

            @settings(max_examples=max(1, int(examples * share)), derandomize=True,
                      database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(strategy)
            def prop(sample: Any) -> None:
                t0 = time.perf_counter()
                prop_check(sample)
                stats.examples += 1
                stats.decoded += 1
                stats.max_us = max(stats.max_us, (time.perf_counter() - t0) * 1e6)

            prop()
            return stats

        return Target(name, run)

    return [target(t.name, t.strategy, t.check, 0.2 if t.name == "webhook.exchange" else 1.0)
            for t in TARGETS]  # fmt: skip


TARGET_SOURCES: list[Callable[[], list[Target]]] = [
    fuzz_properties.targets,  # every consumer decoder
    webhook_targets,  # every receiver-controlled parse of kafka2webhook
]
"""Where the targets come from; each source returns its list of targets."""

RESULTS = Path(__file__).resolve().parent / "results" / "fuzz.json"


def all_targets() -> list[Target]:
    return [t for source in TARGET_SOURCES for t in source()]


def table(rows: list[Stats]) -> str:
    head = f"{'target':<26}{'examples':>10}{'decoded':>10}{'refused':>10}{'max µs':>12}"
    lines = [head, "-" * len(head)]
    for s in rows:
        lines.append(f"{s.name:<26}{s.examples:>10}{s.decoded:>10}{s.refused:>10}{s.max_us:>12.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--only", nargs="*", default=[], help="target names to run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    chosen = [t for t in all_targets() if not args.only or t.name in args.only]
    rows: list[Stats] = []
    started = time.monotonic()
    for target in chosen:
        t0 = time.monotonic()
        stats = target.run(args.examples)
        rows.append(stats)
        print(f"{target.name}: {stats.examples} examples in {time.monotonic() - t0:.1f} s",
              flush=True)  # fmt: skip
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "examples_per_target": args.examples,
                "seconds": round(time.monotonic() - started, 1),
                "targets": [
                    {
                        **s.row(),
                        "reasons": dict(sorted(s.reasons.items(), key=lambda kv: -kv[1])[:20]),
                    }
                    for s in rows
                ],
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
