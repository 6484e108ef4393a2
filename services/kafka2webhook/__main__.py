"""kafka2webhook command line: ``run``, ``status``, ``replay``."""

from __future__ import annotations

import argparse
import json
import sys

from services.kafka2webhook import admin
from services.kafka2webhook.app import build
from services.kafka2webhook.settings import Kafka2WebhookSettings
from shared.cli import add_replay_range, base_parser, run_command
from shared.service import serve


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser("kafka2webhook", "change events from Kafka to HTTP endpoints")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="consume and deliver to every configured endpoint")
    st = sub.add_parser(
        "status", help="per endpoint: delivered, failing, lag, dead letters, last error"
    )
    st.add_argument("--json", action="store_true")
    st.add_argument("--url", help="the running service's /status (default: http.host:port)")
    rp = sub.add_parser("replay", help="deliver again to one endpoint from an offset or a time")
    rp.add_argument("--endpoint", required=True)
    add_replay_range(rp)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command(settings: Kafka2WebhookSettings) -> None:
        if args.command == "status":
            info = admin.status(settings, args.url)
            if args.json:
                print(json.dumps(info, indent=2))
                return
            if not info["service_answered"]:
                print("(the service did not answer: delivered / failing unknown)")
            for e in info["endpoints"]:
                state = "FAILING" if e["failing"] else "ok" if e["failing"] is not None else "?"
                print(f"{e['endpoint']} -> {e['url']}: {state}, delivered {e['delivered']},"
                      f" lag {e['lag']}, dead letters {e['dead_letters']['count']}")  # fmt: skip
                last = e["last_error"] or e["dead_letters"].get("last_reason")
                if last:
                    print(f"  last error: {last}")
        elif args.command == "replay":
            n = admin.replay(
                settings,
                args.endpoint,
                from_offset=args.from_offset,
                from_timestamp=args.from_timestamp,
                partitions=args.partition,
            )
            print(f"replayed {n} records to {args.endpoint}")
        else:
            serve("kafka2webhook", settings, lambda: build(settings))

    return run_command("kafka2webhook", Kafka2WebhookSettings, args, command)


if __name__ == "__main__":
    sys.exit(main())
