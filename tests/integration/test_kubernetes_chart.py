"""The Helm chart, checked offline (no cluster runs on these machines): ``helm lint`` and
``helm template`` for the default values and every documented overlay, each rendered
object validated strictly against the Kubernetes (and CRD) JSON schemas by kubeconform,
and what the manifests tell the services checked against the services themselves:

* each container's settings (the ConfigMap's file plus its environment) load through the
  service's own settings model (unknown keys and bad values are errors there);
* each command parses with the service's own command line;
* no credential sits in a ConfigMap, every pod runs non-root on a read-only root with no
  capabilities, probes point at /health and /ready;
* the memory guard follows the container limit;
* the alert rules pass ``promtool check rules``.

The tools are pinned and built by deploy/kubernetes/tools.py on first use.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.kafka2postgres.settings import Kafka2PostgresSettings
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2spark.settings import Kafka2SparkSettings
from services.kafka2webhook.settings import Kafka2WebhookSettings
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.secrets import is_secret_key
from shared.settings import ServiceSettings, load_settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "kubernetes" / "walcast"
OVERLAYS = sorted((REPO / "deploy" / "kubernetes" / "overlays").glob("*.yaml"))
RULES = CHART / "files" / "prometheus-rules.yaml"
sys.path.insert(0, str(REPO / "deploy" / "kubernetes"))
tools = importlib.import_module("tools")

SETTINGS: dict[str, type[ServiceSettings]] = {
    "pg2kafka": Pg2KafkaSettings,
    "kafka2search": Kafka2SearchSettings,
    "kafka2spark": Kafka2SparkSettings,
    "kafka2webhook": Kafka2WebhookSettings,
    "kafka2postgres": Kafka2PostgresSettings,
}
PARSERS = {
    "pg2kafka": "services.pg2kafka.__main__",
    "kafka2search": "services.kafka2search.__main__",
    "kafka2spark": "services.kafka2spark.__main__",
    "kafka2webhook": "services.kafka2webhook.__main__",
    "kafka2postgres": "services.kafka2postgres.__main__",
}
# kafka2postgres is off by default; these turn it on with its required target
# (overlays/postgres-target.yaml and production.yaml do too).
KAFKA2POSTGRES = (
    "kafka2postgres.enabled=true",
    "kafka2postgres.config.target.postgres.host=replica-db",
    "kafka2postgres.config.target.postgres.database=app_copy",
)
VARIANTS = [pytest.param(None, id="default")] + [pytest.param(p, id=p.stem) for p in OVERLAYS]


@pytest.fixture(scope="session")
def bins() -> dict[str, Path]:
    try:
        return tools.ensure()
    except tools.ToolError as exc:
        pytest.fail(f"the chart's tools could not be installed: {exc}", pytrace=False)


def helm(bins: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bins["helm"]), *args], capture_output=True, text=True, timeout=120)


def render(bins: dict[str, Path], overlay: Path | None, *sets: str) -> str:
    args = ["template", "wc", str(CHART), "--namespace", "data",
            "--kube-version", tools.KUBE_VERSION]  # fmt: skip
    if overlay is not None:
        args += ["-f", str(overlay)]
    for s in sets:
        args += ["--set", s]
    result = helm(bins, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def kubeconform(text: str) -> dict[str, Any]:
    result = subprocess.run(
        [*tools.kubeconform_args(), "-"], input=text, capture_output=True, text=True, timeout=120
    )
    report: dict[str, Any] = json.loads(result.stdout)
    report["returncode"] = result.returncode
    return report


def executor_templates(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kafka2spark's executor pod templates: Pods inside a ConfigMap, which Spark fills in
    (image, resources, environment) and creates."""
    return [yaml.safe_load(o["data"]["executor.yaml"]) for o in objs
            if o["kind"] == "ConfigMap" and "executor.yaml" in o.get("data", {})]  # fmt: skip


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]
    for i, pod in enumerate(executor_templates(objs)):
        yield f"executor-template/{i}", pod["spec"]


def service_of(container: dict[str, Any]) -> str | None:
    cmd = container.get("command") or []
    return cmd[0] if cmd and cmd[0] in SETTINGS else None


@pytest.mark.parametrize("overlay", VARIANTS)
def test_chart_lints_and_every_object_validates_strictly(
    bins: dict[str, Path], overlay: Path | None
) -> None:
    args = ["lint", str(CHART), "--strict", "--kube-version", tools.KUBE_VERSION]
    if overlay is not None:
        args += ["-f", str(overlay)]
    lint = helm(bins, *args)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = render(bins, overlay)
    report = kubeconform(text)
    summary = report["summary"]
    assert report["returncode"] == 0, report["resources"]
    assert summary["invalid"] == summary["errors"] == summary["skipped"] == 0, report
    assert summary["valid"] == len(objects(text)) > 0
    # the executor pod template, once Spark has given it an image, is a valid Pod
    for pod in executor_templates(objects(text)):
        pod["spec"]["containers"][0]["image"] = "walcast/kafka2spark:test"
        one = kubeconform(yaml.safe_dump(pod))
        assert one["summary"]["valid"] == 1, one


def test_the_validation_refuses_what_a_cluster_would(bins: dict[str, Path]) -> None:
    """The negative control: an unknown field, a wrong type and a CRD typo are caught."""
    objs = objects(render(bins, None))
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    deployment["spec"]["replica"] = 2  # unknown field (strict)
    scaled = next(o for o in objs if o["kind"] == "ScaledObject")
    scaled["spec"]["maxReplicaCount"] = "six"
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoint"] = []
    report = kubeconform(yaml.safe_dump_all([deployment, scaled, monitor]))
    assert report["summary"]["invalid"] == 3, report


@pytest.mark.parametrize("overlay", VARIANTS)
def test_manifests_settings_and_commands_are_the_services_own(
    bins: dict[str, Path], overlay: Path | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = objects(render(bins, overlay))
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    checked = set()
    for where, spec in pod_specs(objs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            if where.startswith("executor-template"):
                scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                assert container["command"] == ["walcast-spark-executor"]
                assert container["command"][0] in scripts["scripts"]
                mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
                assert "emptyDir" in volumes[mounts[container["workingDir"]]], where
                continue
            service = service_of(container)
            assert service is not None, f"{where}: {container.get('command')} is no walcast CLI"
            parser = importlib.import_module(PARSERS[service]).build_parser()
            args = parser.parse_args(container["command"][1:])  # exits (fails) if wrong
            assert args.config == Path("/etc/walcast/config.yaml"), where
            config_volume = volumes["config"]["configMap"]["name"]
            config_text = configmaps[config_volume]["data"]["config.yaml"]
            config_file = tmp_path / f"{where.replace('/', '_')}.yaml"
            config_file.write_text(config_text)
            prefix = f"{service.upper()}_"
            for name in list(os.environ):
                if name.startswith(tuple(f"{s.upper()}_" for s in SETTINGS)):
                    monkeypatch.delenv(name)
            for env in container.get("env") or []:
                assert env["name"].startswith(prefix), f"{where}: {env['name']}"
                value_from = env.get("valueFrom", {})
                if "secretKeyRef" in value_from:
                    value = "secret-from-" + value_from["secretKeyRef"]["key"]
                elif "fieldRef" in value_from:
                    value = "pod-name-0"
                else:
                    value = env["value"]
                monkeypatch.setenv(env["name"], value)
            settings = load_settings(SETTINGS[service], config_file=config_file)
            assert settings.http.host == "0.0.0.0"  # noqa: S104 - the pod's address
            if where.startswith("Deployment"):
                ops = next(p for p in container["ports"] if p["name"] == "ops")
                assert settings.http.port == ops["containerPort"], where
            if service == "kafka2spark" and "spark.kubernetes.container.image" in str(config_text):
                conf = settings.spark.conf  # type: ignore[attr-defined]
                assert conf["spark.kubernetes.driver.pod.name"] == "pod-name-0"
                assert settings.spark.master.startswith("k8s://")  # type: ignore[attr-defined]
            checked.add(service)
    enabled = {s for s in SETTINGS if f"wc-walcast-{s}" in configmaps}
    assert checked == enabled


def _keys(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _keys(v, f"{path}.{k}" if path else str(k))
    else:
        yield path, node


@pytest.mark.parametrize("overlay", VARIANTS)
def test_pods_are_locked_down_and_configmaps_hold_no_secret(
    bins: dict[str, Path], overlay: Path | None
) -> None:
    objs = objects(render(bins, overlay))
    for o in objs:
        if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]:
            for key, value in _keys(yaml.safe_load(o["data"]["config.yaml"])):
                assert not (is_secret_key(key.rsplit(".", 1)[-1]) and value), (
                    f"{o['metadata']['name']}: {key}"
                )
        assert o["kind"] != "Secret" or (overlay is not None and overlay.stem == "minimal")
    pull = (yaml.safe_load(overlay.read_text()) if overlay else {}).get("image", {})
    for where, spec in pod_specs(objs):
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        if pull.get("pullSecrets"):
            assert spec["imagePullSecrets"] == pull["pullSecrets"], where
        for c in spec["containers"]:
            assert c.get("env", []) is not None, f"{where}: env: null"
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            if not where.startswith("executor-template"):  # Spark sizes its executors
                assert "limits" in c["resources"], where
                assert "requests" in c["resources"], where
            if where.startswith("Deployment"):
                assert c["livenessProbe"]["httpGet"]["path"] == "/health", where
                assert c["readinessProbe"]["httpGet"]["path"] == "/ready", where


def test_memory_guard_follows_the_container_limit(bins: dict[str, Path]) -> None:
    def guard(*sets: str) -> int:
        objs = objects(render(bins, None, *sets))
        cm = next(o for o in objs if o["metadata"]["name"] == "wc-walcast-pg2kafka"
                  and o["kind"] == "ConfigMap")  # fmt: skip
        return int(yaml.safe_load(cm["data"]["config.yaml"])["producer"]["max_inflight_bytes"])

    assert guard() == (512 - 192) * 2**20
    assert guard("pg2kafka.resources.limits.memory=2Gi") == (2048 - 192) * 2**20
    # an explicit setting wins
    assert guard("pg2kafka.config.producer.max_inflight_bytes=50000000") == 50_000_000
    small = helm(bins, "template", "wc", str(CHART), "--kube-version", tools.KUBE_VERSION,
                 "--set", "pg2kafka.resources.limits.memory=200Mi")  # fmt: skip
    assert small.returncode != 0
    assert "raise the limit" in small.stderr


@pytest.mark.parametrize(
    "setting",
    [
        "pg2kafka.config.postgres.password=hunter2",
        "pg2kafka.config.kafka.extra.sasl\\.password=hunter2",
        "kafka2spark.config.spark.conf.spark\\.hadoop\\.fs\\.s3a\\.secret\\.key=hunter2",
        "kafka2search.config.engine.urls[0]=https://walcast:hunter2@search:9200",
        ",".join((*KAFKA2POSTGRES, "kafka2postgres.config.target.postgres.password=hunter2")),
    ],
)
def test_a_credential_in_a_configmap_is_refused(bins: dict[str, Path], setting: str) -> None:
    result = helm(bins, "template", "wc", str(CHART), "--kube-version", tools.KUBE_VERSION,
                  "--set", setting)  # fmt: skip
    assert result.returncode != 0
    assert "secretEnv" in result.stderr
    assert "hunter2" not in result.stderr


def test_settings_that_only_mention_secrets_are_not_refused(bins: dict[str, Path]) -> None:
    url_key = "sasl\\.oauthbearer\\.token\\.endpoint\\.url"
    objs = objects(render(bins, None, "pg2kafka.config.ddl.scrub_secrets=false",
                          f"common.config.kafka.extra.{url_key}=https://idp/t"))  # fmt: skip
    cm = next(o for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "wc-walcast-pg2kafka")  # fmt: skip
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["ddl"]["scrub_secrets"] is False
    assert config["kafka"]["extra"]["sasl.oauthbearer.token.endpoint.url"] == "https://idp/t"


def test_keda_needs_an_authentication_for_a_secured_kafka(bins: dict[str, Path]) -> None:
    refused = helm(bins, "template", "wc", str(CHART), "--kube-version", tools.KUBE_VERSION,
                   "--set", "common.config.kafka.security_protocol=SASL_SSL")  # fmt: skip
    assert refused.returncode != 0
    assert "authenticationRef" in refused.stderr
    objs = objects(render(bins, None, "common.config.kafka.security_protocol=SASL_SSL",
                          "kafka2search.autoscaling.authenticationRef=kafka-auth",
                          "kafka2search.config.consumer.topics={a,b}"))  # fmt: skip
    (trigger,) = next(o for o in objs if o["kind"] == "ScaledObject")["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "kafka-auth"}
    assert "topic" not in trigger["metadata"]  # two topics: the group's lag over both


def test_kafka2search_grace_outlasts_a_bulk_write(bins: dict[str, Path]) -> None:
    def grace(*sets: str) -> int:
        objs = objects(render(bins, None, *sets))
        d = next(o for o in objs if o["metadata"]["name"] == "wc-walcast-kafka2search"
                 and o["kind"] == "Deployment")  # fmt: skip
        return int(d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])

    assert grace() == 61 + 30
    assert grace("kafka2search.config.engine.request_timeout_s=120") == 121 + 30


def test_kafka2spark_grace_outlasts_the_batch_in_hand(bins: dict[str, Path]) -> None:
    def grace(*sets: str) -> int:
        objs = objects(render(bins, None, *sets))
        d = next(o for o in objs if o["metadata"]["name"] == "wc-walcast-kafka2spark"
                 and o["kind"] in ("Deployment", "StatefulSet"))  # fmt: skip
        return int(d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])

    assert grace() == 90 + 30
    assert grace("kafka2spark.config.trigger.stop_grace_s=300") == 300 + 30


def test_kafka2postgres_needs_its_target(bins: dict[str, Path]) -> None:
    for missing in ("host", "database"):
        sets = [s for s in KAFKA2POSTGRES if f".{missing}=" not in s]
        args = [a for s in sets for a in ("--set", s)]
        result = helm(bins, "template", "wc", str(CHART), "--kube-version", tools.KUBE_VERSION,
                      *args)  # fmt: skip
        assert result.returncode != 0, missing
        assert f"kafka2postgres.config.target.postgres.{missing} is not set" in result.stderr
    # off by default: nothing rendered for it, and nothing asked of it
    assert not [o for o in objects(render(bins, None)) if "kafka2postgres" in o["metadata"]["name"]]


def test_kafka2postgres_is_scraped_and_reaches_its_target(bins: dict[str, Path]) -> None:
    objs = objects(render(bins, None, *KAFKA2POSTGRES,
                          "kafka2postgres.config.target.postgres.port=6432"))  # fmt: skip
    policy = next(o for o in objs if o["kind"] == "NetworkPolicy"
                  and o["metadata"]["name"] == "wc-walcast-kafka2postgres")  # fmt: skip
    ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert 6432 in ports
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 9191, "protocol": "TCP"}]
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    (components,) = monitor["spec"]["selector"]["matchExpressions"]
    assert "kafka2postgres" in components["values"]
    service = next(o for o in objs if o["kind"] == "Service"
                   and o["metadata"]["name"] == "wc-walcast-kafka2postgres")  # fmt: skip
    assert service["spec"]["ports"] == [{"name": "ops", "port": 9191, "targetPort": "ops"}]
    deployment = next(o for o in objs if o["kind"] == "Deployment"
                      and o["metadata"]["name"] == "wc-walcast-kafka2postgres")  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]} == {
        "KAFKA2POSTGRES_TARGET__POSTGRES__PASSWORD": {
            "name": "walcast", "key": "target-postgres-password"},
    }  # fmt: skip


def test_kafka2postgres_grace_outlasts_its_transactions_in_flight(bins: dict[str, Path]) -> None:
    def grace(*sets: str) -> int:
        objs = objects(render(bins, None, *KAFKA2POSTGRES, *sets))
        d = next(o for o in objs if o["metadata"]["name"] == "wc-walcast-kafka2postgres"
                 and o["kind"] == "Deployment")  # fmt: skip
        return int(d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])

    # batch.concurrency (2) transactions of transactionSeconds (30), batch.max_wait_s
    # (0.25), the margin (30)
    assert grace() == 61 + 30
    assert grace("kafka2postgres.config.batch.concurrency=4") == 121 + 30
    assert grace("kafka2postgres.transactionSeconds=120") == 241 + 30


def test_alert_rules_load_in_promtool(bins: dict[str, Path]) -> None:
    result = subprocess.run(
        [str(bins["promtool"]), "check", "rules", str(RULES)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # and the negative control: a broken expression is refused
    broken = RULES.read_text().replace("walcast_ready == 0", "walcast_ready ==", 1)
    bad = subprocess.run(
        [str(bins["promtool"]), "check", "rules"], input=broken,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0
