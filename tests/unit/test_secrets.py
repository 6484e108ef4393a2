"""Secrets are masked in the effective configuration, in every log line and in every error
line a command prints: one set of rules (shared.secrets) for all of them."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import threading
import time

import pytest
from pydantic_settings import SettingsConfigDict

from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2spark.settings import Kafka2SparkSettings
from services.pg2kafka.settings import Pg2KafkaSettings
from shared import logs
from shared.cli import run_command
from shared.errors import ConfigError, PermanentError
from shared.logs import configure_logging, log_uncaught, register_secrets_of
from shared.secrets import MASK, is_secret_key, masked, scrub, secret_values
from shared.settings import KafkaSettings, PostgresSettings, ServiceSettings, load_settings


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no registered secrets and no stray settings variables, and
    gets Python's exception hooks back."""
    monkeypatch.setattr(logs, "_secrets", set())
    monkeypatch.setattr(logs, "_ordered", ())
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    for key in list(os.environ):
        if key.startswith(("WCSECRET_", "PG2KAFKA_", "KAFKA2SEARCH_", "KAFKA2SPARK_")):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "My_Secret_Thing",
        "PASSWORD",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.session.token",
        "fs.azure.account.key.acct.dfs.core.windows.net",
        "spark.ssl.keyStorePassword",
        "spark.authenticate.secret",
        "some.credential",
        "api_key",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "bootstrap.servers",
        "sasl.username",
        "sasl.mechanism",
        "ssl.key.location",
        "spark.sql.shuffle.partitions",
        "spark.io.encryption.keySizeBits",
        "spark.security.credentials.kafka.enabled",
        "spark.hadoop.fs.s3a.aws.credentials.provider",
        "sasl.oauthbearer.token.endpoint.url",
        "key_field",
    ],
)
def test_keys_that_are_not_secrets(key: str) -> None:
    assert not is_secret_key(key)


def _kafka_env(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    monkeypatch.setenv(f"{prefix}_KAFKA__SASL_PASSWORD", "sasl-pw-1")
    monkeypatch.setenv(
        f"{prefix}_KAFKA__EXTRA",
        json.dumps(
            {
                "ssl.key.password": "ssl-key-pw-2",
                "sasl.oauthbearer.client.secret": "oauth-3",
                "ssl.keystore.password": "keystore-4",
                "ssl.key.pem": "-----BEGIN PEM 5-----",
                "My.Secret": "mine-6",
                "client.rack": "rack-a",
            }
        ),
    )


def test_effective_config_of_every_service_masks_every_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for prefix in ("PG2KAFKA", "KAFKA2SEARCH", "KAFKA2SPARK"):
        _kafka_env(monkeypatch, prefix)
    monkeypatch.setenv("PG2KAFKA_POSTGRES__PASSWORD", "pg-pw-7")
    monkeypatch.setenv(
        "KAFKA2SEARCH_ENGINE__URLS",
        '["http://alice:url-pw-8@127.0.0.1:9200", "http://127.0.0.1:9201"]',
    )
    monkeypatch.setenv("KAFKA2SEARCH_ENGINE__USERNAME", "alice")
    monkeypatch.setenv("KAFKA2SEARCH_ENGINE__PASSWORD", "engine-pw-9")
    monkeypatch.setenv(
        "KAFKA2SPARK_SPARK__CONF",
        json.dumps(
            {
                "spark.hadoop.fs.s3a.secret.key": "s3-secret-10",
                "spark.hadoop.fs.s3a.access.key": "s3-access-11",
                "spark.hadoop.fs.s3a.session.token": "s3-token-12",
                "spark.executor.memory": "512m",
            }
        ),
    )
    pg = load_settings(Pg2KafkaSettings)
    search = load_settings(Kafka2SearchSettings)
    spark = load_settings(Kafka2SparkSettings)
    shown = json.dumps([pg.effective(), search.effective(), spark.effective()])
    for i, secret in enumerate(
        ["sasl-pw-1", "ssl-key-pw-2", "oauth-3", "keystore-4", "BEGIN PEM 5", "mine-6",
         "pg-pw-7", "url-pw-8", "engine-pw-9", "s3-secret-10", "s3-access-11", "s3-token-12"]
    ):  # fmt: skip
        assert secret not in shown, (i, secret)
    assert search.effective()["engine"]["urls"] == [
        f"http://alice:{MASK}@127.0.0.1:9200",
        "http://127.0.0.1:9201",
    ]
    assert search.effective()["engine"]["password"] == MASK
    extra = pg.effective()["kafka"]["extra"]
    assert extra["ssl.key.password"] == MASK
    assert extra["client.rack"] == "rack-a"  # not a secret: shown
    assert spark.effective()["spark"]["conf"]["spark.executor.memory"] == "512m"
    # the secret values of each service's settings: what the logs are scrubbed of
    assert {"pg-pw-7", "sasl-pw-1", "ssl-key-pw-2", "mine-6"} <= secret_values(pg)
    assert {"url-pw-8", "engine-pw-9"} <= secret_values(search)
    assert {"s3-secret-10", "s3-access-11", "s3-token-12"} <= secret_values(spark)
    assert "rack-a" not in secret_values(pg)
    assert "512m" not in secret_values(spark)


def test_an_unset_secret_shows_as_unset() -> None:
    assert masked(PostgresSettings())["password"] == ""
    assert masked(KafkaSettings())["sasl_password"] is None


def test_secret_values_in_the_spellings_messages_use() -> None:
    settings = KafkaSettings(sasl_password='q"uo\\te', extra={"sasl.password": "p@ss w/rd"})
    values = secret_values(settings)
    assert {'q"uo\\te', 'q\\"uo\\\\te', "p@ss w/rd", "p%40ss%20w%2Frd"} <= values
    # a URL password counts decoded and as written
    urls = secret_values({"urls": ["https://bob:pa%40ss@h:9200/x"]})
    assert {"pa%40ss", "pa@ss"} <= urls


def test_scrub_masks_values_and_patterns() -> None:
    text = (
        "connect to postgresql://u:dsn-pw@127.0.0.1/db failed; host=h password='x y'"
        " sasl.password=abc spark.security.credentials.kafka.enabled=true token hunter22"
    )
    out = scrub(text, ["hunter22"])
    assert out == (
        f"connect to postgresql://u:{MASK}@127.0.0.1/db failed; host=h password={MASK}"
        f" sasl.password={MASK} spark.security.credentials.kafka.enabled=true token {MASK}"
    )
    # a secret that contains another goes whole when given longest first
    assert scrub("abcdef", ["abcdef", "abc"]) == MASK


def test_log_lines_are_scrubbed_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCSECRET_POSTGRES__PASSWORD", "pg-secret-1")
    monkeypatch.setenv("WCSECRET_KAFKA__EXTRA", '{"ssl.key.password": "kafka-secret-2"}')
    settings = load_settings(_Demo)
    register_secrets_of(settings)
    for fmt in ("json", "text"):
        out = io.StringIO()
        configure_logging("DEBUG", fmt, stream=out)
        log = logging.getLogger("walcast.test")
        log.info("driver said: %s", "auth with pg-secret-1 failed")
        log.info("config", extra={"nested": {"a": ["kafka-secret-2"], "url": "http://u:p4ss@h"}})
        try:
            raise RuntimeError("boom kafka-secret-2")
        except RuntimeError:
            log.exception("failed")
        text = out.getvalue()
        for secret in ("pg-secret-1", "kafka-secret-2", "p4ss"):
            assert secret not in text, (fmt, secret, text)
        assert MASK in text


def test_uncaught_exceptions_are_logged_scrubbed() -> None:
    logs.register_secret("thread-secret-3")
    out = io.StringIO()
    configure_logging("INFO", "text", stream=out)
    log_uncaught()

    def fail() -> None:
        raise RuntimeError("thread-secret-3 leaked?")

    t = threading.Thread(target=fail, name="worker")
    t.start()
    t.join()
    try:
        raise ValueError("main thread-secret-3")
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    text = out.getvalue()
    assert "uncaught exception in thread worker" in text
    assert "RuntimeError" in text
    assert "ValueError" in text  # the traceback is kept
    assert "thread-secret-3" not in text


class _Demo(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WCSECRET_")

    postgres: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()


def test_command_error_line_is_scrubbed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WCSECRET_POSTGRES__PASSWORD", "cmd-secret-4")
    monkeypatch.setenv("WCSECRET_LOG__FORMAT", "text")
    args = argparse.Namespace(config=None, env_file=None)

    def command(settings: _Demo) -> None:
        raise PermanentError(
            "connection to postgresql://x:url-secret-5@h failed with cmd-secret-4",
            hint="check postgres.password",
        )

    assert run_command("demo", _Demo, args, command) == 1
    err = capsys.readouterr().err
    assert "demo: connection to" in err
    assert "check postgres.password" in err
    assert "cmd-secret-4" not in err
    assert "url-secret-5" not in err


def test_an_unexpected_error_says_what_it_is_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the bare text of a KeyError (its key: ``(2, 'public', 't', 39)``)."""
    monkeypatch.setenv("WCSECRET_LOG__FORMAT", "text")
    args = argparse.Namespace(config=None, env_file=None)

    def command(settings: _Demo) -> None:
        raise KeyError((2, "public", "t", 39))

    assert run_command("demo", _Demo, args, command) == 1
    err = capsys.readouterr().err
    assert "unexpected KeyError" in err
    assert "restart resumes" in err
    assert "Traceback" in err  # kept in the log


def test_configuration_errors_do_not_echo_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA2SEARCH_ENGINE__URLS", '["ftp://bob:cfg-secret-6@h"]')
    with pytest.raises(ConfigError) as info:
        load_settings(Kafka2SearchSettings)
    assert "engine.urls" in str(info.value)
    assert "cfg-secret-6" not in str(info.value)
    monkeypatch.delenv("KAFKA2SEARCH_ENGINE__URLS")
    monkeypatch.setenv("KAFKA2SEARCH_ENGINE__API_KEY", "cfg-secret-7")  # opensearch: refused
    with pytest.raises(ConfigError) as info:
        load_settings(Kafka2SearchSettings)
    assert "cfg-secret-7" not in str(info.value)


def test_scrubbing_a_long_line_takes_one_pass() -> None:
    """Every log line is scrubbed: a long token without "=" or "://" must not cost a
    pass per starting position (that was minutes for 100,000 characters)."""
    started = time.perf_counter()
    for text in ("a" * 200_000, "a.b-c" * 40_000, "http://u:" + "p" * 200_000):
        assert scrub(text, ["hunter22"]) == text
    assert time.perf_counter() - started < 2
