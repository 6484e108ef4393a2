"""The local stack's Debezium connector (started only when named: ``up debezium``),
for the tests that compare walcast with it."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

from stack_components.base import (
    DEBEZIUM_PORT,
    HOST,
    KAFKA_PORT,
    Component,
    http_json,
    java_bin,
    maven_classpath,
    say,
    spawn,
)


class Debezium(Component):
    """Optional (``up debezium``; not in the default ``up``): a Kafka Connect standalone
    worker of the stack's Kafka version with Debezium's PostgreSQL connector on its
    classpath, its REST API on 127.0.0.1. It runs no connector of its own: whoever needs
    one (the tests, the benchmarks) registers it through the REST API with its own slot,
    publication and topic prefix. Offsets live in a file under the state directory."""

    plugin = "io.debezium.connector.postgresql.PostgresConnector"

    def __init__(self) -> None:
        super().__init__("debezium", DEBEZIUM_PORT)
        self.props = self.dir / "worker.properties"
        self.log4j = self.dir / "log4j2.properties"
        self.jars: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def install(self) -> None:
        self.jars = maven_classpath(self.name)
        self.props.write_text(
            f"bootstrap.servers={HOST}:{KAFKA_PORT}\n"
            "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
            "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
            f"offset.storage.file.filename={self.dir / 'offsets.dat'}\n"
            "offset.flush.interval.ms=1000\n"
            f"listeners={self.url}\n"
            f"rest.advertised.host.name={HOST}\n"
            # The connector is on the classpath, not in a plugin directory.
            "plugin.discovery=only_scan\n"
        )
        self.log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\n"
            "appender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = warn\n"
            "rootLogger.appenderRef.out.ref = OUT\n"
            "logger.debezium.name = io.debezium\nlogger.debezium.level = info\n"
            "logger.connect.name = org.apache.kafka.connect.runtime.Worker\n"
            "logger.connect.level = info\n"
        )

    def start(self) -> None:
        say(f"{self.name}: starting Kafka Connect (standalone) with Debezium on {self.url}")
        spawn(
            [
                java_bin(),
                "-Xms128m",
                "-Xmx768m",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile={self.log4j}",
                "-cp",
                os.pathsep.join(self.jars),
                "org.apache.kafka.connect.cli.ConnectStandalone",
                str(self.props),
            ],
            self,
        )

    def probe(self) -> tuple[bool, str]:
        """Healthy = the worker's REST API lists Debezium's PostgreSQL connector."""
        try:
            plugins = http_json(f"{self.url}/connector-plugins")
            running = http_json(f"{self.url}/connectors")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return False, f"no answer: {exc}"
        versions = [p.get("version") for p in plugins if p.get("class") == self.plugin]
        if not versions:
            return False, f"{self.plugin} not among the worker's plugins"
        return True, f"Debezium {versions[0]}, {len(running)} connectors"

    def env(self) -> dict[str, str]:
        return {"WALCAST_DEBEZIUM_URL": self.url}
