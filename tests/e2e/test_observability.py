"""The dashboard and the alert rules against what running services export.

pg2kafka (a leader and its standby), kafka2search, kafka2spark, kafka2webhook (to a
receiver in the test process) and kafka2postgres (into a database of its own) run as
processes on a real workload; their ``/metrics`` are scraped over HTTP and parsed with
Prometheus' text parser. Every metric the Grafana dashboard and the alert rules use must
be exported by one of them, metric names follow one convention, and the values that the
alerts rely on say what they should (one leader, one ready standby, the slot's retained
WAL, Kafka → sink ages observed, no target table stopped)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from services.pg2kafka import admin
from tests.e2e.conftest import Proc, pg2kafka_env, pg2kafka_settings, wait_until
from tests.ports import free_port
from tests.webhook_receiver import Receiver

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "deploy" / "kubernetes" / "walcast" / "files"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
            "_created"), "gauge": ("",), "summary": ("", "_sum", "_count", "_created")}  # fmt: skip
SECRET = "observability-signing-secret"
UNITS = ("_seconds", "_bytes", "_records", "_messages", "_lsn", "_rows", "_id")


def used_metrics() -> dict[str, set[str]]:
    """Metric names in the dashboard's and the rules' PromQL, per file."""
    dashboard = json.loads((FILES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    rule_exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    pattern = re.compile(r"\bwalcast_[a-z0-9_]+")
    return {
        "dashboard": {m for e in exprs for m in pattern.findall(e)},
        "rules": {m for e in rule_exprs for m in pattern.findall(e)},
    }


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_dashboard_and_rules_use_only_exported_metrics(
    stack_env: dict[str, str], unique_name: str, tmp_path: Path
) -> None:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    dsn = stack_env["WALCAST_PG_DSN"]
    search_url = stack_env["WALCAST_OPENSEARCH_URL"]
    topic = f"{unique_name}.cdc"
    table = f"{unique_name}_rows"
    target_db = f"k2p_{unique_name[-8:]}"  # kafka2postgres's target: a database of its own
    pg = pg2kafka_settings(env_file, unique_name, topic, 2)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL)")
        c.execute(f'CREATE DATABASE "{target_db}"')
    admin.init(pg)
    ports = {"leader": free_port(), "standby": free_port(), "search": free_port(),
             "spark": free_port(), "webhook": free_port(), "target": free_port()}  # fmt: skip
    receiver = Receiver(SECRET.encode()).start()
    procs: list[Proc] = []
    args = ["--env-file", str(env_file), "run"]

    def scraped(port: int) -> str:
        for p in procs:
            if not p.alive():
                pytest.fail(f"a service stopped:\n{p.tail(40)}", pytrace=False)
        try:
            return scrape(port)
        except OSError:
            return ""  # not listening yet

    def value(port: int, name: str, **labels: str) -> float:
        return sample(scraped(port), name, **labels) or 0.0

    def pg2kafka(role: str) -> Proc:
        env = {**pg2kafka_env(unique_name, topic), "PG2KAFKA_HTTP__PORT": str(ports[role])}
        return Proc("pg2kafka", args, env, tmp_path / f"pg2kafka-{role}.log")

    try:
        procs.append(pg2kafka("leader"))
        wait_until(lambda: value(ports["leader"], "walcast_pg2kafka_role", role="leader") == 1,
                   "the first pg2kafka to lead", 120)  # fmt: skip
        procs.append(pg2kafka("standby"))
        procs.append(Proc("kafka2search", args, {
            "KAFKA2SEARCH_CONSUMER__TOPICS": json.dumps([topic]),
            "KAFKA2SEARCH_CONSUMER__GROUP_ID": f"{unique_name}-search",
            "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{unique_name}.dlq",
            "KAFKA2SEARCH_ENGINE__KIND": "opensearch",
            "KAFKA2SEARCH_ENGINE__URLS": json.dumps([search_url]),
            "KAFKA2SEARCH_INDEX__NAME_TEMPLATE": f"{unique_name}-{{table}}",
            "KAFKA2SEARCH_HTTP__PORT": str(ports["search"]),
            "KAFKA2SEARCH_LOG__FORMAT": "text",
        }, tmp_path / "kafka2search.log"))  # fmt: skip
        procs.append(Proc("kafka2spark", args, {
            "KAFKA2SPARK_SOURCE__TOPICS": json.dumps([topic]),
            "KAFKA2SPARK_SOURCE__GROUP_ID": f"{unique_name}-spark",
            "KAFKA2SPARK_DELTA__ROOT": str(tmp_path / "delta"),
            "KAFKA2SPARK_TRIGGER__INTERVAL_S": "2",
            "KAFKA2SPARK_HTTP__PORT": str(ports["spark"]),
            "KAFKA2SPARK_LOG__FORMAT": "text",
        }, tmp_path / "kafka2spark.log"))  # fmt: skip
        procs.append(Proc("kafka2webhook", args, {
            "KAFKA2WEBHOOK_CONSUMER__TOPICS": json.dumps([topic]),
            "KAFKA2WEBHOOK_CONSUMER__GROUP_ID": f"{unique_name}-webhook",
            "KAFKA2WEBHOOK_CONSUMER__DLQ_TOPIC": f"{unique_name}.webhook-dlq",
            "KAFKA2WEBHOOK_ENDPOINTS": json.dumps([{"name": "e2e", "url": receiver.url()}]),
            "KAFKA2WEBHOOK_SECRETS__E2E": SECRET,
            "KAFKA2WEBHOOK_HTTP__PORT": str(ports["webhook"]),
            "KAFKA2WEBHOOK_LOG__FORMAT": "text",
        }, tmp_path / "kafka2webhook.log"))  # fmt: skip
        procs.append(Proc("kafka2postgres", args, {
            "KAFKA2POSTGRES_CONSUMER__TOPICS": json.dumps([topic]),
            "KAFKA2POSTGRES_CONSUMER__GROUP_ID": f"{unique_name}-target",
            "KAFKA2POSTGRES_CONSUMER__DLQ_TOPIC": f"{unique_name}.target-dlq",
            "KAFKA2POSTGRES_TARGET__POSTGRES__DATABASE": target_db,
            "KAFKA2POSTGRES_HTTP__PORT": str(ports["target"]),
            "KAFKA2POSTGRES_LOG__FORMAT": "text",
        }, tmp_path / "kafka2postgres.log"))  # fmt: skip
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"INSERT INTO {table} SELECT g, g FROM generate_series(1, 300) g")
            c.execute(f"UPDATE {table} SET v = v + 1 WHERE id % 2 = 0")
        for port, metric, what, limit in [
            (ports["search"], "walcast_kafka2search_record_age_seconds_count",
             "kafka2search to write a batch", 180),
            (ports["spark"], "walcast_kafka2spark_record_age_seconds_count",
             "kafka2spark to commit a batch", 300),
            (ports["leader"], "walcast_pg2kafka_slot_retained_wal_bytes",
             "the leader to read its slot's retained WAL", 120),
            (ports["webhook"], "walcast_kafka2webhook_record_age_seconds_count",
             "kafka2webhook to deliver a batch", 180),
            (ports["target"], "walcast_kafka2postgres_record_age_seconds_count",
             "kafka2postgres to commit a batch", 180),
        ]:  # fmt: skip
            wait_until(lambda p=port, m=metric: value(p, m) > 0, what, limit, interval=1)
        # every row inserted (a row inserted and updated in one batch counts once, inserted)
        wait_until(lambda: value(ports["target"], "walcast_kafka2postgres_rows_total",
                                 action="insert") >= 300,
                   "kafka2postgres to insert the 300 rows", 180, interval=1)  # fmt: skip
        wait_until(lambda: value(ports["standby"], "walcast_pg2kafka_role", role="standby") == 1,
                   "the second pg2kafka to stand by", 120)  # fmt: skip
        texts = {name: scraped(port) for name, port in ports.items()}
    finally:
        for p in procs:
            p.stop()
        receiver.stop()
        admin.tear_down(pg)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"DROP TABLE IF EXISTS {table}")
            c.execute(f'DROP DATABASE IF EXISTS "{target_db}" WITH (FORCE)')
        client = AdminClient(pg.kafka.client_config())
        dlqs = (f"{unique_name}.dlq", f"{unique_name}.webhook-dlq", f"{unique_name}.target-dlq")
        gone = [t for t in (topic, *dlqs) if t in client.list_topics(timeout=10).topics]
        for fut in client.delete_topics(gone).values() if gone else []:
            fut.result(30)

    # What the alerts read, as they should be.
    for name, text in texts.items():
        assert sample(text, "walcast_ready") == 1, f"{name} not ready:\n{text[:2000]}"
        assert sample(text, "walcast_healthy") == 1, name
    assert sample(texts["leader"], "walcast_pg2kafka_role", role="leader") == 1
    assert sample(texts["standby"], "walcast_pg2kafka_role", role="leader") == 0
    assert (sample(texts["leader"], "walcast_pg2kafka_inflight_limit_bytes") or 0) >= 2**20
    assert sample(texts["target"], "walcast_kafka2postgres_tables_stopped") == 0
    assert (sample(texts["target"], "walcast_kafka2postgres_write_seconds_count") or 0) > 0

    exported: set[str] = set()
    families: dict[str, str] = {}
    for text in texts.values():
        for family in text_string_to_metric_families(text):
            if not family.name.startswith("walcast_"):
                continue
            families[family.name] = family.type
            exported.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    for where, names in used_metrics().items():
        missing = sorted(names - exported)
        assert not missing, f"{where}: metrics no service exports: {missing}"
        assert len(names) >= 10, where  # the extraction found the expressions

    # One naming convention across the services; families every sink exports alike (the
    # ops endpoint's, verify's: shared/verify/continuous.py) carry no service name, the
    # scrape's job tells them apart.
    for name, kind in families.items():
        services = "pg2kafka|kafka2search|kafka2spark|kafka2webhook|kafka2postgres"
        shared = "ready|ready_check|healthy|verify_[a-z0-9_]+"
        assert re.fullmatch(rf"walcast_(({services})_[a-z0-9_]+|{shared})", name), name
        if kind == "histogram":
            assert name.endswith(UNITS), f"{name}: a histogram names its unit"
