"""kafka2search command line: ``run``, ``status``, ``replay``, ``forget``, ``verify``,
``repair``."""

from __future__ import annotations

import argparse
import json
import sys

from services.kafka2search import admin
from services.kafka2search.app import build
from services.kafka2search.engines import engine_for
from services.kafka2search.indices import forget
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.verify import repair, verify
from shared.cli import (
    add_replay_range,
    add_verify_commands,
    base_parser,
    print_last_verified,
    print_repair,
    print_verify,
    run_command,
    say,
    split_table,
    with_values,
)
from shared.service import serve


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser("kafka2search", "change events from Kafka into OpenSearch / Elasticsearch")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="consume the CDC topic(s) and index them")
    st = sub.add_parser("status", help="lag per partition, documents per index, dead letters")
    st.add_argument("--json", action="store_true")
    rp = sub.add_parser("replay", help="re-read from an offset or a time into the same indices")
    add_replay_range(rp)
    fg = sub.add_parser(
        "forget", help="let an alias whose index was deleted be created again, empty"
    )
    fg.add_argument("--alias", required=True)
    add_verify_commands(sub, "indices", "every table the service indexes")
    rp.add_argument(
        "--allow-deleted-to-return",
        action="store_true",
        help="replay records older than index.gc_deletes even though rows deleted since"
        " may come back (refused otherwise)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command(settings: Kafka2SearchSettings) -> int | None:
        if args.command == "status":
            info = admin.status(settings)
            if args.json:
                print(json.dumps(info, indent=2))
                return None
            print(f"group {info['group']} ({info['engine']}), total lag {info['total_lag']}")
            for p in info["lag"]:
                print(f"  {p['topic']}[{p['partition']}]  committed {p['committed']}"
                      f"  end {p['end']}  lag {p['lag']}")  # fmt: skip
            for i in info["indices"]:
                print(f"  {i['alias']} -> {i['index']}: {i['documents']} documents")
            print(f"dead letters: {info['dead_letters']}")
            print_last_verified(info["verify"])
        elif args.command == "forget":
            engine = engine_for(settings.engine)
            try:
                known = forget(engine, args.alias)
            finally:
                engine.close()
            state = "forgotten" if known else "was not registered"
            print(
                f"{args.alias}: {state}; the next write creates its index again, empty:"
                " replay or re-snapshot to fill it"
            )
        elif args.command == "verify":
            tables = [split_table(t) for t in args.table]
            return print_verify(verify(with_values(settings, args.values), tables), args.json)
        elif args.command == "repair":
            tables = [split_table(t) for t in args.table]
            reports = repair(with_values(settings, args.values), tables, say)
            return print_repair(reports, args.json)
        elif args.command == "replay":
            n = admin.replay(
                settings,
                from_offset=args.from_offset,
                from_timestamp=args.from_timestamp,
                partitions=args.partition,
                allow_deleted_to_return=args.allow_deleted_to_return,
            )
            print(f"replayed {n} records")
        else:
            serve("kafka2search", settings, lambda: build(settings))
        return None

    return run_command("kafka2search", Kafka2SearchSettings, args, command)


if __name__ == "__main__":
    sys.exit(main())
