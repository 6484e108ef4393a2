"""Spark's own redaction (its logs, plans, UI) masks the keys walcast treats as secrets."""

from __future__ import annotations

from pyspark.sql import SparkSession

from services.kafka2spark.app import SPARK_REDACTION_REGEX


def test_spark_redacts_what_walcast_treats_as_secret(spark: SparkSession) -> None:
    assert spark.conf.get("spark.redaction.regex") == SPARK_REDACTION_REGEX
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pairs = {
        "spark.hadoop.fs.s3a.secret.key": "s1",
        "spark.hadoop.fs.s3a.access.key": "s2",
        "spark.some.credential": "s3",  # not in Spark's default regex
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "s4",  # nor this
        "kafka.sasl.jaas.config": 'PlainLoginModule required password="s5";',
        "spark.executor.memory": "512m",
    }
    items = jvm.java.util.ArrayList()
    for key, value in pairs.items():
        items.add(jvm.scala.Tuple2(key, value))
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    redacted = jvm.org.apache.spark.util.Utils.redact(
        spark.sparkContext._jsc.sc().conf(), converters.asScala(items).toSeq()
    )
    shown = {t._1(): t._2() for t in converters.asJava(redacted)}
    assert shown["spark.executor.memory"] == "512m"
    for key in pairs.keys() - {"spark.executor.memory"}:
        assert "redacted" in shown[key], key
