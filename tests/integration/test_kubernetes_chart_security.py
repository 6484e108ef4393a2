"""The chart's security defaults (issue 36, finding 8), checked offline on the rendered
manifests like the rest of the chart (tests/integration/test_kubernetes_chart.py):

* pg2kafka verifies PostgreSQL's certificate by default (``sslmode=verify-full`` against a
  CA the chart mounts); a mode that does not verify renders only when acknowledged, and
  the install notes then warn; kafka2postgres the same for its target database;
* Kafka without TLS is warned about in the install notes unless acknowledged; a Kafka CA
  in values reaches every pod that talks to Kafka (kafka2spark's executors too);
* whoever controls kafka2spark's driver (the only pod with a service-account token) cannot
  reach another service's Secret: the namespace where its Role may create pods holds no
  Secret any other walcast pod reads, and no Role in the release namespace creates pods.

The install notes (NOTES.txt) are not printed by ``helm template`` and ``helm install
--dry-run`` needs a cluster, so they are rendered here through ``tpl`` in a copy of the
chart: the same template text, the same values.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.kafka2postgres.settings import Kafka2PostgresSettings
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.settings import load_settings
from tests.integration import test_kubernetes_chart as chart

RELEASE_NS = "data"  # chart.render's --namespace
SERVICES = ("pg2kafka", "kafka2search", "kafka2spark", "kafka2webhook", "kafka2postgres")
WEAK_SSLMODES = ("disable", "allow", "prefer", "require")
PG_CA = "/etc/walcast-tls/postgres/postgres-ca.crt"
TARGET_CA = "/etc/walcast-tls/target-postgres/target-postgres-ca.crt"


@pytest.fixture(scope="session")
def bins() -> dict[str, Path]:
    try:
        return chart.tools.ensure()
    except chart.tools.ToolError as exc:
        pytest.fail(f"the chart's tools could not be installed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def notes_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart whose extra ConfigMap holds NOTES.txt rendered by ``tpl``."""
    copy = tmp_path_factory.mktemp("chart") / "walcast"
    shutil.copytree(chart.CHART, copy)
    source = copy / "templates" / "NOTES.txt"
    (copy / "notes.txt").write_text(source.read_text() if source.exists() else "")
    (copy / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rendered-notes}\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n'
    )
    return copy


def notes(bins: dict[str, Path], copy: Path, overlay: Path | None, *sets: str) -> str:
    args = [
        "template",
        "wc",
        str(copy),
        "--namespace",
        RELEASE_NS,
        "--kube-version",
        chart.tools.KUBE_VERSION,
        "--show-only",
        "templates/zz-notes.yaml",
    ]
    if overlay is not None:
        args += ["-f", str(overlay)]
    for s in sets:
        args += ["--set", s]
    result = chart.helm(bins, *args)
    assert result.returncode == 0, result.stderr
    text: str = yaml.safe_load(result.stdout)["data"]["notes"]
    return text


def refused(bins: dict[str, Path], *sets: str) -> str:
    """helm template's error for these values (it must fail)."""
    args = [
        "template",
        "wc",
        str(chart.CHART),
        "--namespace",
        RELEASE_NS,
        "--kube-version",
        chart.tools.KUBE_VERSION,
    ]
    for s in sets:
        args += ["--set", s]
    result = chart.helm(bins, *args)
    assert result.returncode != 0, f"rendered: {sets}"
    return result.stderr


def ns_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("namespace") or RELEASE_NS)


def config_of(objs: list[dict[str, Any]], cm_name: str) -> dict[str, Any]:
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == cm_name)
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def pods_of(objs: list[dict[str, Any]], service: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for where, spec in chart.pod_specs(objs):
        if spec["containers"][0].get("command", [""])[0] == service:
            yield where, spec


def pg2kafka_pods(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    return pods_of(objs, "pg2kafka")


def mounted_file(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume source a file path in the pod's first container comes from, with the
    item key it is read from (``{"secret"|"configMap": name, "key": key}``)."""
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        prefix = m["mountPath"].rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        volume = volumes[m["name"]]
        assert m.get("readOnly") is True, f"{m['name']} is writable"
        relative = path[len(prefix) :]
        for kind, name_key in (("secret", "secretName"), ("configMap", "name")):
            if kind in volume:
                (item,) = (i for i in volume[kind]["items"] if i["path"] == relative)
                return {kind: volume[kind][name_key], "key": item["key"]}
    raise AssertionError(f"nothing is mounted at {path}")


# -- PostgreSQL: verified by default ------------------------------------------------------


def test_postgres_defaults_to_verify_full_against_a_mounted_ca(
    bins: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = chart.objects(chart.render(bins, None))
    config = config_of(objs, "wc-walcast-pg2kafka")
    assert config["postgres"]["sslmode"] == "verify-full"
    assert config["postgres"]["sslrootcert"] == PG_CA
    # the settings model takes it and hands it to libpq
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    for name in [n for n in os.environ if n.startswith("PG2KAFKA_")]:
        monkeypatch.delenv(name)
    conninfo = load_settings(Pg2KafkaSettings, config_file=file).postgres.conninfo()
    assert "sslmode='verify-full'" in conninfo
    assert f"sslrootcert='{PG_CA}'" in conninfo
    # the CA file is there in the streaming pods and in the init Job
    pods = dict(pg2kafka_pods(objs))
    assert {w.split("/")[0] for w in pods} == {"Deployment", "Job"}
    for where, spec in pods.items():
        # default: the credentials Secret's key postgres-ca.crt
        assert mounted_file(spec, PG_CA) == {"secret": "walcast", "key": "postgres-ca.crt"}, where


def test_a_postgres_ca_from_a_configmap_is_mounted_and_verified_against(
    bins: dict[str, Path],
) -> None:
    objs = chart.objects(
        chart.render(
            bins,
            None,
            "pg2kafka.postgresTLS.ca.configMapName=db-ca",
            "pg2kafka.postgresTLS.ca.key=ca.crt",
        )
    )
    config = config_of(objs, "wc-walcast-pg2kafka")
    assert config["postgres"]["sslmode"] == "verify-full"
    path = config["postgres"]["sslrootcert"]
    assert path == "/etc/walcast-tls/postgres/ca.crt"
    for where, spec in pg2kafka_pods(objs):
        assert mounted_file(spec, path) == {"configMap": "db-ca", "key": "ca.crt"}, where
    report = chart.kubeconform(yaml.safe_dump_all(objs))
    assert report["returncode"] == 0, report["resources"]
    # an operator's own root certificate setting is kept, and nothing is mounted for it
    objs = chart.objects(chart.render(bins, None, "pg2kafka.config.postgres.sslrootcert=system"))
    assert config_of(objs, "wc-walcast-pg2kafka")["postgres"]["sslrootcert"] == "system"
    for _, spec in pg2kafka_pods(objs):
        assert "postgres-ca" not in {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize("mode", WEAK_SSLMODES)
def test_an_unverified_postgres_connection_needs_an_acknowledgement_and_is_warned_about(
    bins: dict[str, Path], notes_chart: Path, mode: str
) -> None:
    error = refused(bins, f"pg2kafka.config.postgres.sslmode={mode}")
    assert "pg2kafka.postgresTLS.insecure" in error
    assert "pg2kafka.postgresTLS.ca" in error
    acknowledged = (
        f"pg2kafka.config.postgres.sslmode={mode}",
        "pg2kafka.postgresTLS.insecure=true",
    )
    objs = chart.objects(chart.render(bins, None, *acknowledged))
    assert config_of(objs, "wc-walcast-pg2kafka")["postgres"]["sslmode"] == mode
    text = notes(bins, notes_chart, None, *acknowledged)
    assert f"WARNING: pg2kafka connects to PostgreSQL with sslmode={mode}" in text
    assert "NOT verified" in text


@pytest.mark.parametrize("overlay", chart.VARIANTS)
def test_no_variant_connects_to_postgres_unverified_without_saying_so(
    bins: dict[str, Path], notes_chart: Path, overlay: Path | None
) -> None:
    values = yaml.safe_load(overlay.read_text()) if overlay else {}
    objs = chart.objects(chart.render(bins, overlay))
    if not any(o["metadata"]["name"] == "wc-walcast-pg2kafka" for o in objs):
        return
    pg = config_of(objs, "wc-walcast-pg2kafka")["postgres"]
    text = notes(bins, notes_chart, overlay)
    if pg["sslmode"] in WEAK_SSLMODES:
        acknowledged = values.get("pg2kafka", {}).get("postgresTLS", {}).get("insecure")
        assert acknowledged is True, f"sslmode={pg['sslmode']} without postgresTLS.insecure"
        assert f"WARNING: pg2kafka connects to PostgreSQL with sslmode={pg['sslmode']}" in text
    else:
        assert pg["sslmode"] == "verify-full"
        for _, spec in pg2kafka_pods(objs):
            mounted_file(spec, pg["sslrootcert"])  # raises if absent
        assert "WARNING: pg2kafka connects" not in text


# -- kafka2postgres's target PostgreSQL: verified by default, as pg2kafka's source --------


def test_the_target_postgres_defaults_to_verify_full_against_a_mounted_ca(
    bins: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = chart.objects(chart.render(bins, None, *chart.KAFKA2POSTGRES))
    config = config_of(objs, "wc-walcast-kafka2postgres")
    assert config["target"]["postgres"]["sslmode"] == "verify-full"
    assert config["target"]["postgres"]["sslrootcert"] == TARGET_CA
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    for name in [n for n in os.environ if n.startswith("KAFKA2POSTGRES_")]:
        monkeypatch.delenv(name)
    settings = load_settings(Kafka2PostgresSettings, config_file=file)
    conninfo = settings.target.postgres.conninfo()
    assert "sslmode='verify-full'" in conninfo
    assert f"sslrootcert='{TARGET_CA}'" in conninfo
    (deployment,) = (spec for _, spec in pods_of(objs, "kafka2postgres"))
    default = {"secret": "walcast", "key": "target-postgres-ca.crt"}
    assert mounted_file(deployment, TARGET_CA) == default
    # a ConfigMap's CA, and the pods of pg2kafka keep their own
    objs = chart.objects(chart.render(bins, None, *chart.KAFKA2POSTGRES,
                                      "kafka2postgres.targetTLS.ca.configMapName=target-ca",
                                      "kafka2postgres.targetTLS.ca.key=ca.crt"))  # fmt: skip
    path = config_of(objs, "wc-walcast-kafka2postgres")["target"]["postgres"]["sslrootcert"]
    assert path == "/etc/walcast-tls/target-postgres/ca.crt"
    (deployment,) = (spec for _, spec in pods_of(objs, "kafka2postgres"))
    assert mounted_file(deployment, path) == {"configMap": "target-ca", "key": "ca.crt"}
    assert "postgres-ca" not in {v["name"] for v in deployment["volumes"]}
    for where, spec in pg2kafka_pods(objs):
        assert "target-postgres-ca" not in {v["name"] for v in spec["volumes"]}, where
    report = chart.kubeconform(yaml.safe_dump_all(objs))
    assert report["returncode"] == 0, report["resources"]


@pytest.mark.parametrize("mode", WEAK_SSLMODES)
def test_an_unverified_target_connection_needs_an_acknowledgement_and_is_warned_about(
    bins: dict[str, Path], notes_chart: Path, mode: str
) -> None:
    weak = (*chart.KAFKA2POSTGRES, f"kafka2postgres.config.target.postgres.sslmode={mode}")
    error = refused(bins, *weak)
    assert "kafka2postgres.targetTLS.insecure" in error
    assert "kafka2postgres.targetTLS.ca" in error
    acknowledged = (*weak, "kafka2postgres.targetTLS.insecure=true")
    objs = chart.objects(chart.render(bins, None, *acknowledged))
    target = config_of(objs, "wc-walcast-kafka2postgres")["target"]["postgres"]
    assert target["sslmode"] == mode
    assert "sslrootcert" not in target
    text = notes(bins, notes_chart, None, *acknowledged)
    assert f"WARNING: kafka2postgres connects to the target PostgreSQL with sslmode={mode}" in text
    assert "NOT verified" in text


@pytest.mark.parametrize("overlay", chart.VARIANTS)
def test_no_variant_connects_to_the_target_unverified_without_saying_so(
    bins: dict[str, Path], notes_chart: Path, overlay: Path | None
) -> None:
    values = yaml.safe_load(overlay.read_text()) if overlay else {}
    objs = chart.objects(chart.render(bins, overlay))
    if not any(o["metadata"]["name"] == "wc-walcast-kafka2postgres" for o in objs):
        return
    pg = config_of(objs, "wc-walcast-kafka2postgres")["target"]["postgres"]
    text = notes(bins, notes_chart, overlay)
    if pg["sslmode"] in WEAK_SSLMODES:
        acknowledged = values.get("kafka2postgres", {}).get("targetTLS", {}).get("insecure")
        assert acknowledged is True, f"sslmode={pg['sslmode']} without targetTLS.insecure"
        assert "WARNING: kafka2postgres connects to the target PostgreSQL" in text
    else:
        assert pg["sslmode"] == "verify-full"
        for _, spec in pods_of(objs, "kafka2postgres"):
            mounted_file(spec, pg["sslrootcert"])  # raises if absent
        assert f"Target PostgreSQL (kafka2postgres): sslmode={pg['sslmode']}" in text
        assert "WARNING: kafka2postgres connects" not in text


# -- Kafka: TLS, or a warning --------------------------------------------------------------


def test_plaintext_kafka_is_warned_about_unless_acknowledged(
    bins: dict[str, Path], notes_chart: Path
) -> None:
    text = notes(bins, notes_chart, None)
    (warning,) = [line for line in text.splitlines() if "Kafka without TLS" in line]
    assert warning.startswith("WARNING: ")
    for svc in ("pg2kafka", "kafka2search", "kafka2spark"):
        assert f"{svc} (PLAINTEXT to kafka:9092)" in warning
    with_target = notes(bins, notes_chart, None, *chart.KAFKA2POSTGRES)
    assert "kafka2postgres (PLAINTEXT to kafka:9092)" in with_target
    sasl = notes(
        bins,
        notes_chart,
        None,
        "common.config.kafka.security_protocol=SASL_PLAINTEXT",
        "kafka2search.autoscaling.mode=hpa",
    )
    assert "SASL_PLAINTEXT to kafka:9092" in sasl
    assert "Kafka without TLS" not in notes(
        bins, notes_chart, None, "common.kafkaTLS.allowPlaintext=true"
    )


def test_a_kafka_ca_reaches_every_pod_that_talks_to_kafka(
    bins: dict[str, Path], notes_chart: Path
) -> None:
    production = next(p for p in chart.OVERLAYS if p.stem == "production")
    objs = chart.objects(chart.render(bins, production))
    assert "Kafka without TLS" not in notes(bins, notes_chart, production)
    configs = {
        o["metadata"]["name"]: yaml.safe_load(o["data"]["config.yaml"])
        for o in objs
        if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]
    }
    pods = list(chart.pod_specs(objs))
    assert {w for w, _ in pods if w.startswith("executor-template")}, "no executors"
    for where, spec in pods:
        if where.startswith("executor-template"):  # Spark's Kafka source reads it there
            cm = next(
                o for o in objs if o["kind"] == "ConfigMap" and "executor.yaml" in o.get("data", {})
            )
            kafka = yaml.safe_load(cm["data"]["config.yaml"])["kafka"]
        else:
            volume = next(v for v in spec["volumes"] if v["name"] == "config")
            kafka = configs[volume["configMap"]["name"]]["kafka"]
        assert kafka["security_protocol"] == "SASL_SSL", where
        assert kafka["ssl_ca_location"] == "/etc/walcast-tls/kafka/ca.crt", where
        assert mounted_file(spec, kafka["ssl_ca_location"]) == {
            "configMap": "kafka-ca",
            "key": "ca.crt",
        }, where


# -- kafka2spark: the driver reaches no other service's Secret -----------------------------

POD_MAKERS = {
    "pods",
    "deployments",
    "replicasets",
    "statefulsets",
    "daemonsets",
    "jobs",
    "cronjobs",
    "replicationcontrollers",
    "*",
}


def reads_every_secret(rule: dict[str, Any]) -> bool:
    """A Role rule whose holder can read every Secret of its namespace: reading Secrets, or
    creating or changing anything that runs a pod (a pod can mount any Secret there)."""
    verbs, resources = set(rule.get("verbs", [])), set(rule.get("resources", []))
    if resources & {"secrets", "*"} and verbs & {"get", "list", "watch", "*"}:
        return True
    return bool(resources & POD_MAKERS and verbs & {"create", "update", "patch", "*"})


def secret_refs(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """(Secret name, key) pairs a pod spec reads (key "*" for a whole Secret)."""
    refs = set()
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for env in c.get("env") or []:
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
        for src in c.get("envFrom") or []:
            if "secretRef" in src:
                refs.add((src["secretRef"]["name"], "*"))
    for v in spec.get("volumes", []):
        if "secret" in v:
            items = v["secret"].get("items") or [{"key": "*"}]
            refs.update((v["secret"]["secretName"], i["key"]) for i in items)
    return refs


def component(obj_labels: dict[str, Any]) -> str:
    name = str(obj_labels.get("app.kubernetes.io/component", ""))
    return "kafka2spark" if name == "kafka2spark-executor" else name.removesuffix("-init")


SECURED = (
    "common.config.kafka.security_protocol=SASL_SSL",
    "kafka2search.autoscaling.mode=hpa",
    "kafka2spark.secretEnv.KAFKA__SASL_PASSWORD=kafka-password",
    "kafka2search.secretEnv.KAFKA__SASL_PASSWORD=kafka-password",
    "pg2kafka.secretEnv.KAFKA__SASL_PASSWORD=kafka-password",
    "pg2kafka.secretEnv.TRANSFORMS__HASH_KEY=transforms-hash-key",
)


@pytest.mark.parametrize(
    ("overlay", "sets"),
    [pytest.param(None, (), id="default"), pytest.param(None, SECURED, id="sasl-and-hash-key")]
    + [pytest.param(p, (), id=p.stem) for p in chart.OVERLAYS],
)
def test_whoever_controls_the_spark_driver_reaches_no_other_services_secret(
    bins: dict[str, Path], overlay: Path | None, sets: tuple[str, ...]
) -> None:
    objs = chart.objects(chart.render(bins, overlay, *sets))
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    # which service reads which Secret key, per namespace
    readers: dict[str, dict[tuple[str, str], set[str]]] = defaultdict(lambda: defaultdict(set))
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            svc = component(o["spec"]["template"]["metadata"]["labels"])
            for ref in secret_refs(o["spec"]["template"]["spec"]):
                readers[ns_of(o)][ref].add(svc)
    # the executor pod templates Spark uses: with a k8s:// master (local mode makes none)
    templates = [
        o
        for o in objs
        if o["kind"] == "ConfigMap"
        and "executor.yaml" in o["data"]
        and yaml.safe_load(o["data"]["config.yaml"])["spark"]["master"].startswith("k8s://")
    ]
    for cm in templates:  # executors run where the driver's spark.kubernetes.namespace says
        conf = yaml.safe_load(cm["data"]["config.yaml"])["spark"]["conf"]
        executor_ns = conf["spark.kubernetes.namespace"]
        assert executor_ns != RELEASE_NS
        assert executor_ns == ns_of(cm)
        for ref in secret_refs(yaml.safe_load(cm["data"]["executor.yaml"])["spec"]):
            readers[executor_ns][ref].add("kafka2spark")
    # the service accounts whose Role lets them read every Secret of a namespace
    roles = {(ns_of(o), o["metadata"]["name"]): o for o in objs if o["kind"] == "Role"}
    powerful = 0
    for binding in (o for o in objs if o["kind"] == "RoleBinding"):
        role = roles[(ns_of(binding), binding["roleRef"]["name"])]
        if not any(reads_every_secret(r) for r in role["rules"]):
            continue
        powerful += 1
        namespace = ns_of(binding)
        role_name = role["metadata"]["name"]
        assert namespace != RELEASE_NS, f"{role_name} can create pods beside the other services"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            holders = {
                component(o["spec"]["template"]["metadata"]["labels"])
                for o in objs
                if o["kind"] == "Deployment"
                and ns_of(o) == namespace
                and o["spec"]["template"]["spec"].get("serviceAccountName") == subject["name"]
            }
            assert holders == {"kafka2spark"}, holders
        # every Secret key read in that namespace is kafka2spark's own
        for ref, services in readers[namespace].items():
            assert services == {"kafka2spark"}, f"{namespace}: {ref} read by {services}"
        # and the pods the driver creates there stay unprivileged (Pod Security)
        namespaces = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Namespace"}
        labels = namespaces[namespace]["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert powerful == len(templates)  # one driver Role per k8s:// master, none otherwise
    # no other pod mounts a service-account token
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            spec = o["spec"]["template"]["spec"]
            svc = component(o["spec"]["template"]["metadata"]["labels"])
            token = svc == "kafka2spark" and bool(templates)
            assert spec["automountServiceAccountToken"] is token, o["metadata"]["name"]
    for cm in templates:
        executor = yaml.safe_load(cm["data"]["executor.yaml"])["spec"]
        assert executor["automountServiceAccountToken"] is False


def test_a_dev_secret_in_the_spark_namespace_holds_only_kafka2sparks_keys(
    bins: dict[str, Path],
) -> None:
    objs = chart.objects(
        chart.render(
            bins,
            None,
            *SECURED,
            "secrets.create=true",
            "secrets.data.postgres-password=pw",
            "secrets.data.kafka-password=kp",
            "secrets.data.transforms-hash-key=hk",
            "secrets.data.search-password=sp",
        )
    )
    secrets = {ns_of(o): o for o in objs if o["kind"] == "Secret"}
    assert set(secrets) == {RELEASE_NS, "data-spark"}
    assert secrets["data-spark"]["stringData"] == {"kafka-password": "kp"}
    report = chart.kubeconform(yaml.safe_dump_all(objs))
    assert report["returncode"] == 0, report["resources"]


def test_kafka2spark_shares_the_release_namespace_only_when_alone(bins: dict[str, Path]) -> None:
    error = refused(bins, f"kafka2spark.namespace.name={RELEASE_NS}")
    assert "namespace of its own" in error
    alone = chart.objects(
        chart.render(
            bins,
            None,
            f"kafka2spark.namespace.name={RELEASE_NS}",
            "pg2kafka.enabled=false",
            "kafka2search.enabled=false",
        )
    )
    assert {ns_of(o) for o in alone} == {RELEASE_NS}
    # kafka2postgres's target password lives in the release namespace too
    error = refused(bins, f"kafka2spark.namespace.name={RELEASE_NS}", "pg2kafka.enabled=false",
                    "kafka2search.enabled=false", *chart.KAFKA2POSTGRES)  # fmt: skip
    assert "where kafka2postgres runs" in error
    assert not [o for o in alone if o["kind"] == "Namespace"]
    # an existing namespace: not created, still used
    existing = chart.objects(
        chart.render(
            bins, None, "kafka2spark.namespace.name=spark", "kafka2spark.namespace.create=false"
        )
    )
    assert not [o for o in existing if o["kind"] == "Namespace"]
    assert {ns_of(o) for o in existing if o["kind"] == "Role"} == {"spark"}
    monitor = next(o for o in existing if o["kind"] == "ServiceMonitor")
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [RELEASE_NS, "spark"]
