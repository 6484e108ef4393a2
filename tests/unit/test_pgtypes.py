"""The one type table: every service derives its view of a type from it."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from services.kafka2search.mapping import field_mapping
from services.kafka2spark.schema import spark_type
from services.pg2kafka.types import TypeRegistry
from shared.contract import pgtypes


def test_the_table_has_no_duplicate_oid_name_or_array_oid() -> None:
    oids = [t.oid for t in pgtypes.TYPES if t.oid]
    arrays = [t.array_oid for t in pgtypes.TYPES if t.array_oid]
    names = [t.name for t in pgtypes.TYPES]
    assert len(set(oids)) == len(oids)
    assert len(set(arrays)) == len(arrays)
    assert len(set(names)) == len(names)
    assert not set(oids) & set(arrays)


@pytest.mark.parametrize("row", pgtypes.TYPES, ids=lambda t: t.name)
def test_every_service_derives_the_same_view_of_a_type(row: pgtypes.PgType) -> None:
    registry = TypeRegistry()
    if row.oid:
        assert registry.name(row.oid) == row.name
        assert registry.spec(row.oid) == row.kind
        assert registry.spec(row.array_oid) == "a," + row.kind
        assert registry.name(row.array_oid) == row.array_name
    assert field_mapping(row.name) == row.search
    assert field_mapping(row.array_name) == row.search
    element = spark_type(row.name)
    assert element.simpleString() == row.spark
    assert spark_type(row.array_name) == T.ArrayType(element)


def test_arrays_convert_element_wise_with_the_elements_converter() -> None:
    registry = TypeRegistry()
    assert registry.convert(1187, '{P1D,NULL,"PT1H"}') == ["P1D", None, "PT1H"]
    assert registry.convert(1185, '{"2024-01-02 03:04:05+00"}') == ["2024-01-02T03:04:05+00:00"]
    assert registry.convert(1001, '{"\\\\x0102"}') == ["AQI="]
    assert registry.convert(1000, "{t,f}") == [True, False]
