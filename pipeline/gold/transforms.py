"""Silver -> gold: statistic rates, object lifecycles, agent liveness (DataFrame -> DataFrame).

Gold's micro-batches are small (one publish interval of every object: a few
thousand samples, a million statistic values at 10,000 queues) and its work
is joins against small tables (rate state, lifecycles, liveness) plus one
sequential scan per series. In Spark that was ~15 jobs and 17-20 s per batch
whatever its size; here the batch is collected once as Arrow and every step
is a vectorized polars / numpy function on the driver (tenths of a second per
batch, ``docs/performance.md``). The functions take and return polars
DataFrames; the writer (``pipeline.gold``) reads and commits Delta with
Arrow.

Rates pair each sample of a (series, statistic) with the *baseline*: the
previous sample that was kept (``pair_values``). Samples are ordered by sample
time (``update_ns``), never by receive time; a sample at or before the
baseline (a twin, a duplicate, a late one) makes no interval; an interval
shorter than ``min_interval_s`` less the agent's jitter is not made: the
sample waits (pending) and the baseline stays, so no delta is lost: a later
sample makes a longer interval (as qpid-queue-stats does), and a series that
went quiet (its agent published a later cycle without it) emits the pending
sample by itself; a delete closes its interval however short. Resets (agent
restart, object re-created, gap, counter decrease) give a row with a NULL
rate and the reason. The baseline of each series is the state
carried between micro-batches (table ``rate_state``): the state rows enter
the same sequential scan first, so a stream and one batch over the same
samples give the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

from pipeline.gold.names import fleet_broker, ref_positions, with_names
from schemas.gold import AGENT_LIVENESS, RATE_STATE
from schemas.tables import DEFAULT_BROKER

RESETS = ("", "counter_decreased", "recreated", "agent_restart", "gap")
SERIES_KEYS = ("agent", "package", "class_name", "series", "statistic")
LIFECYCLE_KEYS = ("agent", "object_id", "create_ns")
NS = 1_000_000_000
_TS = pl.Datetime("us", "UTC")
# The agent of a v1 heartbeat (it names none): qpidd's broker agent, bank 1.0.
V1_AGENT = "1.0"


@dataclass(frozen=True)
class RateRules:
    """Pairing rules. An interval shorter than ``min_interval_s - jitter_s`` is not made (the
    agent's own publish jitter: qpidd's 1 s publishes come 0.999-1.001 s apart, and a 2 s
    interval from merging two would halve the resolution). ``state_ttl_s``: a series idle
    this long (sample time) leaves the state."""

    min_interval_s: float = 1.0
    max_gap_s: float = 300.0
    state_ttl_s: float = 86400.0
    jitter_s: float = 0.1

    @property
    def min_ns(self) -> int:
        """The shortest interval made, in ns."""
        return max(0, round((self.min_interval_s - self.jitter_s) * NS))


def frame(table: pa.Table) -> pl.DataFrame:
    """An Arrow table (a Delta read, a collected batch) as a polars DataFrame."""
    out = pl.from_arrow(table, rechunk=False)
    assert isinstance(out, pl.DataFrame)
    return out


def fleet_agent() -> pl.Expr:
    """Gold's agent id of an input row: ``<broker_name>/<agent>`` for a named broker of a
    fleet, else the agent as silver has it.

    Why: agent ids are unique within one broker only (qpidd's v1 agent is ``1.0`` on
    every broker; AM2 object ids repeat too), and gold keys every series, lifecycle and
    liveness interval by agent. A v1 heartbeat's agent (it names none) is ``V1_AGENT``
    first. Rows of the unnamed broker (``default``, or written before fleets) keep their
    agent, so a single-broker lake reads as before.
    """
    name = pl.col("broker_name")
    named = name.is_not_null() & (name != DEFAULT_BROKER)
    v1_beat = (pl.col("source") == "heartbeat") & (pl.col("dialect") != "V2")
    own = pl.coalesce(pl.col("agent"), pl.when(v1_beat).then(pl.lit(V1_AGENT)))
    qualified = pl.concat_str([name, pl.lit("/"), own])
    return pl.when(named & own.is_not_null()).then(qualified).otherwise(pl.col("agent"))


def ts(ns: pl.Expr) -> pl.Expr:
    """QMF ns -> timestamp, floored to microseconds in integer arithmetic."""
    return (ns // 1000).cast(pl.Int64).cast(_TS)


# ------------------------------------------------------------------ identity


def _text(c: str) -> pl.Expr:
    return pl.col(c).cast(pl.Utf8)


def object_id() -> pl.Expr:
    """The dialect's object id as text: V2 ``epoch:object_name``; AM2 flags-epoch-banks-number;
    AM1 boot-bank-number. An agent restart renumbers objects (new epoch / boot sequence)."""
    v2 = pl.concat_str([_text("epoch"), pl.col("object_name")], separator=":", ignore_nulls=True)
    am2 = pl.concat_str(
        [_text(c).fill_null("") for c in ("flags", "epoch", "broker_bank", "agent_bank", "object_num")],
        separator="-",
    )
    am1 = pl.concat_str(
        [_text(c).fill_null("") for c in ("boot_seq", "bank", "object_num")], separator="-"
    )
    dialect = pl.col("dialect")
    return pl.when(dialect == "V2").then(v2).when(dialect == "AM2").then(am2).otherwise(am1)


def generation() -> pl.Expr:
    """The agent boot an object id belongs to: epoch (AM2, V2) or boot sequence (AM1).

    0 is no generation: qpidd gives the objects it makes at start-up (broker,
    vhost, system...) ids with epoch 0 beside epoch-1 queues, and they are not
    renumbered by a restart."""
    g = pl.coalesce(pl.col("epoch").cast(pl.Int64), pl.col("boot_seq").cast(pl.Int64))
    return pl.when(g != 0).then(g)


def series_key() -> pl.Expr:
    """The index key with AM2 object references made restart-proof.

    AM2 index keys hold references (e.g. a queue's ``vhostRef``) as object ids,
    which carry the agent's epoch: after a restart the same queue's key would
    differ. The epoch part of id-shaped values is blanked, so the series
    continues and its first interval after the restart says ``agent_restart``.
    V2 references are maps: qpidd writes ``_agent_epoch`` into those of objects
    made after its start (a binding's queueRef) and none into start-up ones; it
    is dropped (``V2_REF_EPOCH``) for the same reason.
    """
    am2 = pl.col("index_key").str.replace_all(AM2_REF, AM2_REF_BLANK)
    v2 = pl.col("index_key").str.replace_all(V2_REF_EPOCH, "")
    return (
        pl.when(pl.col("dialect") == "AM2")
        .then(am2)
        .when(pl.col("dialect") == "V2")
        .then(v2)
        .otherwise(pl.col("index_key"))
    )


# Object references inside an index key (JSON text), and what series_key makes of them.
AM2_REF = r'"([0-9]+)-[0-9]+-([0-9]+)-([0-9]+)-([0-9]+)"'
AM2_REF_BLANK = r'"${1}-*-${2}-${3}-${4}"'
V2_REF_EPOCH = r'\\"_agent_epoch\\":[0-9]+,'


def sample_time() -> pl.Expr:
    """When a sample's values were read: its update time, or its delete time where that is
    later. qpidd's last record of a deleted object carries the delete time and the
    statistics read at the deletion, but keeps the update time of its previous publish:
    by that time it would be a twin of the previous sample, and its final counts lost."""
    upd = pl.col("update_ns")
    gone = pl.col("delete_ns").fill_null(0)
    return pl.when(gone > upd.fill_null(0)).then(gone).otherwise(upd)


def identify(samples: pl.DataFrame, known_keys: pl.DataFrame | None = None) -> pl.DataFrame:
    """Silver samples + ``object_id``, ``generation``, and ``index_key`` filled in.

    Samples that carry statistics only (AM1/AM2 'i', V2 updates without
    properties) have no index key: it comes from the object's latest
    property sample in this batch, else from ``known_keys`` (agent,
    object_id, index_key: the lifecycle table, i.e. earlier batches).
    ``series`` is the index key when known, else the object id.
    """
    s = samples.filter(pl.col("agent").is_not_null()).with_columns(
        update_ns=sample_time(),
        object_id=object_id(),
        generation=generation(),
        has_props=pl.col("index_key").is_not_null(),  # before the key is filled in
    )
    here = (
        s.filter(pl.col("index_key").is_not_null())
        .sort("update_ns", "index_key", nulls_last=False)
        .group_by("agent", "object_id")
        .agg(pl.col("index_key").last().alias("_key_here"))
    )
    s = s.join(here, on=["agent", "object_id"], how="left")
    resolved = [pl.col("index_key"), pl.col("_key_here")]
    if known_keys is not None:
        known = known_keys.group_by("agent", "object_id").agg(
            pl.col("index_key").max().alias("_key_known")
        )
        s = s.join(known, on=["agent", "object_id"], how="left")
        resolved.append(pl.col("_key_known"))
    s = s.with_columns(index_key=pl.coalesce(resolved)).drop("_key_here", "_key_known", strict=False)
    return s.with_columns(series=pl.coalesce(series_key(), pl.col("object_id")))


# ------------------------------------------------------------------ registry definitions


def statistic_defs(registry: pa.Table) -> pl.DataFrame:
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
    schema = {
        "package": pl.Utf8, "class_name": pl.Utf8, "schema_hash": pl.Binary, "statistic": pl.Utf8,
        "kind": pl.Utf8, "slot_kind": pl.Utf8, "slot": pl.Int64,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema, orient="row").unique(
        ["package", "class_name", "schema_hash", "statistic"], keep="first", maintain_order=True
    )


def property_defs(registry: pa.Table) -> pl.DataFrame:
    """Properties of every class version: (schema_hash, property, slot_kind, slot)."""
    rows = []
    for r in registry.select(["schema_hash", "properties"]).to_pylist():
        for e in r["properties"] or ():
            if e["slot_kind"] in ("ints", "floats", "texts"):
                rows.append((bytes(r["schema_hash"]), e["name"], e["slot_kind"], int(e["slot"])))
    schema = {"schema_hash": pl.Binary, "property": pl.Utf8, "slot_kind": pl.Utf8, "slot": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row").unique(
        ["schema_hash", "property"], keep="first", maintain_order=True
    )


def slot_values(lists: pl.Series, rows: np.ndarray, slots: np.ndarray) -> pl.Series:
    """``lists[rows[i]][slots[i]]`` for every i, NULL where the list is NULL or too short.

    A gather on the flattened values with numpy offsets: joining the list
    columns onto one row per (sample, statistic) would copy every list once
    per statistic.
    """
    arr = lists.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    start = offsets[rows]
    ok = valid[rows] & (slots >= 0) & (slots < offsets[rows + 1] - start)
    idx = np.where(ok, start + slots, 0)
    values = arr.values
    if len(values) == 0:
        return pl.Series(lists.name, pa.nulls(len(rows), values.type))
    taken = values.take(pa.array(idx, pa.int64(), mask=~ok))
    return pl.Series(lists.name, taken)


# ------------------------------------------------------------------ statistic values

_VALUE_COLS = (
    "agent", "dialect", "package", "class_name", "object_id", "index_key", "series",
    "statistic", "kind", "update_ns", "create_ns", "generation", "value", "from_create_ns",
)  # fmt: skip
# Arrival order (silver identity): of two samples with the same sample time, the first
# delivered is kept (a 'g' answer and an 'i' publish of one instant may differ in their
# watermarks), as a stream that met it in an earlier micro-batch would.
_ARRIVAL = ("partition", "offset", "record_index")
_VALUE_SCHEMA = {
    "agent": pl.Utf8, "dialect": pl.Utf8, "package": pl.Utf8, "class_name": pl.Utf8,
    "object_id": pl.Utf8, "index_key": pl.Utf8, "series": pl.Utf8, "statistic": pl.Utf8,
    "kind": pl.Utf8, "update_ns": pl.Int64, "create_ns": pl.Int64, "generation": pl.Int64,
    "value": pl.Float64, "from_create_ns": pl.Int64, "partition": pl.Utf8, "offset": pl.Int64,
    "record_index": pl.Int64, "deleted": pl.Boolean, "is_state": pl.Boolean,
}  # fmt: skip


# What statistic_values reads of an identified sample (the rate stage's input rows).
RATE_SAMPLE_SCHEMA = pl.Schema({
    "agent": pl.Utf8(), "dialect": pl.Utf8(), "package": pl.Utf8(), "class_name": pl.Utf8(),
    "schema_hash": pl.Binary(), "object_id": pl.Utf8(), "index_key": pl.Utf8(), "series": pl.Utf8(),
    "update_ns": pl.Int64(), "create_ns": pl.Int64(), "delete_ns": pl.Int64(), "generation": pl.Int64(),
    "partition": pl.Utf8(), "offset": pl.Int64(), "record_index": pl.Int64(),
    "ints": pl.List(pl.Int64()), "floats": pl.List(pl.Float64()),
})  # fmt: skip


def rate_samples(identified: pl.DataFrame) -> pl.DataFrame:
    """The columns of identified samples the rate stage needs (``RATE_SAMPLE_SCHEMA``)."""
    return identified.select(list(RATE_SAMPLE_SCHEMA))


def statistic_values(identified: pl.DataFrame, defs: pl.DataFrame) -> pl.DataFrame:
    """One row per (sample, numeric statistic it carries): the value as a double.

    ``deleted``: the sample reports the object deleted (its series ends there).
    """
    s = identified.filter(pl.col("update_ns").is_not_null() & (pl.col("update_ns") > 0))
    s = s.with_row_index("_row")
    j = s.select("_row", "package", "class_name", "schema_hash").join(
        defs, on=["package", "class_name", "schema_hash"], how="inner"
    )
    rows = j["_row"].cast(pl.Int64).to_numpy()
    slots = j["slot"].to_numpy()
    is_int = (j["slot_kind"] == "ints").to_numpy()
    ints = slot_values(s["ints"], rows, slots).cast(pl.Float64)
    floats = slot_values(s["floats"], rows, slots).cast(pl.Float64)
    value = pl.select(
        pl.when(pl.lit(pl.Series(is_int))).then(pl.lit(ints)).otherwise(pl.lit(floats))
    ).to_series()
    cols = [c for c in _VALUE_COLS if c not in ("statistic", "kind", "value", "from_create_ns")]
    base = s.select(*cols, *_ARRIVAL, "delete_ns")[rows]
    out = base.with_columns(
        statistic=j["statistic"], kind=j["kind"], value=value, from_create_ns=pl.lit(None, pl.Int64),
        deleted=pl.col("delete_ns").fill_null(0) != 0, is_state=pl.lit(False),
    ).filter(pl.col("value").is_not_null())  # fmt: skip
    return out.select(*_VALUE_COLS, *_ARRIVAL, "deleted", "is_state").cast(_VALUE_SCHEMA)  # type: ignore[arg-type]


def taught_keys(identified: pl.DataFrame) -> pl.DataFrame:
    """(agent, object_id, _k): the index key the batch's samples give each object
    (``rekey_state``'s input)."""
    return (
        identified.filter(pl.col("index_key").is_not_null())
        .group_by("agent", "object_id")
        .agg(pl.col("index_key").max().alias("_k"))
    )


def rekey_state(state: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """State rows of series keyed by an object id whose index key is now known (its
    statistics came before its properties, in an earlier micro-batch) move to the
    index-key series, where one batch over the same samples would have put them.
    ``keys``: ``taught_keys`` of the batch. Applying it twice changes nothing.

    Only rows without an index key can move, so only they are joined and re-keyed, in
    place (the rows keep their order): a steady state has few or none, and a join of
    the whole state plus ``series_key``'s regex over every row took a tenth of a
    one-interval batch's rate stage (2026-12-03)."""
    state = _with_owed(state).select(RATE_STATE.names)
    unkeyed = np.flatnonzero(state["index_key"].is_null().to_numpy())
    if len(unkeyed) == 0 or keys.height == 0:
        return state
    s = state[unkeyed].join(keys, on=["agent", "object_id"], how="left", maintain_order="left")
    s = s.with_columns(_o=pl.col("_k").is_not_null())
    s = s.with_columns(index_key=pl.when(pl.col("_o")).then(pl.col("_k")).otherwise(pl.col("index_key")))
    s = s.with_columns(series=pl.when(pl.col("_o")).then(series_key()).otherwise(pl.col("series")))
    at = pl.Series(unkeyed)
    return state.with_columns(
        index_key=state["index_key"].clone().scatter(at, s["index_key"]),
        series=state["series"].clone().scatter(at, s["series"]),
    )


def _with_owed(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with ``from_create_ns`` (null where absent: a state written before it existed)."""
    if "from_create_ns" in df.columns:
        return df
    return df.with_columns(from_create_ns=pl.lit(None, pl.Int64))


def state_values(state: pl.DataFrame) -> pl.DataFrame:
    """The ``rate_state`` rows in the shape of ``statistic_values`` (baselines)."""
    return (
        _with_owed(state)
        .with_columns(
            partition=pl.lit(None, pl.Utf8), offset=pl.lit(None, pl.Int64),
            record_index=pl.lit(None, pl.Int64), deleted=pl.lit(False), is_state=pl.lit(True),
        )
        .select(*_VALUE_COLS, *_ARRIVAL, "deleted", "is_state")
        .cast(_VALUE_SCHEMA)  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------ pairing


@njit(cache=True)
def _first_active(code: int, lo: int, act_off: np.ndarray, act_t: np.ndarray) -> int:
    """The first time agent ``code`` was seen (a sample of any object, a heartbeat) at or
    after ``lo``; -1 if none."""
    if code < 0:
        return -1
    a = act_off[code]
    b = act_off[code + 1]
    j = a + np.searchsorted(act_t[a:b], lo)
    return int(act_t[j]) if j < b else -1


@njit(cache=True)
def _went_quiet(
    p: int, nxt: int, t: np.ndarray, agent: np.ndarray, act_off: np.ndarray, act_t: np.ndarray,
    sample_max: np.ndarray, min_ns: int, burst_ns: int,
) -> bool:  # fmt: skip
    """Whether the series of pending sample ``p`` went quiet before its next sample ``nxt``
    (-1: none known): its agent published a cycle (first seen at ``a1``, at least a minimum
    interval after ``p``) that did not hold the series. Without a next sample, that cycle
    must be over in what is known: a sample of the agent ``burst_ns`` or more after ``a1``
    (samples of one agent land in order; a heartbeat table read ahead proves nothing)."""
    a1 = _first_active(agent[p], t[p] + min_ns, act_off, act_t)
    if a1 < 0:
        return False
    if nxt >= 0:
        return bool(a1 < t[nxt] - burst_ns)
    return bool(sample_max[agent[p]] >= a1 + burst_ns)


@njit(cache=True)
def _reason(
    dt: int, gen_i: int, gen_b: int, create_i: int, create_b: int, obj_i: int, obj_b: int,
    decreased: bool, gap_ns: int,
) -> int:  # fmt: skip
    """Why an interval has no rate (index into RESETS; 0: it has one). Scalars only:
    numba counts references on every array passed to a call."""
    if gen_i >= 0 and gen_b >= 0 and gen_i != gen_b:
        return 3
    if create_i != create_b or obj_i != obj_b:
        return 2
    # A long interval of one object instance (known create time) keeps its counts: an agent
    # that publishes on change leaves a quiet object unpublished, and one instance's
    # counters only grow. Without a create time the identity across the gap is unsure.
    if dt > gap_ns and create_i == 0:
        return 4
    if decreased:
        return 1
    return 0


_CREATED = -1  # the reason code of an interval counted from the object's creation
_CREATED_RESTART = -2  # ... of an object re-created by its agent's restart


@njit(cache=True)
def _from_create(i: int, t: np.ndarray, create: np.ndarray, is_counter: np.ndarray, after: int) -> bool:
    """Whether sample ``i`` counts from its object's creation (the counter was 0 at its
    create time): a counter whose create time is known, later than ``after`` and before
    the sample."""
    return bool(is_counter[i] and create[i] > 0 and after < create[i] < t[i])


@njit(cache=True)
def _pair_kernel(
    newgrp: np.ndarray,
    t: np.ndarray,
    val: np.ndarray,
    gen: np.ndarray,
    create: np.ndarray,
    obj: np.ndarray,
    is_counter: np.ndarray,
    deleted: np.ndarray,
    is_state: np.ndarray,
    keyed: np.ndarray,
    owed: np.ndarray,
    agent: np.ndarray,
    act_off: np.ndarray,
    act_t: np.ndarray,
    sample_max: np.ndarray,
    min_ns: int,
    burst_ns: int,
    gap_ns: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pairs each series' samples (sorted: state first, then sample time) with the baseline.

    ``pend``: the newest sample when it came less than ``min_ns`` after the baseline. It is
    superseded by a later sample of the series (whose interval then holds its counts; a
    delete's too), emitted (flushed) on its own when the series went quiet
    (``_went_quiet``), before a reset, or before a delete at its own sample time, or
    else kept in the state.

    Counting from creation: the counter of a new series' first sample whose object was
    created at most ``gap_ns`` before it, or of an object re-created after its series'
    baseline (a restart), started at 0 at the create time; that interval starts there
    with 0 (``start``/``prev``). A first sample *owes* its creation interval (``owed``,
    in and out: the state carries it) until it is written: at once when the sample's
    index key is known (``keyed``), else when the key comes (a later micro-batch
    rekeys the state row) or a later sample of the series pairs with it, so that a
    stream writes the row a single batch writes, index key included.
    """
    n = len(t)
    cur_out = np.empty(n, np.int64)
    start_out = np.empty(n, np.int64)
    prev_out = np.empty(n, np.float64)
    reason = np.empty(n, np.int8)
    keep = np.zeros(n, np.bool_)
    k = 0
    base = -1
    pend = -1
    lowest = np.iinfo(np.int64).min
    seen = lowest  # the newest sample time met in the series
    for i in range(n + 1):
        if i < n and newgrp[i]:
            seen = lowest
        if i == n or newgrp[i]:
            if pend >= 0 and _went_quiet(pend, -1, t, agent, act_off, act_t, sample_max, min_ns, burst_ns):
                if owed[base]:
                    cur_out[k], start_out[k], prev_out[k], reason[k] = base, create[base], 0.0, _CREATED
                    k += 1
                    owed[base] = False
                cur_out[k], start_out[k], prev_out[k], reason[k] = pend, t[base], val[base], 0
                k += 1
                base, pend = pend, -1
            if base >= 0:
                keep[base] = True
            if pend >= 0:
                keep[pend] = True
            base = pend = -1
            if i == n:
                break
        if base < 0:
            if t[i] <= seen:  # a twin or a late copy of the sample that ended the series
                continue
            seen = t[i]
            if not is_state[i]:
                owed[i] = t[i] - create[i] <= gap_ns and _from_create(i, t, create, is_counter, 0)
            if owed[i] and keyed[i]:
                cur_out[k], start_out[k], prev_out[k], reason[k] = i, create[i], 0.0, _CREATED
                k += 1
                owed[i] = False
            if not deleted[i] or owed[i]:  # an owed deleted sample waits for its key
                base = i
            continue
        if pend >= 0 and t[i] > t[pend] and _went_quiet(
            pend, i, t, agent, act_off, act_t, sample_max, min_ns, burst_ns
        ):
            if owed[base]:
                cur_out[k], start_out[k], prev_out[k], reason[k] = base, create[base], 0.0, _CREATED
                k += 1
                owed[base] = False
            cur_out[k], start_out[k], prev_out[k], reason[k] = pend, t[base], val[base], 0
            k += 1  # the series went quiet
            base, pend = pend, -1
        newest = pend if pend >= 0 else base
        seen = max(seen, t[i])
        if t[i] <= t[newest]:  # twin, duplicate, or older than the newest kept sample
            if deleted[i] and pend >= 0:  # the series ends: the pending sample closes it
                if owed[base]:
                    cur_out[k], start_out[k], prev_out[k], reason[k] = base, create[base], 0.0, _CREATED
                    k += 1
                    owed[base] = False
                cur_out[k], start_out[k], prev_out[k], reason[k] = pend, t[base], val[base], 0
                k += 1
                base = pend = -1
            continue
        if owed[base]:  # a later sample pairs with it: its creation interval first
            cur_out[k], start_out[k], prev_out[k], reason[k] = base, create[base], 0.0, _CREATED
            k += 1
            owed[base] = False
        r = _reason(t[i] - t[base], gen[i], gen[base], create[i], create[base], obj[i], obj[base],
                    is_counter[i] and val[i] < val[base], gap_ns)  # fmt: skip
        if pend >= 0 and (r != 0 or (is_counter[i] and val[i] < val[pend])):
            # A reset after the pending sample (e.g. the counter fell below it): the pending
            # sample's counts first, then the reset.
            cur_out[k], start_out[k], prev_out[k], reason[k] = pend, t[base], val[base], 0
            k += 1
            base, pend = pend, -1
            r = _reason(t[i] - t[base], gen[i], gen[base], create[i], create[base], obj[i],
                        obj[base], is_counter[i] and val[i] < val[base], gap_ns)  # fmt: skip
        if r == 0 and t[i] - t[base] < min_ns and not deleted[i]:
            pend = i
            continue
        if (r == 2 or r == 3) and _from_create(i, t, create, is_counter, t[base]):
            # A new instance: from 0 at its create time. After an agent restart the counts
            # may hold what the broker recovered (qpidd's store counts a durable queue's
            # restored messages as enqueues): the delta is the broker's, with no rate.
            why = _CREATED if r == 2 else _CREATED_RESTART
            cur_out[k], start_out[k], prev_out[k], reason[k] = i, create[i], 0.0, why
        else:
            cur_out[k], start_out[k], prev_out[k], reason[k] = i, t[base], val[base], r
        k += 1
        pend = -1
        base = -1 if deleted[i] else i
    return cur_out[:k], start_out[:k], prev_out[:k], reason[:k], keep


@dataclass(frozen=True)
class Pairs:
    """What the scan gives: one row per interval (``rates``: the sample's state columns
    plus ``start_ns``, ``prev_value``, ``reset``) and the baselines it leaves (``state``)."""

    rates: pl.DataFrame
    state: pl.DataFrame


_ORDER = ("is_state", "update_ns", *_ARRIVAL)
_ORDER_DESC = (True, False, False, False, False)


_MIN = np.iinfo(np.int64).min


@njit(cache=True)
def _fold_hash(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``h`` with one more column's hashes ``x`` folded in, row by row, then mixed
    (splitmix64's finalizer), so the columns' order counts."""
    out = np.empty(len(h), np.uint64)
    for i in range(len(h)):
        z = h[i] ^ x[i]
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out[i] = z ^ (z >> np.uint64(31))
    return out


def _key_hash(values: pl.DataFrame, seed: int) -> np.ndarray:
    """A 64-bit hash of each row's ``SERIES_KEYS``: each column hashed by polars on its
    own, then folded together (about half the cost of hashing the five as a struct)."""
    h = np.full(values.height, 0x9E3779B97F4A7C15, np.uint64)
    for k in SERIES_KEYS:
        h = _fold_hash(h, values[k].hash(seed=seed).to_numpy())
    return h


@njit(cache=True)
def _first_seen_groups(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows grouped by equal hash ``h``, groups in the order of their first row and
    rows in row order within each: (permutation, each placed row's group number).

    Why not an argsort of the hash: that puts the series in random order, so every
    column gathered by the permutation afterwards (a dozen in ``pair_values``) is read
    at random, and two such tasks on two cores contend for the memory; in first-seen
    order the values of a batch (sample-major) and of the state (last batch's order)
    are read as two nearly sequential runs: 3.5 times faster gathers (2026-12-02). An
    open-addressing table of the hashes (first seen -> group), then a counting sort."""
    n = len(h)
    size = 2
    while size < 2 * n:
        size <<= 1
    mask = np.uint64(size - 1)
    keys = np.empty(size, np.uint64)
    ids = np.full(size, -1, np.int64)
    gid = np.empty(n, np.int64)
    g = 0
    for i in range(n):
        x = h[i]
        s = np.int64(x & mask)
        while True:
            if ids[s] < 0:
                ids[s], keys[s], gid[i] = g, x, g
                g += 1
                break
            if keys[s] == x:
                gid[i] = ids[s]
                break
            s = (s + 1) & (size - 1)
    start = np.zeros(g + 1, np.int64)
    for i in range(n):
        start[gid[i] + 1] += 1
    for k in range(g):
        start[k + 1] += start[k]
    perm = np.empty(n, np.int64)
    for i in range(n):
        perm[start[gid[i]]] = i
        start[gid[i]] += 1
    placed = np.empty(n, np.int64)
    for j in range(n):
        placed[j] = gid[perm[j]]
    return perm, placed


@njit(cache=True)
def _order_groups(perm: np.ndarray, hs: np.ndarray, ks: np.ndarray, small: int) -> np.ndarray:
    """Within each run of equal group ``hs`` (the rows ``perm`` grouped, ``ks`` their
    order keys, keys x rows, in the same order), put the rows in order of their keys,
    then row number: an insertion sort of runs up to ``small`` rows (a series has a few
    values per batch), moving ``perm`` and ``ks`` together. Returns the (start, end) of
    each longer run, left for the caller."""
    n = len(perm)
    nk = ks.shape[0]
    xk = np.empty(nk, np.int64)
    big = []
    i = 0
    while i < n:
        j = i + 1
        while j < n and hs[j] == hs[i]:
            j += 1
        if j - i > small:
            big.append((i, j))
        else:
            for a in range(i + 1, j):
                x = perm[a]
                for k in range(nk):
                    xk[k] = ks[k, a]
                b = a - 1
                while b >= i:
                    less = x < perm[b]  # all keys equal: by row number
                    for k in range(nk):
                        if xk[k] != ks[k, b]:
                            less = xk[k] < ks[k, b]
                            break
                    if not less:
                        break
                    perm[b + 1] = perm[b]
                    for k in range(nk):
                        ks[k, b + 1] = ks[k, b]
                    b -= 1
                perm[b + 1] = x
                for k in range(nk):
                    ks[k, b + 1] = xk[k]
        i = j
    out = np.empty((len(big), 2), np.int64)
    for k in range(len(big)):
        out[k, 0], out[k, 1] = big[k]
    return out


_SMALL_GROUP = 32  # rows of one series in a batch that the insertion sort takes


def _series_order(
    values: pl.DataFrame, hash_expr: pl.Expr | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The order of the values by series (state first, then sample time, then
    arrival) as a permutation of their rows, and where each series starts in it.

    Only numbers are sorted: the rows are grouped by a 64-bit hash of the five key
    columns, series in the order they are first seen (``_first_seen_groups``), then,
    within each series, by the order columns and the row number (a numba insertion
    sort: a series has a few values per batch; longer runs by ``np.lexsort``). The
    series' order among themselves is arbitrary: results take rows in their own order
    (``_rows_at``). About half of ``np.lexsort``'s cost over all six keys, and the
    gathers by the permutation stay nearly sequential (2026-12-02). The rows themselves
    never move, since a gather of the string columns costs several times the sort. A hash collision
    cannot merge two series unless a second, independently seeded hash collides too
    (about n^2/2^129 per batch of n series: 1e-27 at a million); a first-hash collision
    is detected (the second hash changes inside a group) and the order is then taken by
    sorting the key strings themselves.
    """
    if hash_expr is None:
        h1 = _key_hash(values, 0)
    else:
        h1 = values.select(hash_expr.cast(pl.UInt64)).to_series().to_numpy()
        h1 = np.ascontiguousarray(np.broadcast_to(h1, (values.height,)), dtype=np.uint64)
    order = values.select(  # ascending, nulls first, as the key strings' sort below
        (2 - pl.col("is_state").cast(pl.Int8)).fill_null(0),  # state (True) first
        pl.col("update_ns").cast(pl.Int64).fill_null(_MIN),
        pl.col("partition").rank("dense").cast(pl.Int64).fill_null(0),
        pl.col("offset").cast(pl.Int64).fill_null(_MIN),
        pl.col("record_index").cast(pl.Int64).fill_null(_MIN),
    )
    keys = [order[c].to_numpy() for c in order.columns]
    perm, group = _first_seen_groups(h1)
    ks = np.stack([k[perm] for k in keys]).astype(np.int64, copy=False)
    for lo, hi in _order_groups(perm, group, ks, _SMALL_GROUP):
        rows = np.sort(perm[lo:hi])  # row order first: lexsort is stable
        perm[lo:hi] = rows[np.lexsort([k[rows] for k in reversed(keys)])]
    h2 = _key_hash(values, 1)[perm]
    same1 = group[1:] == group[:-1]
    if np.any(same1 & (h2[1:] != h2[:-1])):  # a collision of the first hash
        exact = values.select(*SERIES_KEYS, *_ORDER).with_row_index("_row").sort(
            [*SERIES_KEYS, *_ORDER], descending=[False] * len(SERIES_KEYS) + list(_ORDER_DESC),
            nulls_last=False, maintain_order=True,
        )  # fmt: skip
        return exact["_row"].cast(pl.Int64).to_numpy(), _boundaries(exact, SERIES_KEYS)
    newgrp = np.ones(len(perm), np.bool_)
    newgrp[1:] = ~same1
    return perm, newgrp


def _boundaries(t: pl.DataFrame, keys: tuple[str, ...]) -> np.ndarray:
    """True where a row's keys differ from the previous row's (and at row 0)."""
    out = t.select(
        pl.any_horizontal([pl.col(k).ne_missing(pl.col(k).shift(1)) for k in keys]).fill_null(True)
    ).to_series().to_numpy().astype(np.bool_)
    if len(out):
        out[0] = True
    return out


def _activity_index(
    agents: pl.Series, activity: pl.DataFrame | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each value's agent as a code into (offsets, times, sample_max): every agent's
    activity times (``activity``: agent, t_ns, is_sample) sorted, and its latest sample
    time (-1: none), so the kernel can ask "first seen after t?"."""
    if activity is None or activity.height == 0:
        none = np.zeros(0, np.int64)
        return np.full(len(agents), -1, np.int64), np.zeros(1, np.int64), none, none
    act = activity.select("agent", pl.col("t_ns").cast(pl.Int64), "is_sample").drop_nulls()
    per = act.group_by("agent").agg(
        pl.col("t_ns").unique().sort().alias("times"),
        pl.col("t_ns").filter(pl.col("is_sample")).max().fill_null(-1).alias("sample_max"),
    ).sort("agent")  # fmt: skip
    counts = per["times"].list.len().to_numpy()
    offsets = np.zeros(per.height + 1, np.int64)
    offsets[1:] = np.cumsum(counts)
    codes = agents.replace_strict(
        per["agent"], pl.Series(np.arange(per.height)), default=-1, return_dtype=pl.Int64
    )
    times = per["times"].explode().cast(pl.Int64).to_numpy()
    return (
        np.ascontiguousarray(codes.to_numpy()), offsets, np.ascontiguousarray(times),
        np.ascontiguousarray(per["sample_max"].cast(pl.Int64).to_numpy()),
    )  # fmt: skip


def pair_values(
    values: pl.DataFrame,
    rules: RateRules,
    activity: pl.DataFrame | None = None,
    latest_ns: int | None = None,
) -> Pairs:
    """Statistic values (new samples and state baselines) -> intervals and new baselines,
    in one numba scan over the values sorted by series, state first, then sample time.

    ``activity`` (agent, t_ns, is_sample): when each agent was seen (samples of any
    object, heartbeats), so a sample kept back by the minimum interval is emitted once
    its agent published a later cycle without the series (``_went_quiet``).
    ``latest_ns``: the sample time the state's TTL counts back from (``latest_sample_ns``
    over the whole batch and state; default the latest of ``values``).
    """
    names = RATE_STATE.names
    values = _with_owed(values)
    if values.height == 0:
        return Pairs(values.select(names).with_columns(
            start_ns=pl.lit(None, pl.Int64), prev_value=pl.lit(None, pl.Float64),
            reset=pl.lit(None, pl.Utf8),
        ), values.select(names))  # fmt: skip
    perm, newgrp = _series_order(values)
    num = values.select(
        pl.col("update_ns").fill_null(0).cast(pl.Int64),
        pl.col("value").cast(pl.Float64).fill_null(np.nan),
        pl.col("generation").fill_null(-1).cast(pl.Int64),
        pl.col("create_ns").fill_null(0).cast(pl.Int64),
        pl.col("object_id").cast(pl.Categorical).to_physical().cast(pl.Int64).alias("obj"),
        (pl.col("kind") == "counter").fill_null(False).alias("counter"),
        pl.col("deleted").fill_null(False),
        pl.col("is_state").fill_null(False),
        pl.col("index_key").is_not_null().alias("keyed"),
        pl.col("from_create_ns").is_not_null().alias("owed"),
    )
    col = {c: num[c].to_numpy()[perm] for c in num.columns}
    ns, val = col["update_ns"], col["value"]
    agent, act_off, act_t, sample_max = _activity_index(values["agent"], activity)
    owed = col["owed"].copy()
    cur, start, prev, reason, keep = _pair_kernel(
        newgrp, ns, val, col["generation"], col["create_ns"], col["obj"], col["counter"],
        col["deleted"], col["is_state"], col["keyed"], owed, np.ascontiguousarray(agent[perm]),
        act_off, act_t, sample_max, rules.min_ns, round(rules.jitter_s * NS), int(rules.max_gap_s * NS),
    )  # fmt: skip
    rows = values.select(names)
    # An interval counted from a creation keeps its delta however short; shorter than the
    # minimum interval it gets no rate (one message 3 ms after a reply queue's creation
    # is no rate of 333/s), as the minimum keeps such rates out elsewhere; after an agent
    # restart none (recovered messages counted as enqueues: 816 msg/s in the live trial).
    short = ((reason == _CREATED) & (ns[cur] - start < rules.min_ns)) | (reason == _CREATED_RESTART)
    extra = {"start_ns": start, "prev_value": prev, "reason": reason.astype(np.int8)}
    if short.any():  # rare: most batches carry no column for it
        extra["_no_rate"] = short
    rates = _rows_at(rows, perm[cur], extra)
    rates = rates.with_columns(
        prev_value=pl.col("prev_value").fill_nan(None),
        reset=pl.col("reason").replace_strict(
            pl.Series(range(1, len(RESETS)), dtype=pl.Int8), pl.Series(RESETS[1:]),
            default=None, return_dtype=pl.Utf8,
        ),
    ).drop("reason")  # fmt: skip
    if keep.any() and rules.state_ttl_s > 0:
        # Per series: a baseline older than the horizon stays while its series' pending
        # sample is newer (dropping it alone would make the pending sample the baseline).
        latest = int(ns.max()) if latest_ns is None else max(latest_ns, int(ns.max()))
        horizon = latest - int(rules.state_ttl_s * NS)
        upd = values["update_ns"].cast(pl.Int64).fill_null(_MIN).to_numpy()[perm]
        newest = np.maximum.reduceat(np.where(keep, upd, _MIN), np.flatnonzero(newgrp))
        keep &= newest[np.cumsum(newgrp) - 1] >= horizon
    kept = np.zeros(len(perm), np.bool_)
    kept[perm[keep]] = True
    still_owed = np.zeros(len(perm), np.bool_)
    still_owed[perm[owed]] = True
    state = rows.filter(pl.Series(kept))  # the owed marks of the kept rows only: few
    return Pairs(rates, state.with_columns(
        from_create_ns=pl.when(pl.Series(still_owed[kept])).then(pl.col("create_ns")).otherwise(None)
    ))  # fmt: skip


def _rows_at(rows: pl.DataFrame, at: np.ndarray, extra: dict[str, np.ndarray]) -> pl.DataFrame:
    """``rows`` at the distinct row numbers ``at``, each with its ``extra`` values, in the
    rows' own order: a filter, which moves the string columns in order (a gather by
    ``at`` would move them at random, several times slower)."""
    mask = np.zeros(rows.height, np.bool_)
    mask[at] = True
    if int(mask.sum()) != len(at):  # not distinct: never from the kernel, kept exact
        return rows[at].with_columns(**{k: pl.Series(v) for k, v in extra.items()})
    placed = {}
    for k, v in extra.items():
        full = np.zeros(rows.height, v.dtype)
        full[at] = v
        placed[k] = pl.Series(full[mask])
    return rows.filter(pl.Series(mask)).with_columns(**placed)


def rates_from_pairs(rates: pl.DataFrame, batch_id: int) -> pl.DataFrame:
    """The intervals of ``pair_values`` as STATISTIC_RATES rows."""
    counter = pl.col("kind") == "counter"
    gauge = pl.col("kind") == "gauge"
    ok = pl.col("reset").is_null()
    out = rates.select(
        "agent", "dialect", "package", "class_name", "object_id", "index_key", "statistic", "kind",
        "start_ns", pl.col("update_ns").alias("end_ns"),
        ts(pl.col("start_ns")).alias("start_time"), ts(pl.col("update_ns")).alias("end_time"),
        "prev_value", "value",
        pl.when(ok & counter).then(pl.col("value") - pl.col("prev_value")).alias("delta"),
        pl.when(gauge).then(pl.min_horizontal("prev_value", "value")).alias("value_min"),
        pl.when(gauge).then(pl.max_horizontal("prev_value", "value")).alias("value_max"),
        "reset", pl.lit(batch_id, pl.Int64).alias("batch_id"),
    )  # fmt: skip
    # Divisions in numpy: polars may divide by multiplying with the reciprocal, which
    # is not the correctly rounded quotient (15e9 ns * 1e-9 = 15.000000000000002 s).
    ns = (out["end_ns"] - out["start_ns"]).to_numpy().astype(np.float64)
    length = ns / float(NS)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = out["delta"].to_numpy().astype(np.float64) / length
    if "_no_rate" in rates.columns:
        rate[rates["_no_rate"].to_numpy()] = np.nan
    return out.with_columns(length_s=pl.Series(length), rate=pl.Series(rate).fill_nan(None))


def deleted_objects(identified: pl.DataFrame) -> pl.DataFrame:
    """(agent, object_id) of the objects the batch's samples report deleted."""
    return identified.filter(pl.col("delete_ns").fill_null(0) != 0).select("agent", "object_id").unique()


def state_from_pairs(state: pl.DataFrame, gone: pl.DataFrame | None = None) -> pl.DataFrame:
    """The baselines of ``pair_values`` minus every series of the objects ``gone``
    (``deleted_objects``): also a series keyed by the object id. Few objects go in a
    batch: the rows of their object ids are found first (an anti join of the whole
    state cost ~35 ms a bucket even with none gone), then matched by agent too. A row
    that still owes its creation interval (``from_create_ns``) stays until its key comes."""
    if gone is None or gone.height == 0:
        return state
    ids = pl.col("object_id").is_in(gone["object_id"].unique().implode()).fill_null(False)
    if "from_create_ns" in state.columns:
        ids = ids & pl.col("from_create_ns").is_null()
    cand = state.select(ids).to_series()
    if not cand.any():
        return state
    hit = state.with_row_index("_r").filter(cand).join(
        gone.unique(), on=["agent", "object_id"], how="semi"
    )["_r"]
    keep = np.ones(state.height, np.bool_)
    keep[hit.to_numpy()] = False
    return state.filter(pl.Series(keep))


# ------------------------------------------------------------------ lifecycles


def object_updates(identified: pl.DataFrame, props: pl.DataFrame) -> pl.DataFrame:
    """What one batch says about each object (agent, object_id, create_ns): first/last seen,
    sample count, delete time, and the properties of its latest sample that carried them."""
    key = list(LIFECYCLE_KEYS)
    s = identified.filter(pl.col("update_ns").is_not_null() & (pl.col("update_ns") > 0)).with_columns(
        create_ns=pl.col("create_ns").fill_null(0)
    )
    agg = s.group_by(key, maintain_order=True).agg(
        pl.col("dialect").first(), pl.col("package").first(), pl.col("class_name").first(),
        pl.col("index_key").max(), pl.col("generation").max(),
        pl.col("update_ns").min().alias("first_seen_ns"),
        pl.col("update_ns").max().alias("last_seen_ns"),
        pl.len().cast(pl.Int64).alias("samples"),
        pl.col("delete_ns").filter(pl.col("delete_ns") != 0).max().alias("delete_ns"),
    )  # fmt: skip
    last = (
        s.filter(pl.col("has_props"))
        .sort("update_ns", maintain_order=True)
        .group_by(key)
        .agg(pl.all().exclude(key).last())
        .select(*key, "schema_hash", "ints", "floats", "texts", "update_ns")
        .with_row_index("_row")
    )
    j = last.select("_row", *key, "schema_hash", "update_ns").join(props, on="schema_hash")
    if j.height == 0:
        return agg.with_columns(
            properties=pl.lit(None, pl.Map(pl.Utf8, pl.Utf8)), properties_ns=pl.lit(None, pl.Int64)
        )
    rows = j["_row"].cast(pl.Int64).to_numpy()
    slots = j["slot"].to_numpy()
    kind = j["slot_kind"]
    v = pl.select(
        pl.when(pl.lit(kind) == "ints").then(pl.lit(slot_values(last["ints"], rows, slots).cast(pl.Utf8)))
        .when(pl.lit(kind) == "floats").then(pl.lit(slot_values(last["floats"], rows, slots).cast(pl.Utf8)))
        .otherwise(pl.lit(slot_values(last["texts"], rows, slots).cast(pl.Utf8)))
    ).to_series()  # fmt: skip
    pmap = (
        j.with_columns(v=v)
        .group_by(key)
        .agg(
            pl.struct(key="property", value="v").sort_by("property").alias("properties"),
            pl.col("update_ns").max().alias("properties_ns"),
        )
        .with_columns(pl.col("properties").cast(pl.Map(pl.Utf8, pl.Utf8)))
    )
    return agg.join(pmap, on=key, how="left")


def generation_starts(seen: pl.DataFrame) -> pl.DataFrame:
    """(agent, generation, t_ns) sightings -> (agent, g, g_start, g_first): when each
    generation of an agent was first seen, and the agent's first generation seen."""
    gens = (
        seen.filter(pl.col("generation").is_not_null() & pl.col("agent").is_not_null())
        .group_by("agent", "generation")
        .agg(pl.col("t_ns").min().alias("g_start"))
        .rename({"generation": "g"})
    )
    return gens.with_columns(g_first=pl.col("g").min().over("agent"))


def agent_restarts(lifecycles: pl.DataFrame, identified: pl.DataFrame) -> dict[str, list[int]]:
    """agent -> the times its later generations were first seen (sorted): its restarts as
    its objects show them, whichever dialect carried them (a v1 heartbeat has no epoch)."""
    seen = pl.concat([
        lifecycles.select("agent", pl.col("generation").cast(pl.Int64), pl.col("first_seen_ns").alias("t_ns")),
        identified.select("agent", pl.col("generation").cast(pl.Int64), pl.col("update_ns").alias("t_ns")),
    ])  # fmt: skip
    starts = generation_starts(seen).filter(pl.col("g") > pl.col("g_first"))
    out: dict[str, list[int]] = {}
    for agent, t in starts.sort("g_start").select("agent", "g_start").iter_rows():
        out.setdefault(agent, []).append(int(t))
    return out


def merge_lifecycles(
    existing: pl.DataFrame, updates: pl.DataFrame, liveness: pl.DataFrame, batch_id: int
) -> pl.DataFrame:
    """Existing lifecycle rows + a batch's object updates -> every object's row, state recomputed.

    An object is *lost* when its agent restarted (an object of a later
    generation of the same agent was seen: ``ended_at`` = the first sample of
    the next generation) or its agent is down now (``liveness``: the agent's
    latest up interval is ``down``; ``ended_at`` = its ``down_at``) unless it
    was seen after that. Deleted wins over lost.
    """
    key = list(LIFECYCLE_KEYS)
    e = existing.select(
        *key, "dialect", "package", "class_name", "index_key", "generation", "first_seen_ns",
        "last_seen_ns", "samples", "deleted_at", "properties", "properties_ns",
    )  # fmt: skip
    u = updates.select(
        *key,
        *(pl.col(c).alias(f"u_{c}") for c in (
            "dialect", "package", "class_name", "index_key", "generation", "first_seen_ns",
            "last_seen_ns", "samples", "delete_ns", "properties", "properties_ns",
        )),
    )  # fmt: skip
    newer = pl.col("u_properties_ns").is_not_null() & (
        pl.col("properties_ns").is_null() | (pl.col("u_properties_ns") > pl.col("properties_ns"))
    )
    m = e.join(u, on=key, how="full", coalesce=True).select(
        *key,
        pl.coalesce("dialect", "u_dialect").alias("dialect"),
        pl.coalesce("package", "u_package").alias("package"),
        pl.coalesce("class_name", "u_class_name").alias("class_name"),
        pl.coalesce("u_index_key", "index_key").alias("index_key"),
        pl.coalesce("generation", "u_generation").alias("generation"),
        pl.min_horizontal("first_seen_ns", "u_first_seen_ns").alias("first_seen_ns"),
        pl.max_horizontal("last_seen_ns", "u_last_seen_ns").alias("last_seen_ns"),
        (pl.col("samples").fill_null(0) + pl.col("u_samples").fill_null(0)).alias("samples"),
        pl.coalesce(pl.col("deleted_at"), ts(pl.col("u_delete_ns"))).alias("deleted_at"),
        pl.when(newer).then(pl.col("u_properties")).otherwise(pl.col("properties")).alias("properties"),
        pl.when(newer).then(pl.col("u_properties_ns")).otherwise(pl.col("properties_ns"))
        .alias("properties_ns"),
    )  # fmt: skip
    # Agent restarts: the first sample of each generation per agent. An object ends at the
    # first restart after its last sighting into a later generation than its own; an object
    # of no generation (qpidd's start-up objects: broker, system, vhost, epoch 0) at the
    # first restart after its last sighting (the agent's first generation seen is no restart).
    gens = generation_starts(m.select("agent", "generation", pl.col("first_seen_ns").alias("t_ns")))
    nxt = (
        m.select(*key, pl.col("generation").alias("own"), "last_seen_ns")
        .join(gens, on="agent")
        .filter(
            (pl.col("g") > pl.coalesce("own", "g_first")) & (pl.col("g_start") > pl.col("last_seen_ns"))
        )
        .group_by(key)
        .agg(pl.col("g_start").min().alias("restart_ns"))
    )
    down = (
        latest_liveness(liveness)
        .filter(pl.col("state") == "down")
        .select("agent", pl.col("down_at").alias("agent_down_at"))
    )
    m = m.join(nxt, on=key, how="left").join(down, on="agent", how="left")
    last_seen = ts(pl.col("last_seen_ns"))
    deleted = pl.col("deleted_at").is_not_null()
    restarted = pl.col("restart_ns").is_not_null()
    is_down = pl.col("agent_down_at").is_not_null() & (pl.col("agent_down_at") >= last_seen)
    lost = restarted | is_down
    return m.select(
        "agent", "dialect", "package", "class_name", "object_id", "index_key", "create_ns",
        "generation",
        pl.when(pl.col("create_ns") != 0).then(ts(pl.col("create_ns"))).alias("created_at"),
        "deleted_at",
        ts(pl.col("first_seen_ns")).alias("first_seen"), last_seen.alias("last_seen"),
        "first_seen_ns", "last_seen_ns", "samples", "properties", "properties_ns",
        pl.when(deleted).then(pl.lit("deleted")).when(lost).then(pl.lit("lost"))
        .otherwise(pl.lit("live")).alias("state"),
        pl.when(deleted).then(pl.lit("deleted")).when(restarted).then(pl.lit("agent_restart"))
        .when(is_down).then(pl.lit("agent_down")).alias("end_reason"),
        pl.when(deleted).then(pl.col("deleted_at")).when(restarted).then(ts(pl.col("restart_ns")))
        .when(is_down).then(pl.col("agent_down_at")).alias("ended_at"),
        pl.lit(batch_id, pl.Int64).alias("batch_id"),
    )  # fmt: skip


_MAP = pl.List(pl.Struct({"key": pl.Utf8, "value": pl.Utf8}))  # a map<string, string>


def _entries_text(m: pl.Expr) -> pl.Expr:
    """A map column as its sorted entries' text: entry order is no change."""
    return m.cast(_MAP).list.eval(
        pl.element().struct.field("key") + "\x1f" + pl.element().struct.field("value").fill_null("\x00")
    ).list.sort().list.join("\x1e")


def _maps_equal_as_stored(p: pl.Series, q: pl.Series) -> np.ndarray:
    """Row by row, whether two map columns hold the same entries in the same order
    (both null counts as equal): their flat keys and values compared, then reduced per
    row (polars' comparison of nested lists took four times as long)."""
    lp, lq = p.list.len().fill_null(0).to_numpy(), q.list.len().fill_null(0).to_numpy()
    np_, nq = p.is_null().to_numpy(), q.is_null().to_numpy()
    eq: np.ndarray = (np_ == nq) & (lp == lq)
    rows = np.flatnonzero(eq & ~np_ & (lp > 0))
    if len(rows):
        a, b = p.gather(rows).explode().struct.unnest(), q.gather(rows).explode().struct.unnest()
        same = (a["key"].eq_missing(b["key"]) & a["value"].eq_missing(b["value"])).to_numpy()
        starts = np.zeros(len(rows), np.int64)
        starts[1:] = np.cumsum(lp[rows])[:-1]
        eq[rows] = np.minimum.reduceat(same, starts)
    return eq


def changed_rows(new: pl.DataFrame, existing: pl.DataFrame) -> pl.DataFrame:
    """Rows of ``new`` that differ from ``existing`` (ignoring ``batch_id``; a map's entry
    order is no change): what a MERGE needs, in ``new``'s order.

    Rows are matched by their keys and compared column by column; only a row whose
    properties differ as stored is compared again by its entries' text. Before, every
    row of both sides was turned into text and semi-joined on all columns: most of this
    step's cost, which grows with the objects, not the batch (2026-12-03). With a key
    repeated on either side, that exact semi join is still what runs."""
    cols = [c for c in new.columns if c != "batch_id"]
    keys = list(LIFECYCLE_KEYS)
    as_map = pl.col("properties").cast(_MAP)
    cur, old = new.select(cols).with_columns(as_map), existing.select(cols).with_columns(as_map)
    if cur.select(keys).is_duplicated().any() or old.select(keys).is_duplicated().any():
        text = {"properties": _entries_text(pl.col("properties"))}
        same = cur.with_columns(**text).join(
            old.with_columns(**text), on=cols, how="semi", nulls_equal=True
        )
        return new.join(same.select(keys), on=keys, how="anti", nulls_equal=True)
    pairs = cur.select(keys).with_row_index("_i").join(
        old.select(keys).with_row_index("_j"), on=keys, how="inner", nulls_equal=True
    )  # only the keys: the list columns are gathered for the rows still equal
    i, j = pairs["_i"].to_numpy(), pairs["_j"].to_numpy()
    for c in (c for c in cols if c not in keys and c != "properties"):
        eq = cur[c].gather(i).eq_missing(old[c].gather(j)).to_numpy()
        i, j = i[eq], j[eq]
    p, q = cur["properties"].gather(i), old["properties"].gather(j)
    stored = _maps_equal_as_stored(p, q)
    unsure = pl.DataFrame({"p": p.filter(~stored), "q": q.filter(~stored)})
    by_text = unsure.select(_entries_text(pl.col("p")).eq_missing(_entries_text(pl.col("q"))))
    changed = np.ones(new.height, np.bool_)
    changed[i[stored]] = False
    changed[i[~stored][by_text.to_series().to_numpy()]] = False
    return new.filter(pl.Series(changed))


# ------------------------------------------------------------------ agent liveness


@dataclass(frozen=True)
class LivenessRules:
    """``missed``: heartbeats missed before an agent is down (qpid's console: 3).
    v1 'h' carries neither agent nor interval: ``v1_agent`` names the broker agent
    they stand for, ``v1_interval_s`` is the broker's publish interval."""

    missed: int = 3
    v1_agent: str = V1_AGENT
    v1_interval_s: float = 10.0
    # Per broker of a fleet (``broker_name``, seconds): its v1 agents' publish interval,
    # for the agents ``fleet_agent`` named ``<broker_name>/...``; the others take the above.
    v1_intervals: tuple[tuple[str, float], ...] = ()

    def v1_interval(self) -> pl.Expr:
        """The v1 heartbeat interval of each row's agent (a polars expression)."""
        if not self.v1_intervals:
            return pl.lit(self.v1_interval_s)
        return fleet_broker(pl.col("agent")).replace_strict(
            dict(self.v1_intervals), default=self.v1_interval_s, return_dtype=pl.Float64
        )


def heartbeat_rows(heartbeats: pl.DataFrame, rules: LivenessRules) -> pl.DataFrame:
    """Silver heartbeats -> (agent, dialect, ts_ns, epoch, interval_s)."""
    attr = pl.col("attributes")
    interval = attr.str.json_path_match("$._heartbeat_interval").cast(pl.Float64, strict=False)
    epoch = attr.str.json_path_match("$._epoch").cast(pl.Int64, strict=False)
    return (
        heartbeats.filter(pl.col("timestamp_ns").is_not_null() & (pl.col("timestamp_ns") > 0))
        .select(
            pl.coalesce(
                pl.col("agent"), pl.when(pl.col("dialect") != "V2").then(pl.lit(rules.v1_agent))
            ).alias("agent"),
            "dialect",
            pl.col("timestamp_ns").alias("ts_ns"),
            epoch.alias("epoch"),
            pl.coalesce(interval, rules.v1_interval()).alias("interval_s"),
        )
        .filter(pl.col("agent").is_not_null())
    )


def _ts_py(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1000 // 1_000_000, UTC).replace(
        microsecond=ns // 1000 % 1_000_000
    )


def liveness_scan(
    beats: list[tuple[int, int | None, float, str]],
    agent: str,
    current: Mapping[str, Any] | None,
    now_ns: int,
    rules: LivenessRules,
    batch_id: int,
    restarts: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """One agent's heartbeats ``(ts_ns, epoch, interval_s, dialect)`` (any order, duplicates
    allowed) continuing its open up interval.

    An outage (more than ``missed`` intervals without a heartbeat) is ``down`` from the
    last heartbeat plus the limit, whatever else is known; the interval after it was
    started by a ``restart`` when the heartbeats' epoch changed or the agent's objects
    show a new generation in the outage (``restarts``: ``agent_restarts``; a v1
    heartbeat carries no epoch), else ``recovered``. A new epoch without an outage (for a
    v1 agent: a new generation of its objects first seen between two heartbeats) closes
    the interval as ``restarted``. So both dialects of one broker record one restart
    alike, however short."""
    out: list[dict[str, Any]] = []
    cur = dict(current) if current is not None else None
    for ts_ns, ep, iv, dialect in sorted(beats, key=lambda b: b[0]):
        fresh = {
            "agent": agent, "dialect": dialect, "epoch": ep, "up_start_ns": ts_ns,
            "last_heartbeat_ns": ts_ns, "heartbeats": 1, "interval_s": float(iv),
            "state": "up", "started_by": "first", "down_at": None, "next_up": None,
        }  # fmt: skip
        if cur is None:
            cur = fresh
            continue
        if ts_ns <= int(cur["last_heartbeat_ns"]):
            continue
        limit = int(rules.missed * float(cur["interval_s"]) * NS)
        last = int(cur["last_heartbeat_ns"])
        new_epoch = ep is not None and cur["epoch"] is not None and ep != int(cur["epoch"])
        # A v1 heartbeat has no epoch: a restart shorter than the outage limit shows only
        # in the agent's objects, a new generation first seen since the last heartbeat.
        if ep is None and cur["epoch"] is None:
            new_epoch = any(last < r <= ts_ns for r in restarts)
        if ts_ns - last > limit:
            cur.update(state="down", down_at=_ts_py(last + limit), next_up=_ts_py(ts_ns))
            out.append(cur)
            restarted = new_epoch or any(last < r <= ts_ns for r in restarts)
            cur = {**fresh, "started_by": "restart" if restarted else "recovered"}
        elif new_epoch:
            cur.update(state="restarted", down_at=None, next_up=_ts_py(ts_ns))
            out.append(cur)
            cur = {**fresh, "started_by": "restart"}
        else:
            cur.update(
                last_heartbeat_ns=ts_ns, heartbeats=int(cur["heartbeats"]) + 1, interval_s=float(iv)
            )
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
    beats: pl.DataFrame,
    current: pl.DataFrame,
    now_ns: int,
    rules: LivenessRules,
    batch_id: int,
    restarts: Mapping[str, Sequence[int]] | None = None,
) -> pl.DataFrame:
    """Heartbeat rows (``heartbeat_rows``) + each agent's open up interval (``current``: its
    latest AGENT_LIVENESS row) -> the rows to upsert, every agent re-judged at ``now_ns``
    (the latest heartbeat time seen: event time, so a replay or a backfill judges alike).

    A Python loop per heartbeat: heartbeats are one per agent per interval."""
    by_agent: dict[str, list[tuple[int, int | None, float, str]]] = {}
    for a, ts_ns, ep, iv, d in beats.select("agent", "ts_ns", "epoch", "interval_s", "dialect").iter_rows():
        by_agent.setdefault(a, []).append((int(ts_ns), None if ep is None else int(ep), float(iv), d))
    open_rows = {r["agent"]: r for r in current.select(AGENT_LIVENESS.names).to_dicts()}
    rows: list[dict[str, Any]] = []
    for agent in sorted(set(by_agent) | set(open_rows)):
        rows += liveness_scan(
            by_agent.get(agent, []), agent, open_rows.get(agent), now_ns, rules, batch_id,
            (restarts or {}).get(agent, ()),
        )  # fmt: skip
    return frame(pa.Table.from_pylist(rows, schema=AGENT_LIVENESS))


def latest_liveness(liveness: pl.DataFrame) -> pl.DataFrame:
    """Each agent's latest up interval (the open one)."""
    return liveness.sort("up_start_ns", descending=True).unique("agent", keep="first", maintain_order=True)


# ------------------------------------------------------------------ the batch


def agent_activity(
    identified: pl.DataFrame, beats: pl.DataFrame, lifecycles: pl.DataFrame, liveness: pl.DataFrame
) -> pl.DataFrame:
    """(agent, t_ns, is_sample): when each agent was seen. The batch's samples (any object)
    and heartbeats, and each agent's latest times of earlier batches."""
    parts = [
        (identified.select("agent", pl.col("update_ns").alias("t_ns")), True),
        (beats.select("agent", pl.col("ts_ns").alias("t_ns")), False),
        (lifecycles.group_by("agent").agg(pl.col("last_seen_ns").max().alias("t_ns")), True),
        (liveness.group_by("agent").agg(pl.col("last_heartbeat_ns").max().alias("t_ns")), False),
    ]
    return pl.concat(
        [
            p.select(pl.col("agent").cast(pl.Utf8), pl.col("t_ns").cast(pl.Int64), is_sample=pl.lit(s))
            for p, s in parts
        ]
    ).filter(pl.col("agent").is_not_null() & (pl.col("t_ns") > 0))


@dataclass(frozen=True)
class GoldRows:
    """One gold micro-batch's output: rows to append / upsert, and the new rate state."""

    rates: pl.DataFrame
    lifecycles: pl.DataFrame
    liveness: pl.DataFrame
    state: pl.DataFrame


def gold_batch(
    batch: pl.DataFrame,
    *,
    registry: pa.Table,
    state: pl.DataFrame,
    lifecycles: pl.DataFrame,
    liveness: pl.DataFrame,
    rate_rules: RateRules,
    liveness_rules: LivenessRules,
    batch_id: int,
    now_ns: int | None = None,
    latest_ns: int | None = None,
) -> GoldRows:
    """Gold input rows (``pipeline.gold.gold_input``: samples and heartbeats, ``source``)
    + the gold tables as they are -> what the batch writes to each.

    Every result depends on one agent's rows only, but for two times taken over the
    whole batch and tables: ``now_ns``, when liveness is judged (``batch_now_ns``), and
    ``latest_ns``, where the rate state's TTL counts back from (``latest_sample_ns``).
    A caller computing one group of agents (``pipeline.gold.tasks``) passes both, taken
    over every group; by default they come from this call's inputs.
    """
    if latest_ns is None:  # one column of the samples, not a filtered copy of the batch
        sample_ns = batch.select(pl.col("update_ns").filter(pl.col("source") == "sample"))
        latest_ns = max_ns(sample_ns.to_series(), state["update_ns"])
    agents = agent_stage(
        batch, registry=registry, lifecycles=lifecycles, liveness=liveness,
        liveness_rules=liveness_rules, batch_id=batch_id, now_ns=now_ns,
    )  # fmt: skip
    defs = statistic_defs(registry)
    rates, new_state = rate_stage(agents.rate_input, defs, state, rate_rules, batch_id, latest_ns)
    return GoldRows(
        rates=rates,
        lifecycles=agents.lifecycles,
        liveness=agents.liveness,
        state=new_state,
    )


@dataclass(frozen=True)
class AgentRows:
    """What a batch's agent stage gives: changed lifecycle rows, liveness rows, and the
    rate stage's input (``RateInput``)."""

    lifecycles: pl.DataFrame
    liveness: pl.DataFrame
    rate_input: RateInput


def agent_stage(
    batch: pl.DataFrame,
    *,
    registry: pa.Table,
    lifecycles: pl.DataFrame,
    liveness: pl.DataFrame,
    liveness_rules: LivenessRules,
    batch_id: int,
    now_ns: int | None = None,
) -> AgentRows:
    """The part of ``gold_batch`` that needs an agent's rows together (identities, index
    keys, lifecycles and names, liveness, activity); its ``RateInput`` is then paired per
    series (``rate_stage``), which the task path runs per bucket of series."""
    samples = batch.filter(pl.col("source") == "sample")
    beats = batch.filter(pl.col("source") == "heartbeat")

    hb = heartbeat_rows(beats, liveness_rules)
    if now_ns is None:
        now_ns = max_ns(hb["ts_ns"], liveness["last_heartbeat_ns"])
    known = lifecycles.filter(pl.col("index_key").is_not_null()).select("agent", "object_id", "index_key")
    ident = identify(samples, known)
    live_rows = agent_liveness(
        hb, latest_liveness(liveness), now_ns, liveness_rules, batch_id, agent_restarts(lifecycles, ident)
    )
    updates = object_updates(ident, property_defs(registry))
    merged = with_names(merge_lifecycles(lifecycles, updates, live_rows, batch_id), ref_positions(registry))

    inp = RateInput(
        samples=rate_samples(ident),
        activity=agent_activity(ident, hb, lifecycles, liveness),
        keys=taught_keys(ident),
        gone=deleted_objects(ident),
    )
    return AgentRows(lifecycles=changed_rows(merged, lifecycles), liveness=live_rows, rate_input=inp)


@dataclass(frozen=True)
class RateInput:
    """What the rate pairing needs from a batch besides the rate state: its identified
    samples (``rate_samples``), and three per-agent facts.

    Why apart: the pairing is per series, so it can run per bucket of series
    (``series_buckets``) with each bucket's samples and state rows and the three facts
    whole (they are per agent or object, far fewer rows than the values); docs/DESIGN.md,
    Gold, the task path. Samples, not their value rows: ~13 times fewer rows to move,
    and ``statistic_values`` runs in the rate stage.
    """

    samples: pl.DataFrame  # identified samples: what statistic_values reads of them
    activity: pl.DataFrame  # agent_activity: when each agent was seen
    keys: pl.DataFrame  # taught_keys: index keys the batch gives objects (rekey_state)
    gone: pl.DataFrame  # deleted_objects: their series end (state_from_pairs)


def empty_rate_input() -> RateInput:
    """A ``RateInput`` without rows (a rate task whose bucket got none), typed as
    ``agent_stage`` makes one."""
    return RateInput(
        samples=pl.DataFrame(schema=RATE_SAMPLE_SCHEMA),
        activity=pl.DataFrame(schema={"agent": pl.Utf8, "t_ns": pl.Int64, "is_sample": pl.Boolean}),
        keys=pl.DataFrame(schema={"agent": pl.Utf8, "object_id": pl.Utf8, "_k": pl.Utf8}),
        gone=pl.DataFrame(schema={"agent": pl.Utf8, "object_id": pl.Utf8}),
    )


def rate_stage(
    inp: RateInput,
    defs: pl.DataFrame,
    state: pl.DataFrame,
    rules: RateRules,
    batch_id: int,
    latest_ns: int | None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(statistic_rates rows, new rate state) of a batch, or of a bucket of its series
    (``defs``: ``statistic_defs`` of the registry; ``latest_ns``: over the whole batch and
    state, as ``gold_batch`` takes it)."""
    new = statistic_values(inp.samples, defs)
    values = pl.concat([new, state_values(rekey_state(state, inp.keys))])
    pairs = pair_values(values, rules, inp.activity, latest_ns or None)
    return rates_from_pairs(pairs.rates, batch_id), state_from_pairs(pairs.state, inp.gone)


def series_buckets(rows: pl.DataFrame, buckets: int) -> pl.Series:
    """The bucket of each value or state row's series (agent, package, class, series):
    blake2b per distinct series, so the same in every process and run. The statistic
    is left out: one object's statistics stay together."""
    import hashlib

    keys = ("agent", "package", "class_name", "series")
    uniq = rows.select(keys).unique()
    joined = uniq.select(pl.concat_str([pl.col(k).fill_null("") for k in keys], separator="\x1f"))
    digest = [
        int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "big") % buckets
        for k in joined.to_series().to_list()
    ]
    table = uniq.with_columns(_b=pl.Series(digest, dtype=pl.Int32))
    return rows.select(keys).join(table, on=list(keys), how="left", nulls_equal=True, maintain_order="left")["_b"]


def max_ns(*columns: pl.Series) -> int:
    """The latest of ns columns (nulls and empty columns ignored; 0 when none)."""
    top = [c.max() for c in columns if c.len()]
    return max((int(v) for v in top if isinstance(v, int)), default=0)


def upsert_rows(existing: pl.DataFrame, changed: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """``existing`` upserted with ``changed`` on ``keys`` (what a MERGE would leave)."""
    if changed.height == 0:
        return existing
    kept = existing.join(changed.select(keys), on=list(keys), how="anti", nulls_equal=True)
    return pl.concat([kept, changed.select(existing.columns)], how="vertical_relaxed")


def conform(df: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """A polars result as an Arrow table of a gold table's schema (column order, types)."""
    return df.select(schema.names).to_arrow().cast(schema)
