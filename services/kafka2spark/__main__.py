"""kafka2spark command line: ``run``, ``status``, ``maintain``, ``release``, ``verify``,
``repair``."""

from __future__ import annotations

import argparse
import json
import sys

from services.kafka2spark import admin, held
from services.kafka2spark.app import build
from services.kafka2spark.settings import Kafka2SparkSettings
from shared.cli import (
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
from shared.errors import ConfigError
from shared.service import serve


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser("kafka2spark", "change events from Kafka into Delta Lake tables")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the streaming query (until stopped)")
    st = sub.add_parser("status", help="last batch, lag per partition, tables and row counts")
    st.add_argument("--json", action="store_true")
    sub.add_parser("maintain", help="compact small files and vacuum past the retention")
    rl = sub.add_parser("release", help="mirror a held table again (see status)")
    rl.add_argument("--table", required=True, help="db.schema.table, as status lists it")
    add_verify_commands(sub, "mirrors", "every table mirrored")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command(settings: Kafka2SparkSettings) -> int | None:
        if args.command == "run":
            serve("kafka2spark", settings, lambda: build(settings))
        elif args.command == "status":
            info = admin.status(settings)
            if args.json:
                print(json.dumps(info, indent=2))
                return None
            last = info["last_batch"]
            print(f"group {info['group']}, checkpoint {info['checkpoint']}")
            print(
                f"last batch: {last['batch_id']} at {last['committed_at']}"
                if last
                else "last batch: none yet"
            )
            for p in info["lag"]:
                print(f"  {p['topic']}[{p['partition']}]  committed {p['committed']}"
                      f"  end {p['end']}  lag {p['lag']}")  # fmt: skip
            print(f"total lag: {info['total_lag']}")
            for t in info["tables"]:
                print(f"  {t['table']:<40} version {t['version']:>6} {t['rows']:>12} rows")
            for table, why in info["held"].items():
                print(f"  HELD {table}: {why['reason']} (since batch {why['batch_id']})")
            print_last_verified(info["verify"])
        elif args.command == "verify":
            tables = [split_table(t) for t in args.table]
            from services.kafka2spark.verify import verify  # pyarrow, numpy: not for run

            return print_verify(verify(with_values(settings, args.values), tables), args.json)
        elif args.command == "repair":
            tables = [split_table(t) for t in args.table]
            from services.kafka2spark.verify import repair  # pyarrow, numpy: not for run

            reports = repair(with_values(settings, args.values), tables, say)
            return print_repair(reports, args.json)
        elif args.command == "release":
            if not held.release(settings.delta.root, args.table):
                raise ConfigError(
                    f"{args.table} is not held", hint="`kafka2spark status` lists held tables"
                )
            print(
                f"released {args.table}: its changes while held are in the quarantine; bring"
                " its rows back (re-snapshot, or replay into an emptied mirror)"
            )
        else:
            for entry in admin.maintain(settings):
                print(
                    f"  {entry['table']:<40} compacted {entry['files_removed']} files into"
                    f" {entry['files_added']}, vacuumed {entry['vacuumed']}"
                )
        return None

    return run_command("kafka2spark", Kafka2SparkSettings, args, command)


if __name__ == "__main__":
    sys.exit(main())
