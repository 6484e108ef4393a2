"""kafka2postgres command line: ``run``, ``status``, ``replay``, ``resume``, ``verify``,
``repair``."""

from __future__ import annotations

import argparse
import json
import sys

from services.kafka2postgres import admin
from services.kafka2postgres.app import build
from services.kafka2postgres.settings import Kafka2PostgresSettings
from services.kafka2postgres.verify import repair, verify
from shared.cli import (
    add_replay_range,
    add_verify_commands,
    base_parser,
    print_repair,
    print_verify,
    run_command,
    say,
    split_table,
)
from shared.service import serve


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser("kafka2postgres", "change events from Kafka into another PostgreSQL")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="consume the CDC topic(s) and apply them to the target")
    st = sub.add_parser("status", help="lag per partition, target tables, dead letters")
    st.add_argument("--json", action="store_true")
    rp = sub.add_parser("replay", help="re-read from an offset or a time into the same tables")
    add_replay_range(rp)
    rp.add_argument(
        "--allow-deleted-to-return",
        action="store_true",
        help="replay records older than target.tombstone_retention_s even though rows"
        " deleted since may come back (refused otherwise)",
    )
    rs = sub.add_parser("resume", help="apply a stopped table's changes again")
    rs.add_argument("--table", required=True, help="the source table, schema.table")
    # --values is accepted and changes nothing: the target's row hashes are always
    # computed from the values it holds
    add_verify_commands(sub, "the target's tables", "every table the target holds")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command(settings: Kafka2PostgresSettings) -> int | None:
        if args.command == "status":
            info = admin.status(settings)
            if args.json:
                print(json.dumps(info, indent=2))
                return None
            print(f"group {info['group']}, total lag {info['total_lag']}")
            for p in info["lag"]:
                print(f"  {p['topic']}[{p['partition']}]  committed {p['committed']}"
                      f"  end {p['end']}  lag {p['lag']}")  # fmt: skip
            for t in info["tables"]:
                state = f"STOPPED: {t['stopped']}" if t["stopped"] else "applying"
                print(f"  {t['source']} -> {t['target']}: {t['rows']} rows ({state})")
            print(f"dead letters: {info['dead_letters']}")
        elif args.command == "replay":
            n = admin.replay(
                settings,
                from_offset=args.from_offset,
                from_timestamp=args.from_timestamp,
                partitions=args.partition,
                allow_deleted_to_return=args.allow_deleted_to_return,
            )
            print(f"replayed {n} records")
        elif args.command == "verify":
            tables = [split_table(t) for t in args.table]
            return print_verify(verify(settings, tables), args.json)
        elif args.command == "repair":
            tables = [split_table(t) for t in args.table]
            return print_repair(repair(settings, tables, say), args.json)
        elif args.command == "resume":
            schema, table = split_table(args.table)
            if admin.resume(settings, schema, table):
                print(f"{args.table}: resumed; records dead-lettered while it was stopped are"
                      " not applied: re-snapshot it (pg2kafka snapshot)")  # fmt: skip
            else:
                print(f"{args.table}: was not stopped")
        else:
            serve("kafka2postgres", settings, lambda: build(settings))
        return None

    return run_command("kafka2postgres", Kafka2PostgresSettings, args, command)


if __name__ == "__main__":
    sys.exit(main())
