"""Secrets never logged: all three services as real processes at DEBUG, with a unique secret
in every place one can be set — the Postgres password (a role made for the test),
kafka.sasl_password and secret kafka.extra keys, the engine's password, API key and URL
credentials, secret spark.conf keys, an ALTER ROLE ... PASSWORD sent with a DDL
statement — data flowing through all of them, and an error path of each taken with the
secrets set. Then every line any of them wrote, and every record of the CDC topic, is
searched for every secret value.

The local Kafka is PLAINTEXT and the engines have no security plugin: librdkafka accepts
(and does not use) SASL and SSL key settings under PLAINTEXT, the engines ignore basic
auth, and the Java Kafka client reads its JAAS setting only for SASL protocols — so the
secrets are set and the data still flows, which the test checks too.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from services.kafka2search.engines import engine_for
from services.kafka2search.settings import Kafka2SearchSettings
from services.pg2kafka import admin
from services.pg2kafka.transforms import WITHHELD
from shared.secrets import MASK
from shared.settings import load_settings
from tests.e2e.conftest import Proc, confirmed, pg2kafka_env, pg2kafka_settings, wait_until
from tests.ports import free_port

ROWS = 20


def _secret(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex}"


def _kafka_secrets(prefix: str, secrets: dict[str, str]) -> dict[str, str]:
    """kafka.* secrets of one service, each its own value."""
    tag = prefix.lower()
    extra = {
        "ssl.key.password": _secret(f"{tag}-sslkeypw"),
        "ssl.keystore.password": _secret(f"{tag}-keystorepw"),
        "sasl.oauthbearer.client.secret": _secret(f"{tag}-oauth"),
        "ssl.key.pem": _secret(f"{tag}-pem"),
    }
    secrets.update({f"{tag} kafka.extra {k}": v for k, v in extra.items()})
    secrets[f"{tag} kafka.sasl_password"] = _secret(f"{tag}-saslpw")
    return {
        f"{prefix}_LOG__LEVEL": "DEBUG",
        f"{prefix}_HTTP__PORT": "0",
        f"{prefix}_KAFKA__SASL_MECHANISM": "PLAIN",
        f"{prefix}_KAFKA__SASL_USERNAME": "walcast",
        f"{prefix}_KAFKA__SASL_PASSWORD": secrets[f"{tag} kafka.sasl_password"],
        f"{prefix}_KAFKA__EXTRA": json.dumps(extra),
    }


def _with_credentials(url: str, password: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://walcast:{password}@{parts.netloc}{parts.path}"


@pytest.fixture
def world(stack_env: dict[str, str], unique_name: str, tmp_path: Path) -> Any:
    """The table, a login role with a unique password for pg2kafka, a role whose password
    a DDL statement sets, the slot / publication / topic; removed afterwards."""
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    dsn = stack_env["WALCAST_PG_DSN"]
    topic = f"{unique_name}.cdc"
    name = unique_name.replace("_", "-")
    table = f"{unique_name}_rows"
    role, ddl_role = f"{unique_name}_pg2kafka", f"{unique_name}_other"
    secrets = {"postgres.password": _secret("pgpw")}
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, note text)")
        # pg2kafka streams a slot that init made: it needs to log in and replicate.
        c.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{secrets['postgres.password']}'")
        c.execute(f"CREATE ROLE {ddl_role} NOLOGIN")
    pg = pg2kafka_settings(env_file, unique_name, topic, 1)
    admin.init(pg)
    with psycopg.connect(dsn, autocommit=True) as c:
        # Transform rules are checked against the stops pg2kafka records in _walcast
        # (fail closed: a role that may not read them is refused at start).
        c.execute(f"GRANT USAGE ON SCHEMA _walcast TO {role}")
        c.execute(f"GRANT SELECT, INSERT, DELETE ON _walcast.transform_stops TO {role}")
        # ... and it acts on DDL messages only when it can check their signature.
        c.execute(f"GRANT SELECT ON _walcast.message_key, _walcast.schema_migrations TO {role}")
    search = load_settings(Kafka2SearchSettings, env_file=env_file)
    engine = engine_for(search.engine)
    yield {
        "env_file": env_file, "dsn": dsn, "topic": topic, "name": name, "table": table,
        "role": role, "ddl_role": ddl_role, "secrets": secrets, "engine": engine,
        "alias": f"{name}-{table}".lower(), "stack": stack_env, "pg": pg, "slot": unique_name,
    }  # fmt: skip
    for _alias, index in engine.aliases(f"{name}-*").items():
        engine.delete_index(index)
    engine.close()
    admin.tear_down(pg)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {table}")
        c.execute(f"DROP OWNED BY {role}")  # its grants on _walcast
        c.execute(f"DROP ROLE IF EXISTS {role}")
        c.execute(f"DROP ROLE IF EXISTS {ddl_role}")
    client = AdminClient(pg.kafka.client_config())
    present = client.list_topics(timeout=10).topics
    gone = [t for t in (topic, f"{name}.dlq") if t in present]
    for fut in client.delete_topics(gone).values():
        fut.result(30)


def _run(service: str, args: list[str], env: dict[str, str], log: Path) -> int:
    """A service command that is expected to end (an error path); its output to ``log``."""
    proc = Proc(service, args, env, log)
    try:
        return proc.popen.wait(120)
    finally:
        proc.stop()


def test_no_secret_reaches_any_log(world: Any, procs: list[Proc], tmp_path: Path) -> None:
    secrets: dict[str, str] = world["secrets"]
    env_file = str(world["env_file"])
    table, topic, name = world["table"], world["topic"], world["name"]

    # pg2kafka, as the role with the unique password.
    pg_env = {
        **pg2kafka_env(world["slot"], topic),
        **_kafka_secrets("PG2KAFKA", secrets),
        "PG2KAFKA_POSTGRES__USER": world["role"],
        "PG2KAFKA_POSTGRES__PASSWORD": secrets["postgres.password"],
        "PG2KAFKA_LOG__FORMAT": "text",
        # The transform rules' HMAC key: loaded and checked (the rule matches no column).
        "PG2KAFKA_TRANSFORMS__HASH_KEY": secrets.setdefault(
            "transforms.hash_key", _secret("hashkey-0123456789")
        ),
        "PG2KAFKA_TRANSFORMS__RULES": '[{"column": "*.*.no_such_column", "action": "hash"}]',
    }
    pg2kafka = Proc("pg2kafka", ["--env-file", env_file, "run"], pg_env, tmp_path / "pg2kafka.log")
    procs.append(pg2kafka)

    # kafka2search, through URL credentials and basic auth the engine ignores.
    secrets["engine.urls password"] = _secret("urlpw")
    secrets["engine.password"] = _secret("enginepw")
    opensearch = world["stack"]["WALCAST_OPENSEARCH_URL"]
    search_env = {
        **_kafka_secrets("KAFKA2SEARCH", secrets),
        "KAFKA2SEARCH_CONSUMER__TOPICS": json.dumps([topic]),
        "KAFKA2SEARCH_CONSUMER__GROUP_ID": f"{name}-group",
        "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{name}.dlq",
        "KAFKA2SEARCH_INDEX__NAME_TEMPLATE": f"{name}-{{table}}",
        "KAFKA2SEARCH_ENGINE__URLS": json.dumps(
            [_with_credentials(opensearch, secrets["engine.urls password"])]
        ),
        "KAFKA2SEARCH_ENGINE__USERNAME": "walcast",
        "KAFKA2SEARCH_ENGINE__PASSWORD": secrets["engine.password"],
        "KAFKA2SEARCH_LOG__FORMAT": "json",
    }
    search = Proc("kafka2search", ["--env-file", env_file, "run"], search_env,
                  tmp_path / "kafka2search.log")  # fmt: skip
    procs.append(search)

    # Error paths, each with its secrets set.
    secrets["wrong postgres.password"] = _secret("wrongpw")
    code = _run("pg2kafka", ["--env-file", env_file, "run"],
                {**pg_env, "PG2KAFKA_POSTGRES__PASSWORD": secrets["wrong postgres.password"]},
                tmp_path / "pg2kafka-wrong-password.log")  # fmt: skip
    assert code == 1
    secrets["engine.api_key"] = _secret("apikey")
    secrets["unreachable engine url password"] = _secret("deadurlpw")
    unreachable = {k: v for k, v in search_env.items() if "ENGINE__" not in k} | {
        "KAFKA2SEARCH_ENGINE__KIND": "elasticsearch",
        "KAFKA2SEARCH_ENGINE__URLS": json.dumps([_with_credentials(
            f"http://127.0.0.1:{free_port()}", secrets["unreachable engine url password"])]),
        "KAFKA2SEARCH_ENGINE__API_KEY": secrets["engine.api_key"],
        "KAFKA2SEARCH_ENGINE__REQUEST_TIMEOUT_S": "2",
    }  # fmt: skip
    code = _run("kafka2search", ["--env-file", env_file, "status"], unreachable,
                tmp_path / "kafka2search-unreachable-engine.log")  # fmt: skip
    assert code != 0

    # The workload, with a password sent along with a DDL statement.
    secrets["ALTER ROLE ... PASSWORD in a DDL statement"] = _secret("ddlpw")
    with psycopg.connect(world["dsn"], autocommit=True) as c:
        c.execute(f"INSERT INTO {table} SELECT g, g, 'n' || g FROM generate_series(1, {ROWS}) g")
        c.execute(
            f"ALTER TABLE {table} ADD COLUMN extra int;"
            f" ALTER ROLE {world['ddl_role']}"
            f" PASSWORD '{secrets['ALTER ROLE ... PASSWORD in a DDL statement']}'"
        )
        c.execute(f"UPDATE {table} SET v = v * 2, extra = id WHERE id % 3 = 0")
        c.execute(f"DELETE FROM {table} WHERE id % 7 = 0")
        row = c.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        lsn = int(row[0])
        count = c.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert count is not None
        expected = int(count[0])

    def delivered() -> bool:
        assert pg2kafka.alive(), pg2kafka.tail()
        return confirmed(world["dsn"], world["slot"]) >= lsn

    wait_until(delivered, "pg2kafka to deliver the workload", 60)
    engine, alias = world["engine"], world["alias"]

    def indexed() -> bool:
        assert search.alive(), search.tail()
        try:
            if engine.resolve_alias(alias) is None:
                return False
            engine.refresh(alias)
            return engine.count(alias) == expected
        except Exception:  # noqa: BLE001 - a new index answers 503 until its shard is up
            return False

    wait_until(indexed, "kafka2search to index the table", 60)

    # kafka2spark: one available-now pass mirrors the topic, then it stops.
    secrets.update({
        "spark.conf spark.hadoop.fs.s3a.secret.key": _secret("s3secret"),
        "spark.conf spark.hadoop.fs.s3a.access.key": _secret("s3access"),
        "spark.conf spark.hadoop.fs.s3a.session.token": _secret("s3token"),
    })  # fmt: skip
    root = tmp_path / "delta"
    conf = {k.removeprefix("spark.conf "): v for k, v in secrets.items() if "spark.conf " in k}
    spark_env = {
        **_kafka_secrets("KAFKA2SPARK", secrets),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "KAFKA2SPARK_SPARK__CONF": json.dumps(conf),
        "KAFKA2SPARK_SOURCE__TOPICS": json.dumps([topic]),
        "KAFKA2SPARK_SOURCE__GROUP_ID": f"{name}-spark",
        "KAFKA2SPARK_DELTA__ROOT": str(root),
        "KAFKA2SPARK_TRIGGER__MODE": "available_now",
        "KAFKA2SPARK_LOG__FORMAT": "json",
    }
    spark = Proc("kafka2spark", ["--env-file", env_file, "run"], spark_env,
                 tmp_path / "kafka2spark.log")  # fmt: skip
    procs.append(spark)
    wait_until(lambda: not spark.alive(), "the available-now pass to finish", 300, interval=1)
    assert spark.popen.returncode == 0, spark.tail(60)
    mirrored = DeltaTable(str(root / f"public.{table}")).to_pyarrow_table()
    assert mirrored.num_rows == expected

    # kafka2spark's error paths: a query that cannot write its checkpoint (Spark's own
    # exception, conf set), and a configuration error next to the secrets.
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    code = _run("kafka2spark", ["--env-file", env_file, "run"],
                {**spark_env, "KAFKA2SPARK_DELTA__ROOT": str(blocked),
                 "KAFKA2SPARK_SOURCE__GROUP_ID": f"{name}-spark-fail"},
                tmp_path / "kafka2spark-unwritable.log")  # fmt: skip
    assert code != 0
    code = _run("kafka2spark", ["--env-file", env_file, "run"],
                {**spark_env, "KAFKA2SPARK_SPARK__CONF": json.dumps({**conf, "not a key!": "x"})},
                tmp_path / "kafka2spark-bad-config.log")  # fmt: skip
    assert code == 2

    for p in (pg2kafka, search):
        assert p.alive(), p.tail()
        p.stop()

    # Every line every process wrote, and every record of the topic.
    logs = {p.name: p.read_text(errors="replace") for p in sorted(tmp_path.glob("*.log"))}
    records = _topic_records(world["pg"].kafka.bootstrap_servers, topic)
    leaks = [
        f"{what} in {where}"
        for what, value in secrets.items()
        for where, text in [*logs.items(), ("the CDC topic", records)]
        if value in text
    ]
    assert not leaks, leaks

    # Not vacuous: the secrets were in force and the paths were taken.
    assert len(logs) == 7, sorted(logs)
    for log_name in ("pg2kafka.log", "kafka2search.log", "kafka2spark.log"):
        starting = [ln for ln in logs[log_name].splitlines() if "starting" in ln and "config" in ln]
        assert starting, log_name  # the effective configuration was logged...
        for key in ("sasl.oauthbearer.client.secret", "ssl.key.pem", "sasl_password"):
            assert f"{key}" in starting[0], (log_name, key)  # ...with the secret keys
        assert MASK in starting[0], log_name  # ...masked
    assert "password authentication failed" in logs["pg2kafka-wrong-password.log"]
    assert "uncaught exception" in logs["kafka2search-unreachable-engine.log"]
    assert "ParentNotDirectoryException" in logs["kafka2spark-unwritable.log"]
    assert "not Spark configuration keys" in logs["kafka2spark-bad-config.log"]
    # The DDL event is there, its statement withheld whole: transform rules are configured
    # here, and a statement may carry their columns' literals (scrubbing of PASSWORD
    # clauses, for streams without rules: tests/unit/pg2kafka/test_ddl_secrets.py).
    assert f'"statement":"{WITHHELD}"' in records
    assert f"http://walcast:{MASK}@" in logs["kafka2search.log"]  # the URL, masked


def _topic_records(bootstrap: str, topic: str) -> str:
    """Every record value of the (single-partition) topic, as text."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-verify",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[str] = []
        while len(values) < high:
            msg = consumer.poll(5)
            assert msg is not None, f"{len(values)} of {high} records read"
            if msg.error() is None:
                values.append(msg.value().decode(errors="replace"))
        return "\n".join(values)
    finally:
        consumer.close()
