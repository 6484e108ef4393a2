from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr
from pydantic_settings import SettingsConfigDict

from shared.errors import ConfigError
from shared.settings import KafkaSettings, PostgresSettings, ServiceSettings, load_settings


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WCTEST_")

    postgres: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()
    batch_size: int = 100


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("WCTEST_"):
            monkeypatch.delenv(key)


def test_defaults_and_frozen() -> None:
    s = load_settings(DemoSettings)
    assert s.batch_size == 100
    with pytest.raises(Exception, match="frozen"):
        s.batch_size = 5  # type: ignore[misc]


def test_env_prefix_and_nested(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCTEST_BATCH_SIZE", "7")
    monkeypatch.setenv("WCTEST_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("WCTEST_POSTGRES__PASSWORD", "hunter2")
    s = load_settings(DemoSettings)
    assert s.batch_size == 7
    assert s.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert isinstance(s.postgres.password, SecretStr)
    assert "hunter2" not in repr(s)
    assert "hunter2" not in str(s.effective())
    assert "password='hunter2'" in s.postgres.conninfo()


def test_yaml_file_with_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("batch_size: 5\nkafka:\n  client_id: from-yaml\n")
    monkeypatch.setenv("WCTEST_BATCH_SIZE", "9")
    s = load_settings(DemoSettings, config_file=cfg)
    assert s.batch_size == 9  # environment beats the file
    assert s.kafka.client_id == "from-yaml"


def test_unknown_yaml_key_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kafka:\n  bootstrap_server: typo:9092\n")
    with pytest.raises(
        ConfigError, match=r"WCTEST_KAFKA__BOOTSTRAP_SERVER / kafka\.bootstrap_server: unknown key"
    ):
        load_settings(DemoSettings, config_file=cfg)


def test_unknown_env_key_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCTEST_KAFKA__BOOTSTRAP_SERVER", "typo:9092")
    with pytest.raises(ConfigError, match="unknown setting WCTEST_KAFKA__BOOTSTRAP_SERVER") as info:
        load_settings(DemoSettings)
    assert "bootstrap_servers" in str(info.value)  # the valid spelling is suggested
    monkeypatch.delenv("WCTEST_KAFKA__BOOTSTRAP_SERVER")
    monkeypatch.setenv("WCTEST_BATCHSIZE", "3")
    with pytest.raises(ConfigError, match="WCTEST_BATCHSIZE"):
        load_settings(DemoSettings)


def test_unknown_key_in_env_file(tmp_path: Path) -> None:
    env = tmp_path / "x.env"
    env.write_text("# comment\nOTHER_KEY=ignored\nWCTEST_BATCH_SIZE=4\nWCTEST_NOPE=1\n")
    with pytest.raises(ConfigError, match=f"WCTEST_NOPE.*{env}"):
        load_settings(DemoSettings, env_file=env)
    env.write_text("OTHER_KEY=ignored\nWCTEST_BATCH_SIZE=4\n")
    assert load_settings(DemoSettings, env_file=env).batch_size == 4


def test_invalid_value_named_but_secret_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCTEST_BATCH_SIZE", "many")
    with pytest.raises(ConfigError, match=r"WCTEST_BATCH_SIZE / batch_size: .*'many'"):
        load_settings(DemoSettings)
    monkeypatch.delenv("WCTEST_BATCH_SIZE")
    monkeypatch.setenv("WCTEST_KAFKA__SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("WCTEST_KAFKA__SECURITY_PROTOCOL", "CARRIER_PIGEON")
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings)
    assert "WCTEST_KAFKA__SECURITY_PROTOCOL" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_missing_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(DemoSettings, config_file=tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(DemoSettings, env_file=tmp_path / "nope.env")


def test_kafka_client_config_carries_sasl_and_extra() -> None:
    k = KafkaSettings(
        bootstrap_servers="b:1",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=SecretStr("p"),
        extra={"linger.ms": "5"},
    )
    conf = k.client_config()
    assert conf["sasl.password"] == "p"
    assert conf["linger.ms"] == "5"
    assert conf["bootstrap.servers"] == "b:1"


def test_extra_dict_accepts_arbitrary_subkeys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCTEST_KAFKA__EXTRA", '{"socket.timeout.ms": "1000"}')
    assert load_settings(DemoSettings).kafka.extra == {"socket.timeout.ms": "1000"}
