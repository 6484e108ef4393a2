"""docker-compose.yml is well-formed and agrees with the services' CLIs.

No Docker engine runs here; when the compose plugin is present `docker compose config`
validates the file, otherwise these structural checks stand in for it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shared.settings import ServiceSettings, load_settings

REPO = Path(__file__).resolve().parents[2]
INFRA = {"postgres", "kafka", "opensearch", "elasticsearch"}


@pytest.fixture(scope="module")
def compose() -> dict[str, dict[str, object]]:
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def _compose_plugin() -> bool:
    if not shutil.which("docker"):
        return False
    proc = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return proc.returncode == 0


def test_docker_compose_config_when_available() -> None:
    if _compose_plugin():
        proc = subprocess.run(
            ["docker", "compose", "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    else:
        # Structural fallback: the top level has only what compose understands.
        doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
        assert set(doc) <= {"name", "services", "volumes", "networks", "configs", "secrets"}


def test_infrastructure_services(compose: dict[str, dict[str, object]]) -> None:
    services = compose["services"]
    assert isinstance(services, dict)
    assert set(services) >= INFRA
    for name in INFRA:
        svc = services[name]
        assert "image" in svc, name
        assert "healthcheck" in svc, f"{name} needs a healthcheck for depends_on conditions"
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    assert "wal_level=logical" in services["postgres"]["command"]
    kafka_env = services["kafka"]["environment"]
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["elasticsearch"]["profiles"] == ["elasticsearch"]
    for volume in ("pgdata", "kafkadata"):
        assert volume in compose["volumes"]


def test_walcast_services_match_their_clis(compose: dict[str, dict[str, object]]) -> None:
    """Every console script is a compose service whose command is a real subcommand."""
    scripts = _scripts()
    services = compose["services"]
    assert isinstance(services, dict)
    app_services = {n: s for n, s in services.items() if n not in INFRA}
    # One long-running compose service per console script (helpers such as
    # pg2kafka-init run the same image with another subcommand).
    long_running = {n for n in app_services if n in scripts}
    assert long_running == set(scripts), "compose services and console scripts differ"
    for name, svc in app_services.items():
        command = svc["command"]
        assert isinstance(command, list)
        script = command[0]
        assert script in scripts, f"{name} runs {script}, which is not a console script"
        assert name.startswith(script)
        assert (REPO / "services" / script / "Dockerfile").is_file()
        assert svc["build"]["dockerfile"] == f"services/{script}/Dockerfile"
        for dep in svc.get("depends_on", {}).values():
            assert dep["condition"] in ("service_healthy", "service_completed_successfully")
        if name in scripts:
            assert "healthcheck" in svc, f"{name} needs a healthcheck"
        module, _, func = scripts[script].partition(":")
        parser = __import__(module, fromlist=[func]).build_parser()
        parser.parse_args(command[1:])  # raises SystemExit on an unknown subcommand


def test_dockerfiles_are_slim_and_non_root() -> None:
    for dockerfile in (REPO / "services").glob("*/Dockerfile"):
        text = dockerfile.read_text()
        service = dockerfile.parent.name
        assert "-slim" in text, dockerfile
        assert "\nUSER " in text, f"{dockerfile} must not run as root"
        assert f'".[{service}]"' in text, f"{dockerfile} must install only its extra"
        assert "pyspark" not in text or service == "kafka2spark"


# Console scripts that are not services: the command of kafka2spark's executor pods on
# Kubernetes (services/kafka2spark/executor.py), in the kafka2spark image.
HELPER_SCRIPTS = {"walcast-spark-executor"}


def _scripts() -> dict[str, str]:
    """The services' console scripts."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("scripts", {})
    assert isinstance(scripts, dict)
    assert set(scripts) >= HELPER_SCRIPTS
    return {k: v for k, v in scripts.items() if k not in HELPER_SCRIPTS}


def _app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n not in INFRA}


def _settings_class(script: str) -> type[ServiceSettings]:
    module = importlib.import_module(f"services.{script}.settings")
    (cls,) = [
        c
        for c in vars(module).values()
        if isinstance(c, type)
        and issubclass(c, ServiceSettings)
        and c.__module__ == module.__name__
    ]
    return cls


def _compose_settings(
    svc: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[type[ServiceSettings], Any]:
    """The service's settings as its container sees them: only the compose environment."""
    cls = _settings_class(svc["command"][0])
    prefix = str(cls.model_config["env_prefix"])
    env = svc.get("environment", {})
    assert isinstance(env, dict), "environment as a mapping, like the other services"
    with monkeypatch.context() as m:
        for key in list(os.environ):
            if key.upper().startswith(prefix):
                m.delenv(key)
        for key, value in env.items():
            assert key.startswith(prefix), f"{key} is not a {prefix} setting"
            assert isinstance(value, str), f"{key}: quote the value, the environment is text"
            m.setenv(key, value)
        return cls, load_settings(cls)  # unknown keys and invalid values raise ConfigError


def _endpoints(settings: Any) -> list[str]:
    """The hosts a service's settings point at (what it reads and writes)."""
    hosts = [s.rsplit(":", 1)[0] for s in settings.kafka.bootstrap_servers.split(",")]
    if hasattr(settings, "postgres"):
        hosts.append(settings.postgres.host)
    if hasattr(settings, "engine"):
        hosts.extend(str(urlsplit(u).hostname) for u in settings.engine.urls)
    return hosts


def test_walcast_services_are_configured_for_the_compose_network(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = _scripts()
    for name, svc in _app_services(compose).items():
        _cls, settings = _compose_settings(svc, monkeypatch)
        for host in _endpoints(settings):
            assert host in compose["services"], f"{name} points at {host}, not a compose service"
            assert host in svc["depends_on"], f"{name} must wait for {host}"
            assert svc["depends_on"][host]["condition"] == "service_healthy"
        if name not in scripts:
            assert "ports" not in svc, f"helper {name} publishes no ports"
            continue
        # The ops endpoint listens beyond the container's loopback, is published on the
        # host's loopback only, and the healthcheck asks the port the service listens on.
        port = settings.http.port
        assert settings.http.enabled
        assert settings.http.host == "0.0.0.0"  # noqa: S104
        assert svc["ports"] == [f"127.0.0.1:{port}:{port}"], f"{name}: loopback only"
        probe = " ".join(svc["healthcheck"]["test"])
        assert re.search(rf"http://127\.0\.0\.1:{port}/(health|ready)\b", probe), probe
        assert svc["restart"] == "unless-stopped"


def test_kafka2search_consumes_what_pg2kafka_produces(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    _, pg2kafka = _compose_settings(services["pg2kafka"], monkeypatch)
    _, kafka2search = _compose_settings(services["kafka2search"], monkeypatch)
    assert pg2kafka.producer.topic in kafka2search.consumer.topics
    assert pg2kafka.kafka.bootstrap_servers == kafka2search.kafka.bootstrap_servers
    # pg2kafka-init creates the CDC topic; subscribing before it exists is an error.
    assert pg2kafka.producer.create_topic
    deps = services["kafka2search"]["depends_on"]
    assert deps["pg2kafka-init"]["condition"] == "service_completed_successfully"
    assert kafka2search.engine.kind == "opensearch"
    assert "profiles" not in services["kafka2search"]


def test_dockerfiles_agree_with_the_settings() -> None:
    """Each image exposes its service's default ops port, probes /health there and runs
    ``<service> run`` with the console script."""
    scripts = _scripts()
    dockerfiles = sorted((REPO / "services").glob("*/Dockerfile"))
    assert {d.parent.name for d in dockerfiles} == set(scripts)
    for dockerfile in dockerfiles:
        service = dockerfile.parent.name
        text = dockerfile.read_text()
        port = _settings_class(service)().http.port
        assert re.search(rf"^EXPOSE {port}$", text, re.M), f"{dockerfile}: EXPOSE {port}"
        (healthcheck,) = re.findall(r"^HEALTHCHECK .*$", text, re.M)
        assert f"http://127.0.0.1:{port}/health" in healthcheck, dockerfile
        assert re.search(r"^ENTRYPOINT \[\]$", text, re.M), dockerfile
        (cmd,) = re.findall(r"^CMD (.*)$", text, re.M)
        assert json.loads(cmd) == [service, "run"], dockerfile
        assert f"COPY services/{service}/ services/{service}/" in text
        other = [s for s in scripts if s != service]
        assert not [s for s in other if f"services/{s}/" in text], f"{dockerfile} copies others"


def test_kafka2spark_mirrors_what_pg2kafka_produces_into_a_volume(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    _, pg2kafka = _compose_settings(services["pg2kafka"], monkeypatch)
    _, kafka2spark = _compose_settings(services["kafka2spark"], monkeypatch)
    assert pg2kafka.producer.topic in kafka2spark.source.topics
    assert pg2kafka.kafka.bootstrap_servers == kafka2spark.kafka.bootstrap_servers
    deps = services["kafka2spark"]["depends_on"]
    assert deps["pg2kafka-init"]["condition"] == "service_completed_successfully"
    # The tables and the checkpoint (the job's offsets) outlive the container.
    volume = next(v for v in services["kafka2spark"]["volumes"] if v.endswith(":/data/delta"))
    assert volume.split(":")[0] in compose["volumes"]
    assert str(kafka2spark.delta.root) == "/data/delta"
    assert kafka2spark.delta.checkpoint_path().is_relative_to("/data/delta")
