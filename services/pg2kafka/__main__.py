"""pg2kafka command line: ``init``, ``run``, ``status``, ``snapshot``, ``tear-down``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from services.pg2kafka import admin
from services.pg2kafka.app import build
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.cli import base_parser, run_command
from shared.errors import PermanentError
from shared.service import serve


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser("pg2kafka", "Postgres changes into Kafka")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="migrations, publication, slot, topic (idempotent)")
    init.add_argument(
        "--migrations-only", action="store_true", help="apply the SQL migrations and nothing else"
    )
    sub.add_parser("run", help="stream the slot into Kafka")
    st = sub.add_parser("status", help="slot lag, confirmed LSN, publication tables, Kafka")
    st.add_argument("--json", action="store_true")
    sub.add_parser("tear-down", help="drop what init created (the topic is kept)")
    snap = sub.add_parser(
        "snapshot", help="snapshot tables on the running pipeline (--table); progress; cancel"
    )
    snap.add_argument(
        "--table",
        action="append",
        metavar="SCHEMA.TABLE",
        help="snapshot this table incrementally (repeat for several)",
    )
    snap_sub = snap.add_subparsers(dest="snapshot_command")
    snap_status = snap_sub.add_parser(
        "status", help="per table: rows done / estimated, rows/s, ETA, chunks left"
    )
    snap_status.add_argument("--json", action="store_true")
    cancel = snap_sub.add_parser("cancel", help="stop the running snapshot; streaming goes on")
    cancel.add_argument("--id", type=int, help="the snapshot to cancel (default: the running one)")
    return parser


def print_snapshots(runs: list[dict[str, Any]]) -> None:
    if not runs:
        print("no snapshot recorded for this slot")
    for run in runs:
        print(f"snapshot #{run['id']} ({run['kind']}, {run['requested_by']}): {run['state']}"
              f", version {run['version']}, started {run['created_at']}")  # fmt: skip
        if run["error"]:
            print(f"  {run['error']}")
        for t in run["tables"]:
            estimate = "?" if t["estimate"] is None else f"{t['estimate']:,}"
            rate = "-" if t["rows_per_s"] is None else f"{t['rows_per_s']:,}/s"
            eta = "-" if t["eta_s"] is None else f"{t['eta_s']}s"
            print(f"  {t['table']:<40} {t['state']:<8} {t['rows']:>12,} / {estimate:<12}"
                  f" {rate:>12}  ETA {eta:<8} chunks left"
                  f" {t['chunks'] - t['chunks_done']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command(settings: Pg2KafkaSettings) -> None:
        if args.command == "init":
            report = admin.init(settings, migrations_only=args.migrations_only)
            for item in report.created:
                print(f"created  {item}")
            for item in report.existing:
                print(f"exists   {item}")
            for item in report.later:
                print(f"later    {item}")
            for item in report.warnings:
                print(f"warning  {item}")
        elif args.command == "tear-down":
            for item in admin.tear_down(settings):
                print(f"removed  {item}")
        elif args.command == "snapshot" and args.snapshot_command == "status":
            runs = admin.snapshot_status(settings)
            if args.json:
                print(json.dumps(runs, indent=2))
            else:
                print_snapshots(runs)
        elif args.command == "snapshot" and args.snapshot_command is None:
            if not args.table:
                raise PermanentError(
                    "nothing to do", hint="pg2kafka snapshot --table SCHEMA.TABLE | status | cancel"
                )
            for name, request in zip(args.table, admin.snapshot_request(settings, args.table),
                                     strict=True):  # fmt: skip
                print(f"requested snapshot of {name} (request #{request})")
        elif args.command == "snapshot":
            cancelled = admin.snapshot_cancel(settings, args.id)
            if not cancelled:
                raise PermanentError(
                    "no running snapshot to cancel" + (f" with id {args.id}" if args.id else ""),
                    hint="`pg2kafka snapshot status` lists the slot's snapshots",
                )
            for run_id in cancelled:
                print(f"cancelled snapshot #{run_id}")
        elif args.command == "status":
            info = admin.status(settings)
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                for key, value in info.items():
                    print(f"{key:<20}{value}")
        else:
            serve("pg2kafka", settings, lambda: build(settings))

    return run_command("pg2kafka", Pg2KafkaSettings, args, command)


if __name__ == "__main__":
    sys.exit(main())
