"""The dashboard's and the alert rules' label names against the metrics' own.

tests/e2e/test_observability.py checks that every metric they use is exported by the
running services; a label can only be checked on a sample, and a labelled metric without
samples (dead letters in a clean run) shows none. Here the label names come from the
metric definitions themselves, so a renamed label (``kind`` → ``reason``) fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from services.kafka2postgres.metrics import Metrics as PostgresMetrics
from services.kafka2search.metrics import Metrics as SearchMetrics
from services.kafka2spark.app import Metrics as SparkMetrics
from services.kafka2webhook.delivery import DeliveryMetrics
from services.pg2kafka.app import build as build_pg2kafka
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.consumer import ConsumerMetrics
from shared.http import OpsServer
from shared.verify.continuous import VerifyMetrics

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "deploy" / "kubernetes" / "walcast" / "files"
# Labels Prometheus adds to every series it scrapes (ServiceMonitor targets).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}


def defined_labels() -> dict[str, set[str]]:
    """Every walcast metric's sample names with the label names it carries."""
    labels: dict[str, set[str]] = {}

    def add(registry: CollectorRegistry) -> None:
        for family in registry.collect():
            names: set[str] = set()
            for s in family.samples:
                names |= set(s.labels)
            labelnames = set()
            for collector in list(registry._collector_to_names):
                if family.name in registry._collector_to_names[collector]:
                    labelnames = set(getattr(collector, "_labelnames", ()))
            for suffix in ("", "_total", "_bucket", "_sum", "_count", "_created"):
                labels.setdefault(family.name + suffix, set()).update(names | labelnames)
            labels[family.name + "_bucket"].add("le")

    pg = build_pg2kafka(Pg2KafkaSettings(http={"enabled": False}))  # connects to nothing
    add(pg.runner.registry)  # type: ignore[attr-defined]
    search, spark, webhook = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    target = CollectorRegistry()
    SearchMetrics(search)
    VerifyMetrics(search)
    VerifyMetrics(spark)
    ConsumerMetrics(search, "walcast_kafka2search")
    SparkMetrics(spark)
    ConsumerMetrics(webhook, "walcast_kafka2webhook", member_label="webhook")
    DeliveryMetrics(webhook)
    PostgresMetrics(target)
    ConsumerMetrics(target, "walcast_kafka2postgres")
    add(search)
    add(spark)
    add(webhook)
    add(target)
    ops = CollectorRegistry()
    server = OpsServer(ops, port=0)  # bound, never served
    try:
        server.add_ready_check("x", lambda: (True, ""))
        add(ops)
    finally:
        server._server.server_close()
    return labels


def expressions() -> list[tuple[str, str, str]]:
    """(where, PromQL, legend or annotation text) of every dashboard target and rule."""
    out = []
    dashboard = json.loads((FILES / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            out.append((f"panel {panel['title']!r}", t["expr"], t.get("legendFormat", "")))
    rules = yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            text = json.dumps(rule.get("annotations", {}))
            out.append((f"alert {rule['alert']}", rule["expr"], text))
    return out


def test_every_label_used_is_one_the_metrics_carry() -> None:
    labels = defined_labels()
    assert "reason" in labels["walcast_kafka2search_dead_letters_total"]
    problems: list[str] = []
    for where, expr, text in expressions():
        metrics = set(re.findall(r"\bwalcast_[a-z0-9_]+", expr))
        unknown = sorted(m for m in metrics if m not in labels)
        if unknown:
            problems.append(f"{where}: unknown metrics {unknown}")
            continue
        available = set().union(*(labels[m] for m in metrics)) | TARGET_LABELS
        used: set[str] = set()
        for selector in re.findall(r"\{([^{}]*)\}", expr):
            used |= set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", selector))
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            used |= {x.strip() for x in clause.split(",") if x.strip()}
        used |= set(re.findall(r"\{\{\s*\$labels\.([a-z_]+)", text))  # rule annotations
        used |= set(re.findall(r"\{\{([a-z_]+)\}\}", text))  # Grafana legends
        missing = sorted(used - available)
        if missing:
            problems.append(f"{where}: labels {missing} not on {sorted(metrics)}")
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_wrong_label() -> None:
    labels = defined_labels()
    available = labels["walcast_kafka2search_dead_letters_total"] | TARGET_LABELS
    assert "kind" not in available
