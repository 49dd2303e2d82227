"""Silver -> gold: statistic rates, object lifecycles, agent liveness (DataFrame -> DataFrame).

Rates pair each sample of a (series, statistic) with the *baseline*: the
previous sample that was kept (``pair_values``). Samples are ordered by sample
time (``update_ns``), never by receive time; a sample at or before the
baseline (a twin, a duplicate, a late one) makes no interval; an interval
shorter than ``min_interval_s`` is skipped and the baseline stays (so no
delta is lost: the next interval is longer, as qpid-queue-stats does);
resets (agent restart, object re-created, gap, counter decrease) give a row
with a NULL rate and the reason. The baseline of each series is the state
carried between micro-batches (table ``rate_state``): the state rows enter
the same sequential scan first, so a stream and one batch over the same
samples give the same rows.

The scan is sequential per series, so it runs in ``mapInArrow`` over
partitions hashed by series (each partition sorted by series then time) with
a small numba kernel: no Python per sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from schemas.gold import AGENT_LIVENESS, RATE_STATE
from schemas.tables import spark_schema

RESETS = ("", "counter_decreased", "recreated", "agent_restart", "gap")
SERIES_KEYS = ("agent", "package", "class_name", "series", "statistic")
NS = 1_000_000_000


@dataclass(frozen=True)
class RateRules:
    """Pairing rules. ``state_ttl_s``: a series idle this long (sample time) leaves the state."""

    min_interval_s: float = 1.0
    max_gap_s: float = 300.0
    state_ttl_s: float = 86400.0


# ------------------------------------------------------------------ identity


def object_id() -> Column:
    """The dialect's object id as text: V2 ``epoch:object_name``; AM2 flags-epoch-banks-number;
    AM1 boot-bank-number. An agent restart renumbers objects (new epoch / boot sequence)."""
    v2 = F.concat_ws(":", F.col("epoch").cast("string"), F.col("object_name"))
    am2 = F.concat_ws(
        "-", *(F.coalesce(F.col(c).cast("string"), F.lit("")) for c in
               ("flags", "epoch", "broker_bank", "agent_bank", "object_num"))
    )  # fmt: skip
    am1 = F.concat_ws(
        "-", *(F.coalesce(F.col(c).cast("string"), F.lit("")) for c in ("boot_seq", "bank", "object_num"))
    )  # fmt: skip
    return (
        F.when(F.col("dialect") == "V2", v2).when(F.col("dialect") == "AM2", am2).otherwise(am1)
    )


def generation() -> Column:
    """The agent boot an object id belongs to: epoch (AM2, V2) or boot sequence (AM1).

    0 is no generation: qpidd gives the objects it makes at start-up (broker,
    vhost, system...) ids with epoch 0 beside epoch-1 queues, and they are not
    renumbered by a restart."""
    g = F.coalesce(F.col("epoch"), F.col("boot_seq").cast("long"))
    return F.when(g != 0, g)


def identify(samples: DataFrame, known_keys: DataFrame | None = None) -> DataFrame:
    """Silver samples + ``object_id``, ``generation``, and ``index_key`` filled in.

    Samples that carry statistics only (AM1/AM2 'i', V2 updates without
    properties) have no index key: it comes from the object's latest
    property sample in this batch, else from ``known_keys`` (agent,
    object_id, index_key: the lifecycle table, i.e. earlier batches).
    ``series`` is the index key when known, else the object id.
    """
    s = samples.where(F.col("agent").isNotNull()).withColumns(
        {
            "object_id": object_id(),
            "generation": generation(),
            "has_props": F.col("index_key").isNotNull(),  # before the key is filled in
        }
    )
    here = (
        s.where(F.col("index_key").isNotNull())
        .groupBy("agent", "object_id")
        .agg(F.max_by("index_key", "update_ns").alias("_key_here"))
    )
    s = s.join(here, ["agent", "object_id"], "left")
    if known_keys is not None:
        known = known_keys.groupBy("agent", "object_id").agg(
            F.max("index_key").alias("_key_known")
        )
        s = s.join(known, ["agent", "object_id"], "left")
        resolved = F.coalesce("index_key", "_key_here", "_key_known")
    else:
        resolved = F.coalesce("index_key", "_key_here")
    s = s.withColumn("index_key", resolved).drop("_key_here", "_key_known")
    return s.withColumn("series", F.coalesce(series_key(), "object_id"))


def series_key() -> Column:
    """The index key with AM2 object references made restart-proof.

    AM2 index keys hold references (e.g. a queue's ``vhostRef``) as object ids,
    which carry the agent's epoch: after a restart the same queue's key would
    differ. The epoch part of id-shaped values is blanked, so the series
    continues and its first interval after the restart says ``agent_restart``.
    """
    am2 = F.regexp_replace(
        F.col("index_key"), r'"([0-9]+)-[0-9]+-([0-9]+)-([0-9]+)-([0-9]+)"', '"$1-*-$2-$3-$4"'
    )
    return F.when(F.col("dialect") == "AM2", am2).otherwise(F.col("index_key"))


def _ts(ns: Column) -> Column:
    """QMF ns -> timestamp, floored to microseconds in integer arithmetic (a double
    division would round ns values of 2026 to the wrong microsecond)."""
    us = (ns - F.pmod(ns, F.lit(1000))).cast("decimal(20,0)") / F.lit(1000)
    return F.timestamp_micros(us.cast("long"))


# ------------------------------------------------------------------ statistic values


def statistic_defs(spark: SparkSession, registry: pa.Table) -> DataFrame:
    """Numeric statistics of every class version: (package, class_name, schema_hash,
    statistic, kind, slot_kind, slot), from the schema registry table."""
    rows = []
    for r in registry.select(["package", "class_name", "schema_hash", "statistics"]).to_pylist():
        for e in r["statistics"] or ():
            kind = e["statistic_kind"] or "gauge"
            if kind == "text" or e["slot_kind"] not in ("ints", "floats"):
                continue
            rows.append(
                (r["package"], r["class_name"], bytes(r["schema_hash"]), e["name"], kind,
                 e["slot_kind"], int(e["slot"]))
            )  # fmt: skip
    schema = (
        "package string, class_name string, schema_hash binary, statistic string, "
        "kind string, slot_kind string, slot int"
    )
    return spark.createDataFrame(rows, schema).dropDuplicates(
        ["package", "class_name", "schema_hash", "statistic"]
    )


def property_defs(spark: SparkSession, registry: pa.Table) -> DataFrame:
    """Properties of every class version: (package, class_name, schema_hash, property, slot_kind, slot)."""
    rows = []
    for r in registry.select(["package", "class_name", "schema_hash", "properties"]).to_pylist():
        for e in r["properties"] or ():
            if e["slot_kind"] in ("ints", "floats", "texts"):
                rows.append(
                    (r["package"], r["class_name"], bytes(r["schema_hash"]), e["name"],
                     e["slot_kind"], int(e["slot"]))
                )  # fmt: skip
    schema = (
        "package string, class_name string, schema_hash binary, property string, "
        "slot_kind string, slot int"
    )
    return spark.createDataFrame(rows, schema).dropDuplicates(
        ["package", "class_name", "schema_hash", "property"]
    )


_VALUE_COLS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "series",
    "statistic", "kind", "update_ns", "create_ns", "generation", "value",
)  # fmt: skip
# Arrival order (silver identity): of two samples with the same sample time, the first
# delivered is kept (a 'g' answer and an 'i' publish of one instant may differ in their
# watermarks), as a stream that met it in an earlier micro-batch would.
_ARRIVAL = ("partition", "offset", "record_index")


def statistic_values(identified: DataFrame, defs: DataFrame) -> DataFrame:
    """One row per (sample, numeric statistic it carries): the value as a double.

    ``deleted``: the sample reports the object deleted (its series ends there).
    """
    j = identified.where(F.col("update_ns").isNotNull() & (F.col("update_ns") > 0)).join(
        F.broadcast(defs), ["package", "class_name", "schema_hash"]
    )
    slot = F.col("slot") + 1
    value = F.when(
        F.col("slot_kind") == "ints", F.element_at("ints", slot).cast("double")
    ).otherwise(F.element_at("floats", slot))
    return (
        j.withColumn("value", value)
        .where(F.col("value").isNotNull())
        .withColumn("deleted", F.coalesce(F.col("delete_ns"), F.lit(0)) != 0)
        .withColumn("is_state", F.lit(False))
        .select(*_VALUE_COLS, *_ARRIVAL, "deleted", "is_state")
    )


def rekey_state(state: DataFrame, identified: DataFrame) -> DataFrame:
    """State rows of series keyed by an object id whose index key is now known (its
    statistics came before its properties, in an earlier micro-batch) move to the
    index-key series, where one batch over the same samples would have put them."""
    keys = (
        identified.where(F.col("index_key").isNotNull())
        .groupBy("agent", "object_id")
        .agg(F.max("index_key").alias("_k"))
    )
    s = state.join(keys, ["agent", "object_id"], "left").withColumn(
        "_o", F.col("index_key").isNull() & F.col("_k").isNotNull()
    )
    s = s.withColumn("index_key", F.when(F.col("_o"), F.col("_k")).otherwise(F.col("index_key")))
    return s.withColumn(
        "series", F.when(F.col("_o"), series_key()).otherwise(F.col("series"))
    ).select(*RATE_STATE.names)


def state_values(state: DataFrame) -> DataFrame:
    """The ``rate_state`` rows in the shape of ``statistic_values`` (baselines)."""
    return state.withColumns(
        {
            "partition": F.lit(None).cast("string"),
            "offset": F.lit(None).cast("long"),
            "record_index": F.lit(None).cast("int"),
            "deleted": F.lit(False),
            "is_state": F.lit(True),
        }
    ).select(*_VALUE_COLS, *_ARRIVAL, "deleted", "is_state")


# ------------------------------------------------------------------ pairing


@njit(cache=True)
def _pair_kernel(
    newgrp: np.ndarray,
    t: np.ndarray,
    val: np.ndarray,
    gen: np.ndarray,
    create: np.ndarray,
    obj: np.ndarray,
    is_state: np.ndarray,
    is_counter: np.ndarray,
    deleted: np.ndarray,
    min_ns: int,
    gap_ns: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = len(t)
    base_out = np.empty(n, np.int64)
    cur_out = np.empty(n, np.int64)
    reason = np.empty(n, np.int8)
    keep = np.zeros(n, np.bool_)
    k = 0
    base = -1
    for i in range(n):
        if newgrp[i]:
            if base >= 0:
                keep[base] = True
            base = -1
        if base < 0:
            if not deleted[i]:
                base = i
            continue
        if t[i] <= t[base]:
            continue  # twin, duplicate, or older than the baseline
        dt = t[i] - t[base]
        r = 0
        if gen[i] >= 0 and gen[base] >= 0 and gen[i] != gen[base]:
            r = 3
        elif create[i] != create[base] or obj[i] != obj[base]:
            r = 2
        elif dt > gap_ns:
            r = 4
        elif is_counter[i] and val[i] < val[base]:
            r = 1
        if r == 0 and dt < min_ns:
            continue
        base_out[k] = base
        cur_out[k] = i
        reason[k] = r
        k += 1
        base = -1 if deleted[i] else i
    if base >= 0:
        keep[base] = True
    return base_out[:k], cur_out[:k], reason[:k], keep


PAIRS = pa.schema(
    [
        pa.field("out", pa.string(), nullable=False),  # rate | state
        *(f for f in RATE_STATE),
        pa.field("start_ns", pa.int64()),
        pa.field("prev_value", pa.float64()),
        pa.field("reset", pa.string()),
    ]
)
_COUNTER_KINDS = ("counter",)


def _pair_table(t: pa.Table, rules: RateRules) -> pa.Table:
    """The sequential scan of one partition (any set of whole series)."""
    if t.num_rows == 0:
        return PAIRS.empty_table()
    t = t.sort_by(
        [(k, "ascending") for k in SERIES_KEYS]
        + [("is_state", "descending"), ("update_ns", "ascending")]
        + [(k, "ascending") for k in _ARRIVAL]
    )
    key = pc.binary_join_element_wise(*(t.column(k) for k in SERIES_KEYS), "\x1f")
    keys = np.asarray(key.to_numpy(zero_copy_only=False), dtype=object)
    newgrp = np.ones(len(keys), np.bool_)
    if len(keys) > 1:
        newgrp[1:] = keys[1:] != keys[:-1]

    def i64(name: str, fill: int) -> np.ndarray:
        return np.asarray(pc.fill_null(t.column(name), fill).to_numpy(), np.int64)

    obj = np.asarray(
        pc.dictionary_encode(t.column("object_id")).combine_chunks().indices.to_numpy(), np.int64
    )
    is_counter = np.asarray(pc.is_in(t.column("kind"), pa.array(_COUNTER_KINDS)).to_numpy(), np.bool_)
    base, cur, reason, keep = _pair_kernel(
        newgrp,
        i64("update_ns", 0),
        np.asarray(t.column("value").to_numpy(), np.float64),
        i64("generation", -1),
        i64("create_ns", 0),
        obj,
        np.asarray(t.column("is_state").to_numpy(), np.bool_),
        is_counter,
        np.asarray(t.column("deleted").to_numpy(), np.bool_),
        int(rules.min_interval_s * NS),
        int(rules.max_gap_s * NS),
    )
    state_cols = RATE_STATE.names
    rates = t.take(pa.array(cur)).select(state_cols)
    before = t.take(pa.array(base))
    reset_names = np.array([None, *RESETS[1:]], dtype=object)[reason.astype(np.int64)]
    rates = (
        rates.append_column("start_ns", before.column("update_ns"))
        .append_column("prev_value", before.column("value"))
        .append_column("reset", pa.array(reset_names, pa.string()))
    )
    rates = rates.add_column(0, "out", pa.array(["rate"] * rates.num_rows, pa.string()))
    idx = np.flatnonzero(keep)
    st = t.take(pa.array(idx)).select(state_cols)
    if st.num_rows and rules.state_ttl_s > 0:
        horizon = int(pc.max(t.column("update_ns")).as_py()) - int(rules.state_ttl_s * NS)
        st = st.filter(pc.greater_equal(st.column("update_ns"), horizon))
    n = st.num_rows
    st = (
        st.append_column("start_ns", pa.nulls(n, pa.int64()))
        .append_column("prev_value", pa.nulls(n, pa.float64()))
        .append_column("reset", pa.nulls(n, pa.string()))
    )
    st = st.add_column(0, "out", pa.array(["state"] * n, pa.string()))
    return pa.concat_tables([rates.cast(PAIRS), st.cast(PAIRS)])


def pair_values(values: DataFrame, rules: RateRules, partitions: int | None = None) -> DataFrame:
    """Statistic values (new samples and state baselines) -> PAIRS rows: one ``rate`` row per
    interval and one ``state`` row per series baseline after the scan."""
    n = partitions or int(values.sparkSession.conf.get("spark.sql.shuffle.partitions") or "4")

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = list(batches)
        if not parts:
            return
        yield from _pair_table(pa.Table.from_batches(parts), rules).to_batches()

    return values.repartition(n, "agent", "series").mapInArrow(scan, spark_schema(PAIRS))


def rates_from_pairs(pairs: DataFrame, batch_id: int) -> DataFrame:
    """The ``rate`` rows of ``pair_values`` as STATISTIC_RATES rows."""
    r = pairs.where(F.col("out") == "rate")
    length = (F.col("update_ns") - F.col("start_ns")) / F.lit(float(NS))
    counter = F.col("kind") == "counter"
    delta = F.when(counter, F.col("value") - F.col("prev_value"))
    gauge = F.col("kind") == "gauge"
    return r.select(
        "agent", "dialect", "package", "class_name", "object_id", "index_key", "statistic", "kind",
        F.col("start_ns"), F.col("update_ns").alias("end_ns"),
        _ts(F.col("start_ns")).alias("start_time"),
        _ts(F.col("update_ns")).alias("end_time"),
        length.alias("length_s"),
        "prev_value", "value",
        F.when(F.col("reset").isNull(), delta).alias("delta"),
        F.when(F.col("reset").isNull() & counter, delta / length).alias("rate"),
        F.when(gauge, F.least("prev_value", "value")).alias("value_min"),
        F.when(gauge, F.greatest("prev_value", "value")).alias("value_max"),
        "reset",
        F.lit(batch_id).cast("long").alias("batch_id"),
    )  # fmt: skip


def state_from_pairs(pairs: DataFrame, identified: DataFrame | None = None) -> DataFrame:
    """The ``state`` rows of ``pair_values`` as RATE_STATE rows, minus every series of the
    objects ``identified`` (the batch's samples) reports deleted: also a series keyed by
    the object id (samples seen before the object's index key was known)."""
    st = pairs.where(F.col("out") == "state").select(*RATE_STATE.names)
    if identified is None:
        return st
    gone = identified.where(F.coalesce(F.col("delete_ns"), F.lit(0)) != 0).select(
        "agent", "object_id"
    )
    return st.join(gone.distinct(), ["agent", "object_id"], "left_anti")


# ------------------------------------------------------------------ lifecycles


def _slot_text() -> Column:
    i = F.col("slot") + 1
    return (
        F.when(F.col("slot_kind") == "ints", F.element_at("ints", i).cast("string"))
        .when(F.col("slot_kind") == "floats", F.element_at("floats", i).cast("string"))
        .otherwise(F.element_at("texts", i))
    )


def object_updates(identified: DataFrame, props: DataFrame) -> DataFrame:
    """What one batch says about each object (agent, object_id, create_ns): first/last seen,
    sample count, delete time, and the properties of its latest sample that carried them."""
    s = identified.where(F.col("update_ns").isNotNull() & (F.col("update_ns") > 0)).withColumn(
        "create_ns", F.coalesce(F.col("create_ns"), F.lit(0))
    )
    key = ["agent", "object_id", "create_ns"]
    agg = s.groupBy(*key).agg(
        F.first("dialect").alias("dialect"),
        F.first("package").alias("package"),
        F.first("class_name").alias("class_name"),
        F.max("index_key").alias("index_key"),
        F.max("generation").alias("generation"),
        F.min("update_ns").alias("first_seen_ns"),
        F.max("update_ns").alias("last_seen_ns"),
        F.count(F.lit(1)).alias("samples"),
        F.max(F.when(F.col("delete_ns") != 0, F.col("delete_ns"))).alias("delete_ns"),
    )
    with_props = s.where(F.col("has_props"))
    last = with_props.groupBy(*key).agg(
        F.max_by(F.struct("schema_hash", "ints", "floats", "texts", "update_ns"), "update_ns").alias("p")
    )
    exploded = last.select(*key, "p.*").join(
        F.broadcast(props.drop("package", "class_name")), ["schema_hash"]
    )
    pmap = (
        exploded.withColumn("v", _slot_text())
        .groupBy(*key)
        .agg(
            F.map_from_entries(F.collect_list(F.struct("property", "v"))).alias("properties"),
            F.max("update_ns").alias("properties_ns"),
        )
    )
    return agg.join(pmap, key, "left")




def merge_lifecycles(
    existing: DataFrame, updates: DataFrame, liveness: DataFrame, batch_id: int
) -> DataFrame:
    """Existing lifecycle rows + a batch's object updates -> every object's row, state recomputed.

    An object is *lost* when its agent restarted (an object of a later
    generation of the same agent was seen: ``ended_at`` = the first sample of
    the next generation) or its agent is down now (``liveness``: the agent's
    latest up interval is ``down``; ``ended_at`` = its ``down_at``) unless it
    was seen after that. Deleted wins over lost.
    """
    key = ["agent", "object_id", "create_ns"]
    e = existing.select(
        *key, "dialect", "package", "class_name", "index_key", "generation", "first_seen_ns",
        "last_seen_ns", "samples", F.col("deleted_at"), "properties", "properties_ns",
    )  # fmt: skip
    u = updates.select(
        *key,
        F.col("dialect").alias("u_dialect"), F.col("package").alias("u_package"),
        F.col("class_name").alias("u_class"), F.col("index_key").alias("u_index"),
        F.col("generation").alias("u_gen"), F.col("first_seen_ns").alias("u_first"),
        F.col("last_seen_ns").alias("u_last"), F.col("samples").alias("u_samples"),
        F.col("delete_ns").alias("u_delete"), F.col("properties").alias("u_props"),
        F.col("properties_ns").alias("u_props_ns"),
    )  # fmt: skip
    newer_props = F.col("u_props_ns").isNotNull() & (
        F.col("properties_ns").isNull() | (F.col("u_props_ns") > F.col("properties_ns"))
    )
    m = e.join(u, key, "full_outer").select(
        *key,
        F.coalesce("dialect", "u_dialect").alias("dialect"),
        F.coalesce("package", "u_package").alias("package"),
        F.coalesce("class_name", "u_class").alias("class_name"),
        F.coalesce("u_index", "index_key").alias("index_key"),
        F.coalesce("generation", "u_gen").alias("generation"),
        F.least("first_seen_ns", "u_first").alias("first_seen_ns"),
        F.greatest("last_seen_ns", "u_last").alias("last_seen_ns"),
        (F.coalesce("samples", F.lit(0)) + F.coalesce("u_samples", F.lit(0))).alias("samples"),
        F.coalesce(F.col("deleted_at"), _ts(F.col("u_delete"))).alias("deleted_at"),
        F.when(newer_props, F.col("u_props")).otherwise(F.col("properties")).alias("properties"),
        F.when(newer_props, F.col("u_props_ns")).otherwise(F.col("properties_ns")).alias("properties_ns"),
    )  # fmt: skip
    # Agent restarts: the first sample of each generation per agent.
    gens = m.where(F.col("generation").isNotNull()).groupBy("agent", "generation").agg(
        F.min("first_seen_ns").alias("g_start")
    )
    nxt = (
        m.select("agent", "object_id", "create_ns", F.col("generation").alias("own"))
        .join(gens.withColumnRenamed("generation", "g"), "agent")
        .where(F.col("g") > F.col("own"))
        .groupBy("agent", "object_id", "create_ns")
        .agg(F.min("g_start").alias("restart_ns"))
    )
    w = Window.partitionBy("agent").orderBy(F.col("up_start_ns").desc())
    down = (
        liveness.withColumn("_r", F.row_number().over(w))
        .where((F.col("_r") == 1) & (F.col("state") == "down"))
        .select("agent", F.col("down_at").alias("agent_down_at"))
    )
    m = m.join(nxt, key, "left").join(F.broadcast(down), "agent", "left")
    last_seen = _ts(F.col("last_seen_ns"))
    restarted = F.col("restart_ns").isNotNull()
    is_down = F.col("agent_down_at").isNotNull() & (F.col("agent_down_at") >= last_seen)
    state = (
        F.when(F.col("deleted_at").isNotNull(), "deleted")
        .when(restarted | is_down, "lost")
        .otherwise("live")
    )
    reason = (
        F.when(F.col("deleted_at").isNotNull(), "deleted")
        .when(restarted, "agent_restart")
        .when(is_down, "agent_down")
    )
    ended = (
        F.when(F.col("deleted_at").isNotNull(), F.col("deleted_at"))
        .when(restarted, _ts(F.col("restart_ns")))
        .when(is_down, F.col("agent_down_at"))
    )
    return m.select(
        "agent", "dialect", "package", "class_name", "object_id", "index_key", "create_ns",
        "generation",
        F.when(F.col("create_ns") != 0, _ts(F.col("create_ns"))).alias("created_at"),
        "deleted_at",
        _ts(F.col("first_seen_ns")).alias("first_seen"), last_seen.alias("last_seen"),
        "first_seen_ns", "last_seen_ns", "samples", "properties", "properties_ns",
        state.alias("state"), reason.alias("end_reason"), ended.alias("ended_at"),
        F.lit(batch_id).cast("long").alias("batch_id"),
    )  # fmt: skip


def changed_rows(new: DataFrame, existing: DataFrame) -> DataFrame:
    """Rows of ``new`` that differ from ``existing`` (ignoring ``batch_id``): what a MERGE needs."""
    cols = [c for c in new.columns if c != "batch_id"]
    # Maps cannot be compared: compare their JSON text.
    def norm(df: DataFrame) -> DataFrame:
        return df.select(
            *[F.to_json(F.col(c)).alias(c) if c == "properties" else F.col(c) for c in cols]
        )

    diff = norm(new).exceptAll(norm(existing)).select("agent", "object_id", "create_ns")
    return new.join(diff.distinct(), ["agent", "object_id", "create_ns"], "left_semi")


# ------------------------------------------------------------------ agent liveness


@dataclass(frozen=True)
class LivenessRules:
    """``missed``: heartbeats missed before an agent is down (qpid's console: 3).
    v1 'h' carries neither agent nor interval: ``v1_agent`` names the broker agent
    they stand for, ``v1_interval_s`` is the broker's publish interval."""

    missed: int = 3
    v1_agent: str = "1.0"
    v1_interval_s: float = 10.0


def heartbeat_rows(heartbeats: DataFrame, rules: LivenessRules) -> DataFrame:
    """Silver heartbeats -> (agent, dialect, ts_ns, epoch, interval_s)."""
    interval = F.get_json_object("attributes", "$._heartbeat_interval").cast("double")
    epoch = F.get_json_object("attributes", "$._epoch").cast("long")
    return heartbeats.where(F.col("timestamp_ns").isNotNull() & (F.col("timestamp_ns") > 0)).select(
        F.coalesce(
            F.col("agent"), F.when(F.col("dialect") != "V2", F.lit(rules.v1_agent))
        ).alias("agent"),
        "dialect",
        F.col("timestamp_ns").alias("ts_ns"),
        epoch.alias("epoch"),
        F.coalesce(interval, F.lit(rules.v1_interval_s)).alias("interval_s"),
    ).where(F.col("agent").isNotNull())


def _ts_py(ns: int) -> pd.Timestamp:
    return pd.Timestamp(ns // 1000, unit="us", tz="UTC")


def liveness_scan(
    beats: pd.DataFrame,
    current: Mapping[str, Any] | None,
    now_ns: int,
    rules: LivenessRules,
    batch_id: int,
) -> list[dict[str, Any]]:
    """One agent's heartbeats (any order, duplicates allowed) continuing its open up interval."""
    out: list[dict[str, Any]] = []
    cur = dict(current) if current is not None else None
    for ts, epoch, iv, dialect in sorted(
        zip(beats["ts_ns"], beats["epoch"], beats["interval_s"], beats["dialect"], strict=True),
        key=lambda x: int(x[0]),
    ):
        ts = int(ts)
        ep = None if epoch is None or pd.isna(epoch) else int(epoch)
        fresh = {
            "agent": beats["agent"].iloc[0], "dialect": dialect, "epoch": ep, "up_start_ns": ts,
            "last_heartbeat_ns": ts, "heartbeats": 1, "interval_s": float(iv),
            "state": "up", "started_by": "first", "down_at": None, "next_up": None,
        }  # fmt: skip
        if cur is None:
            cur = fresh
            continue
        if ts <= int(cur["last_heartbeat_ns"]):
            continue
        limit = int(rules.missed * float(cur["interval_s"]) * NS)
        if ep is not None and cur["epoch"] is not None and ep != int(cur["epoch"]):
            cur.update(state="restarted", down_at=None, next_up=_ts_py(ts))
            out.append(cur)
            cur = {**fresh, "started_by": "restart"}
        elif ts - int(cur["last_heartbeat_ns"]) > limit:
            cur.update(
                state="down", down_at=_ts_py(int(cur["last_heartbeat_ns"]) + limit), next_up=_ts_py(ts)
            )
            out.append(cur)
            cur = {**fresh, "started_by": "recovered"}
        else:
            cur.update(last_heartbeat_ns=ts, heartbeats=int(cur["heartbeats"]) + 1, interval_s=float(iv))
            if cur["epoch"] is None and ep is not None:
                cur["epoch"] = ep
    if cur is not None:
        limit = int(rules.missed * float(cur["interval_s"]) * NS)
        if now_ns - int(cur["last_heartbeat_ns"]) > limit:
            cur.update(state="down", down_at=_ts_py(int(cur["last_heartbeat_ns"]) + limit), next_up=None)
        else:
            cur.update(state="up", down_at=None, next_up=None)
        out.append(cur)
    for r in out:
        r["up_start"] = _ts_py(int(r["up_start_ns"]))
        r["last_heartbeat"] = _ts_py(int(r["last_heartbeat_ns"]))
        r["batch_id"] = batch_id
    return out


def agent_liveness(
    beats: DataFrame, current: DataFrame, now_ns: int, rules: LivenessRules, batch_id: int
) -> DataFrame:
    """Heartbeat rows (``heartbeat_rows``) + each agent's open up interval (``current``: its
    latest AGENT_LIVENESS row) -> the rows to upsert, every agent re-judged at ``now_ns``
    (the latest heartbeat time seen: event time, so a replay or a backfill judges alike)."""
    names = AGENT_LIVENESS.names

    def fn(b: pd.DataFrame, c: pd.DataFrame) -> pd.DataFrame:
        cur = None if c.empty else c.sort_values("up_start_ns").iloc[-1].to_dict()
        if b.empty and cur is None:
            return pd.DataFrame(columns=names)
        rows = liveness_scan(b, cur, now_ns, rules, batch_id)
        return pd.DataFrame(rows, columns=names)

    cur = current.select(*names)
    return (
        beats.groupBy("agent")
        .cogroup(cur.groupBy("agent"))
        .applyInPandas(fn, spark_schema(AGENT_LIVENESS))
    )


def latest_liveness(liveness: DataFrame) -> DataFrame:
    """Each agent's latest up interval (the open one)."""
    w = Window.partitionBy("agent").orderBy(F.col("up_start_ns").desc())
    return liveness.withColumn("_r", F.row_number().over(w)).where(F.col("_r") == 1).drop("_r")
