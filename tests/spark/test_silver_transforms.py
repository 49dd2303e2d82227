"""chispa tests of the silver transforms (DataFrame -> DataFrame)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from pipeline.codec.capture import read_capture
from pipeline.silver import bronze_rows
from pipeline.silver.decode import OUTPUT_SCHEMAS, decode_arrow
from pipeline.silver.registry import StatisticKinds, seed_table, to_registry
from pipeline.silver.tasks import decode_to_arrow
from pipeline.silver.transforms import wide_view
from schemas.tables import spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def frame(spark: SparkSession, table: pa.Table, name: str) -> DataFrame:
    rows = table.cast(OUTPUT_SCHEMAS[name]).to_pylist()
    maps = [f.name for f in OUTPUT_SCHEMAS[name] if pa.types.is_map(f.type)]
    for r in rows:  # Arrow gives a map as (key, value) pairs; Spark takes a dict
        r.update({m: None if r[m] is None else dict(r[m]) for m in maps})
    return spark.createDataFrame(rows, spark_schema(OUTPUT_SCHEMAS[name]))


def sortable(df: DataFrame) -> DataFrame:
    """Maps as sorted entry arrays: Spark cannot sort (or hash) map columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    maps = [f.name for f in df.schema.fields if isinstance(f.dataType, MapType)]
    return df.withColumns({m: F.array_sort(F.map_entries(m)) for m in maps}) if maps else df


def test_task_decode_equals_the_local_decode(
    spark: SparkSession, shared_dir: str, tmp_path: Any
) -> None:
    """Spark tasks (2 partitions, each writing its own files) give the tables the
    driver-side decode gives."""
    msgs = list(read_capture(os.path.join(shared_dir, "samples/qpidd-capture-20s.jsonl")))[:400]
    bronze = bronze_rows(msgs, batch_id=3)
    kinds = StatisticKinds.load()
    reg = to_registry(seed_table(kinds))
    local = decode_arrow(bronze, reg.copy(), 7, kinds)
    df = spark.createDataFrame(bronze.to_pandas()).repartition(2)
    tasks = decode_to_arrow(df, reg, 7, kinds, str(tmp_path))
    for name in ("object_samples", "events", "heartbeats", "method_responses"):
        assert local.get(name).num_rows > 0, name
        assert_df_equality(
            sortable(frame(spark, tasks.get(name), name)),
            sortable(frame(spark, local.get(name), name)),
            ignore_row_order=True,
            ignore_nullable=True,
        )
    assert sorted(os.listdir(tmp_path / "object_samples"))  # the tasks' own files


def test_wide_view_turns_slots_into_columns(spark: SparkSession) -> None:
    from pipeline.codec.schema import ClassSchema, Element, SchemaKey
    from pipeline.silver.registry import registry_row

    schema = ClassSchema(
        key=SchemaKey("org.test", "gadget", b"\x07" * 16),
        properties=(Element("name", 6, index=True), Element("on", 11)),
        statistics=(Element("hits", 4), Element("ratio", 12), Element("note", 7)),
    )
    from datetime import UTC, datetime

    row = registry_row(schema, StatisticKinds.load(), first_seen=datetime(2026, 1, 1, tzinfo=UTC))
    base: dict[str, Any] = {c: None for c in OUTPUT_SCHEMAS["object_samples"].names}
    base |= {"partition": "p0", "offset": 1, "record_index": 0, "batch_id": 0, "msg_key": "k",
             "dialect": "AM2", "opcode": "g", "package": "org.test", "class_name": "gadget",
             "schema_hash": b"\x07" * 16}  # fmt: skip
    other = base | {"offset": 2, "schema_hash": b"\x08" * 16}
    samples = frame(
        spark,
        pa.Table.from_pylist(
            [
                base | {"ints": [1, 42], "floats": [0.5], "texts": ["q1", "hello"]},
                other | {"ints": [0, 1], "floats": [1.0], "texts": ["x", "y"]},  # other version
            ],
            schema=OUTPUT_SCHEMAS["object_samples"],
        ),
        "object_samples",
    )
    got = wide_view(samples, row).select("offset", "name", "on", "hits", "ratio", "note")
    want = spark.createDataFrame(
        [(1, "q1", True, 42, 0.5, "hello")],
        "offset bigint, name string, on boolean, hits bigint, ratio float, note string",
    )
    assert_df_equality(got, want, ignore_nullable=True)
