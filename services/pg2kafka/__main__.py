"""pg2kafka command line: ``init``, ``run``, ``status``, ``tear-down``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from services.pg2kafka import admin
from services.pg2kafka.app import build
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.errors import (
    RetriesExhaustedError,
    Verdict,
    WalcastError,
    classify,
    operator_hint,
)
from shared.logs import configure_logging, register_secret
from shared.settings import load_settings

log = logging.getLogger("pg2kafka")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pg2kafka", description="Postgres changes into Kafka")
    parser.add_argument("--config", type=Path, help="YAML settings file")
    parser.add_argument("--env-file", type=Path, help="dotenv file (the local stack writes one)")
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
    try:
        settings = load_settings(Pg2KafkaSettings, config_file=args.config, env_file=args.env_file)
    except WalcastError as exc:
        print(f"pg2kafka: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log.level, settings.log.format)
    register_secret(settings.postgres.password.get_secret_value())
    if settings.kafka.sasl_password is not None:
        register_secret(settings.kafka.sasl_password.get_secret_value())
    try:
        if args.command == "init":
            report = admin.init(settings, migrations_only=args.migrations_only)
            for item in report.created:
                print(f"created  {item}")
            for item in report.existing:
                print(f"exists   {item}")
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
            log.info("starting", extra={"config": settings.effective()})
            service = build(settings)
            service.install_signal_handlers()
            service.run()
    except Exception as exc:
        if classify(exc) is not Verdict.PERMANENT and not isinstance(exc, RetriesExhaustedError):
            raise
        hint = operator_hint(exc)
        message = str(exc) if not hint or hint in str(exc) else f"{exc} — {hint}"
        log.error("stopping: %s", message)
        print(f"pg2kafka: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
