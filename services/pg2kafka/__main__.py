"""pg2kafka command line: ``init``, ``run``, ``status``, ``tear-down``."""

from __future__ import annotations

import argparse
import json
import sys

from services.pg2kafka import admin
from services.pg2kafka.app import build
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.cli import base_parser, run_command
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command(settings: Pg2KafkaSettings) -> None:
        if args.command == "init":
            report = admin.init(settings, migrations_only=args.migrations_only)
            for item in report.created:
                print(f"created  {item}")
            for item in report.existing:
                print(f"exists   {item}")
            for item in report.warnings:
                print(f"warning  {item}")
        elif args.command == "tear-down":
            for item in admin.tear_down(settings):
                print(f"removed  {item}")
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
