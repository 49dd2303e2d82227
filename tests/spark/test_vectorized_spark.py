"""The vectorized decoder inside Spark: ``mapInArrow`` with ``arrow_mapper`` gives the plain-Python rows."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pipeline.codec.capture import read_capture
from pipeline.codec.layout import sample_schema
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.vectorized import arrow_mapper, decode_content
from schemas.tables import spark_schema

pytestmark = pytest.mark.spark


def test_map_in_arrow_decodes_queue_samples_like_plain_python(
    spark: SparkSession, shared_dir: str
) -> None:
    msgs = list(read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")))
    registry = SchemaRegistry()
    for m in msgs:
        m.decode(registry)  # every schema the capture announces
    content = [m for m in msgs if m.body[:3] == b"AM2" and m.body[3:4] in (b"c", b"i", b"g")]
    bodies = pa.table(
        {
            "msg_key": [f"m{i}" for i in range(len(content))],
            "routing_key": [m.routing_key for m in content],
            "body": pa.array([m.body for m in content], pa.binary()),
        }
    )
    key = next(s.key for s in registry if s.key.name == "queue")
    schema = registry.get(key)
    assert schema is not None

    df = spark.createDataFrame(bodies).repartition(2)
    out = df.mapInArrow(arrow_mapper(registry, key), spark_schema(sample_schema(schema)))
    got = out.orderBy("msg_key", "record_index").toArrow()

    want = decode_content(bodies, registry).samples[key]
    want = want.sort_by([("msg_key", "ascending"), ("record_index", "ascending")])
    assert got.column_names == want.column_names
    assert got.num_rows == want.num_rows == 177  # queue samples in the capture (summary)
    assert got.to_pylist() == want.to_pylist()
