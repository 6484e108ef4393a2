"""The local stack's Kafka: one KRaft broker from Maven Central's jars."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from stack_components.base import (
    HOST,
    KAFKA_PORT,
    Component,
    java_bin,
    maven_classpath,
    run,
    say,
    spawn,
)


class Kafka(Component):
    """Apache Kafka 4.x, one KRaft node acting as broker and controller. ``name`` and
    ``port`` (the controller listens on the next one) let a test start a second, brand-new
    broker beside the stack's, its state in ``home``)."""

    def __init__(
        self, name: str = "kafka", port: int = KAFKA_PORT, home: Path | None = None
    ) -> None:
        super().__init__(name, port)
        if home is not None:
            self.dir = home
        self.bootstrap = f"{HOST}:{port}"
        self.controller = f"{HOST}:{port + 1}"
        self.data = self.dir / "data"
        self.props = self.dir / "server.properties"
        self.log4j = self.dir / "log4j2.properties"
        self.jars: list[str] = []

    def install(self) -> None:
        self.jars = maven_classpath("kafka")
        self.props.write_text(
            "process.roles=broker,controller\n"
            "node.id=1\n"
            f"controller.quorum.voters=1@{self.controller}\n"
            f"listeners=PLAINTEXT://{self.bootstrap},CONTROLLER://{self.controller}\n"
            f"advertised.listeners=PLAINTEXT://{self.bootstrap}\n"
            "controller.listener.names=CONTROLLER\n"
            "inter.broker.listener.name=PLAINTEXT\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            f"log.dirs={self.data}\n"
            "num.partitions=1\n"
            "offsets.topic.replication.factor=1\n"
            "offsets.topic.num.partitions=10\n"
            "transaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\n"
            "share.coordinator.state.topic.replication.factor=1\n"
            "share.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n"
            # Topics are created on purpose (pg2kafka's auto-create option, the tests):
            # a typo in a topic name must not silently create a new topic.
            "auto.create.topics.enable=false\n"
            "delete.topic.enable=true\n"
            "log.retention.hours=24\n"
            "log.segment.bytes=104857600\n"
            "message.max.bytes=16777216\n"
        )
        self.log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\n"
            "appender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = info\n"
            "rootLogger.appenderRef.out.ref = OUT\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = warn\n"
            "logger.apache.name = org.apache.kafka\nlogger.apache.level = warn\n"
            "logger.started.name = kafka.server.KafkaRaftServer\nlogger.started.level = info\n"
        )
        if not (self.data / "meta.properties").exists():
            say(f"{self.name}: formatting KRaft storage")
            cluster_id = "-"
            while cluster_id.startswith("-"):  # a leading "-" reads as an option to the tool
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            run(
                [
                    java_bin(),
                    f"-Dlog4j2.configurationFile={self.log4j}",
                    "-cp",
                    os.pathsep.join(self.jars),
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(self.props),
                ],
                self.name,
                "format storage",
                self.log,
            )

    def start(self) -> None:
        say(f"{self.name}: starting on {self.bootstrap}")
        spawn(
            [
                java_bin(),
                "-Xms256m",
                "-Xmx512m",
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
                "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile={self.log4j}",
                "-cp",
                os.pathsep.join(self.jars),
                "kafka.Kafka",
                str(self.props),
            ],
            self,
        )

    def probe(self) -> tuple[bool, str]:
        """Healthy = the broker creates (if missing) and lists a topic."""
        try:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient, NewTopic
        except ImportError:
            return False, "confluent-kafka missing: run through deploy/local/walcast"
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 3000, "log_level": 0}
        )
        topic = "__walcast_stack_health"
        try:
            md = admin.list_topics(timeout=3)
            if topic not in md.topics:
                fut = admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=10)[topic]
                try:
                    fut.result(timeout=10)
                except KafkaException as exc:
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        return False, f"create topic: {exc}"
                md = admin.list_topics(timeout=3)
            if topic not in md.topics:
                return False, "health topic not listed"
            return True, f"{len(md.topics)} topics, broker {next(iter(md.brokers.values()))}"
        except KafkaException as exc:
            return False, str(exc)

    def env(self) -> dict[str, str]:
        return kafka_env(self.bootstrap)


def kafka_env(bootstrap: str) -> dict[str, str]:
    """The env file's Kafka entries: every service's bootstrap servers."""
    return {
        "WALCAST_KAFKA_BOOTSTRAP": bootstrap,
        "PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2SEARCH_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2SPARK_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2WEBHOOK_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2POSTGRES_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
    }
