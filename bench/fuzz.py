"""The long run of the fuzz properties: every consumer decoder (``tests/fuzz_properties.py``,
issue 36) with many more examples than the unit suite.

    .venv/bin/python bench/fuzz.py [--examples 20000] [--only NAME ...]

Each target checks its property on ``--examples`` derandomized examples (hypothesis: the
same ones every run for the same count) and fails loudly with the smallest example it
finds. Prints a table (target, examples, decoded, refused, max µs per record) and writes
``bench/results/fuzz.json``.

To add targets (e.g. kafka2webhook's receiver-controlled parsing), append a function
returning a list of :class:`tests.fuzz_properties.Target` to :data:`TARGET_SOURCES`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fuzz_properties
from tests.fuzz_properties import Stats, Target

TARGET_SOURCES: list[Callable[[], list[Target]]] = [
    fuzz_properties.targets,  # every consumer decoder
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
