"""kafka2spark's pure logic: rename detection, identifiers, paths, types, settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from services.kafka2spark.app import kafka_source_options
from services.kafka2spark.names import column_name, mirror_names, postgres_name, quote, table_dir
from services.kafka2spark.schema import spark_type
from services.kafka2spark.settings import DeltaSettings, SourceSettings, SparkSettings
from shared.contract.ddl import renames
from shared.settings import KafkaSettings


@pytest.mark.parametrize(
    ("statement", "removed", "added", "want"),
    [
        ("ALTER TABLE t RENAME COLUMN a TO b", ["a"], {"b": "int4"}, ("a", "b")),
        ("alter table t rename a to b;", ["a"], {"b": "int4"}, ("a", "b")),
        (
            'ALTER TABLE t RENAME COLUMN "Big A" TO "b""q"',
            ["Big A"],
            {'b"q': "text"},
            ("Big A", 'b"q'),
        ),
        ("ALTER TABLE t RENAME COLUMN A TO B", ["a"], {"b": "int4"}, ("a", "b")),
        # a drop + add in the same statement as another table's rename is not a rename
        (
            "ALTER TABLE t DROP a, ADD b text; ALTER TABLE u RENAME x TO y",
            ["a"],
            {"b": "text"},
            None,
        ),
        ("ALTER TABLE t DROP a, ADD b text", ["a"], {"b": "text"}, None),
        ("ALTER TABLE t RENAME TO u", [], {}, None),
    ],
)
def test_a_rename_is_recognised_only_when_the_columns_agree(
    statement: str, removed: list[str], added: dict[str, str], want: tuple[str, str] | None
) -> None:
    # events without column numbers: only a rename the statement names exactly
    assert renames(removed, added, {}, {}, statement) == ([want] if want else [])


def test_identifiers_are_quoted_whatever_they_contain() -> None:
    assert quote("a.b") == "`a.b`"
    assert quote("we`ird") == "`we``ird`"


def test_table_directories_stay_inside_the_root() -> None:
    assert table_dir("{schema}.{table}", "db", "public", "orders") == "public.orders"
    escaped = table_dir("{schema}.{table}", "db", "../x", "a/b c")
    assert re.fullmatch(r"_x\.a_b_c-[0-9a-f]{10}", escaped)
    assert "/" not in table_dir("{db}/{schema}.{table}", "d", "s", "t")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("s", "a b"), ("s", "a_b")),
        (("a.b", "c"), ("a", "b.c")),
        (("s", "Orders"), ("s", "orders")),
    ],
)
def test_tables_never_share_a_mirror(one: tuple[str, str], other: tuple[str, str]) -> None:
    """Shared, a TRUNCATE of one table removed the other's rows. Case twins differ even
    on a case-insensitive file system."""
    a, b = table_dir("{schema}.{table}", "d", *one), table_dir("{schema}.{table}", "d", *other)
    assert a.lower() != b.lower()


@pytest.mark.parametrize(
    ("pg", "spark"),
    [
        ("int4", T.IntegerType()),
        ("int8", T.LongType()),
        ("numeric", T.StringType()),  # exact: no 38-digit limit, NaN kept
        ("timestamptz", T.TimestampType()),
        ("timestamp", T.TimestampNTZType()),
        ("jsonb", T.StringType()),
        ("_int4", T.ArrayType(T.IntegerType())),
        ("bytea", T.BinaryType()),
        ("mood_enum", T.StringType()),
    ],
)
def test_postgres_types_map_without_loss(pg: str, spark: T.DataType) -> None:
    assert spark_type(pg) == spark


def test_settings_reject_a_template_without_table_and_bad_conf_keys() -> None:
    with pytest.raises(ValidationError, match="must contain"):
        DeltaSettings(table_template="{schema}")
    with pytest.raises(ValidationError, match="unknown field"):
        DeltaSettings(table_template="{nope}.{table}")
    with pytest.raises(ValidationError, match="not Spark configuration keys"):
        SparkSettings(conf={"spark.sql x": "1"})
    with pytest.raises(ValidationError):
        DeltaSettings(vacuum_retention_hours=1)


def test_checkpoint_defaults_under_the_root() -> None:
    assert DeltaSettings(root=Path("/d")).checkpoint_path() == Path("/d/_checkpoints/mirror")


def test_kafka_options_for_spark_carry_security() -> None:
    k = KafkaSettings(
        bootstrap_servers="b:9092",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password='p"w',  # type: ignore[arg-type]
        ssl_ca_location=Path("/ca.pem"),
    )
    opts = kafka_source_options(k)
    assert opts["kafka.bootstrap.servers"] == "b:9092"
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
        ' username="u" password="p\\"w";'
    )
    assert opts["kafka.ssl.truststore.type"] == "PEM"


@pytest.mark.parametrize(
    "name",
    ["id", "first name", "a,b;c{d}e(f)g=h", "100%", "_walcast_lsn", "__W_LSN", "Été", "名前"],
)
def test_mirror_column_names_decode_back_and_delta_accepts_them(name: str) -> None:
    plain = column_name(name)
    assert postgres_name(plain) == name
    assert not set(" ,;{}()\n\t=").intersection(plain)
    if name.upper() == name.lower():
        return  # nothing with case: no twin
    escaped = mirror_names([plain.swapcase()], [name])[name]  # a twin holds the plain name
    assert postgres_name(escaped) == name
    assert escaped.upper().casefold() != plain.upper().casefold()
    assert not set(" ,;{}()\n\t=").intersection(escaped)


def test_case_twins_get_names_delta_tells_apart() -> None:
    """Delta refuses two columns differing only by case, and Spark resolves names
    ignoring case: the first twin keeps its name, the next gets the case-free form."""
    names = mirror_names([], ["id", "Name", "name", "NAME", "_WALCAST_LSN", "\u017f", "s"])
    assert names["id"] == "id"
    assert names["Name"] == "Name"
    folded = [n.upper().casefold() for n in [*names.values(), "_walcast_lsn"]]
    assert len(set(folded)) == len(folded)
    assert {postgres_name(n) for n in names.values()} == set(names)
    # a twin added later, beside the mirror's existing columns
    later = mirror_names(list(names.values()), ["nAmE"])
    assert later["nAmE"].upper().casefold() not in folded
    assert postgres_name(later["nAmE"]) == "nAmE"


@pytest.mark.parametrize(
    ("max_offsets", "per_task", "tasks"),
    [(200_000, 100_000, 2), (1_000_000, 100_000, 10), (150_000, 100_000, 2), (1, 1_000, 1)],
)
def test_a_batch_is_read_in_tasks_of_at_most_records_per_task(
    max_offsets: int, per_task: int, tasks: int
) -> None:
    s = SourceSettings(max_offsets_per_trigger=max_offsets, records_per_task=per_task)
    assert s.min_partitions() == tasks
    with pytest.raises(ValidationError):
        SourceSettings(records_per_task=999)
