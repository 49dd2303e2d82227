"""Silver's DataFrame transforms for readers: wide views of ``object_samples`` per class
version (a column per property and statistic, through the registry's slots) and the
agents' first/last seen over every batch."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.codec.layout import SLOT_FLOATS, SLOT_INTS, SLOT_TEXTS, arrow_type, column_name
from schemas.silver import OBJECT_SAMPLES

# ---------------------------------------------------------------- wide views


def wide_columns(row: Mapping[str, Any]) -> list[tuple[str, str, int, pa.DataType]]:
    """(column, list, slot, Arrow type) of every property and statistic of a registry row."""
    out = []
    for e in [*(row["properties"] or ()), *(row["statistics"] or ())]:
        out.append(
            (column_name(e["name"]), e["slot_kind"], int(e["slot"]), arrow_type(e["type_code"]))
        )
    return out


def wide_view(samples: DataFrame, row: Mapping[str, Any]) -> DataFrame:
    """One class version's samples with a column per property/statistic (for notebooks).

    ``row`` is the class's registry row. Values keep their decoded types
    (bool, ints, float, string...).
    """
    from pyspark.sql.pandas.types import from_arrow_type

    ident = [c for c in OBJECT_SAMPLES.names if c not in (SLOT_INTS, SLOT_FLOATS, SLOT_TEXTS)]
    cols = [F.col(c) for c in ident]
    for name, lst, slot, t in wide_columns(row):
        cols.append(F.col(lst).getItem(slot).cast(from_arrow_type(t)).alias(name))
    flt = (
        (F.col("package") == row["package"])
        & (F.col("class_name") == row["class_name"])
        & (F.col("schema_hash") == F.unhex(F.lit(bytes(row["schema_hash"]).hex())))
    )
    return samples.where(flt).select(*cols)


def agents_view(agents: DataFrame) -> DataFrame:
    """Agents with first/last seen over every batch (the table holds per-batch observations)."""
    return agents.groupBy("agent", "dialect").agg(
        F.min("first_seen").alias("first_seen"),
        F.max("last_seen").alias("last_seen"),
        F.sum("records").alias("records"),
        F.max_by("broker_bank", "last_seen").alias("broker_bank"),
        F.max_by("agent_bank", "last_seen").alias("agent_bank"),
        F.max_by("epoch", "last_seen").alias("epoch"),
    )


def view_name(row: Mapping[str, Any], latest: bool) -> str:
    """``<class>`` for a class's newest version, ``<class>_<hash 8 hex>`` for each version."""
    base = re.sub(r"[^0-9A-Za-z_]", "_", str(row["class_name"]))
    return base if latest else f"{base}_{bytes(row['schema_hash']).hex()[:8]}"


def register_wide_views(spark: Any, samples: DataFrame, registry: Sequence[Mapping[str, Any]]) -> list[str]:
    """Temp views of every table class version, plus ``<class>`` for its newest (last seen).

    For notebooks: ``spark.sql("SELECT name, msgDepth FROM queue")``.
    """
    names: list[str] = []
    newest: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in registry:
        if row["kind"] != "table":
            continue
        wide_view(samples, row).createOrReplaceTempView(view_name(row, latest=False))
        names.append(view_name(row, latest=False))
        key = (row["package"], row["class_name"])
        if key not in newest or row["last_seen"] > newest[key]["last_seen"]:
            newest[key] = row
    for row in newest.values():
        wide_view(samples, row).createOrReplaceTempView(view_name(row, latest=True))
        names.append(view_name(row, latest=True))
    return names
