"""One row per object: gold's lifecycle state folded over every agent that reported it.

Gold computes an object's lifecycle per agent (``lifecycle_state``): an agent's
restarts, its liveness and its object ids are its own. qpidd with QMF v1 and v2 on is
two agents for one broker (``1.0`` and ``apache.org:qpidd:<uuid>``), each reporting
every object under its own id; another console's query answer may name an object by an
id without its epoch. A person wants one queue, one row: ``object_lifecycles`` is
``lifecycle_state`` grouped by the object's identity, (broker, package, class_name,
name, create_ns), which both dialects give alike (``pipeline.gold.names``). A row
whose broker or name is not resolved yet, or whose agent gave no create time, is its
own object until they are.

Pure: a polars frame of ``LIFECYCLE_STATE`` rows in, ``OBJECT_LIFECYCLES`` rows out.
The fold is a function of the whole state, so gold rewrites the table whole whenever
the state changed, and a replayed batch writes the same rows.
"""

from __future__ import annotations

import polars as pl

from pipeline.gold.names import fleet_broker

# The first reporter of an object names it: qpidd's own v2 agent name before its v1
# bank numbers.
DIALECT_RANK = {"V2": 0, "AM2": 1, "AM1": 2}
# The folded state: a delete seen by any reporter ends the object; else one live
# reporter keeps it live (one dialect's agent down is not the broker's objects lost).
STATE_RANK = {"deleted": 0, "live": 1, "lost": 2}
IDENTITY = ("broker", "package", "class_name", "name", "create_ns")
_KEY = "_identity"


def identity_key() -> pl.Expr:
    """The folding key: the identity where it is known, else the reporter row's own key.

    A struct, not a joined string: hashing its fields is a third of the cost of building
    a string per row (the fold is on the path of every gold batch's commits)."""
    known = (
        pl.col("broker").is_not_null() & pl.col("name").is_not_null() & (pl.col("create_ns") != 0)
    )
    # Two brokers of a fleet may report the same identity (brokers cloned alike): the
    # fleet broker in the agent id (``fleet_agent``) keeps their objects apart.
    fleet = fleet_broker(pl.col("agent"))
    return pl.struct(
        known.alias("known"),
        pl.when(known).then(fleet).alias("fleet"),
        *[pl.when(known).then(pl.col(c)).alias(c) for c in IDENTITY if c != "create_ns"],
        pl.col("create_ns"),
        pl.when(~known).then(pl.col("agent")).alias("agent"),
        pl.when(~known).then(pl.col("object_id")).alias("object_id"),
    )


def fold_lifecycles(state: pl.DataFrame, *, shortcut: bool = True) -> pl.DataFrame:
    """``lifecycle_state`` rows -> one ``object_lifecycles`` row per object (see module).

    Sorted by (broker, package, class_name, name, create_ns, agent, object_id), so the
    same state gives the same file. ``shortcut``: when no two rows share an identity
    (one reporter per object, as with a broker's QMF v2 agent alone) each row is its own
    object, made without grouping; the result is the same (tests compare both)."""
    ranked = state.with_columns(
        identity_key().alias(_KEY),
        _d=pl.col("dialect").replace_strict(DIALECT_RANK, default=9, return_dtype=pl.Int8),
        _s=pl.col("state").replace_strict(STATE_RANK, default=9, return_dtype=pl.Int8),
    )
    if shortcut and ranked.get_column(_KEY).is_unique().all():
        out = _one_reporter_each(ranked)
    else:
        out = _grouped(ranked)
    return out.sort("broker", "package", "class_name", "name", "create_ns", "agent", "object_id",
                    nulls_last=True)  # fmt: skip


def _grouped(ranked: pl.DataFrame) -> pl.DataFrame:
    ordered = ranked.sort("_d", "agent", "object_id", "create_ns")
    first = ordered.group_by(_KEY, maintain_order=True).agg(
        pl.col(*_FIRST).first(),
        *(agg(pl.col(c)) for c, agg in _SPANS.items()),
        pl.struct("agent", "dialect", "object_id").alias("reporters"),
    )
    # The latest properties any reporter carried (the first reporter's on a tie).
    props = (
        ordered.filter(pl.col("properties_ns").is_not_null())
        .sort("properties_ns", descending=True, maintain_order=True)
        .group_by(_KEY, maintain_order=True)
        .agg(pl.col("properties", "properties_ns").first())
    )
    # The deciding reporter's end: deleted before live before lost; among equals the
    # latest end (a restart the later reporter saw), then the first reporter.
    ends = (
        ordered.sort(
            "_s", "ended_at", descending=[False, True], nulls_last=True, maintain_order=True
        )
        .group_by(_KEY, maintain_order=True)
        .agg(pl.col("state", "end_reason", "ended_at").first())
    )
    return first.join(props, on=_KEY, how="left").join(ends, on=_KEY, how="left").drop(_KEY)


def _one_reporter_each(ranked: pl.DataFrame) -> pl.DataFrame:
    """``_grouped``'s rows when every group is one row: its own values (a one-row group's
    min, max, sum and first), in ``_grouped``'s columns and types."""
    has_props = pl.col("properties_ns").is_not_null()
    rows = ranked.select(
        pl.col(*_FIRST, *_SPANS),
        pl.concat_list(pl.struct("agent", "dialect", "object_id")).alias("reporters"),
        pl.when(has_props).then(pl.col("properties")).alias("properties"),
        pl.col("properties_ns"),
        pl.col("state", "end_reason", "ended_at"),
    )
    return rows.cast(_grouped(ranked.clear()).schema)


_FIRST = ("agent", "dialect", "package", "class_name", "object_id", "index_key", "name", "broker",
          "create_ns", "generation")  # fmt: skip
# A group's span over its reporters: the earliest start, the latest end, the sums.
_SPANS = {
    "created_at": pl.Expr.min, "deleted_at": pl.Expr.max, "first_seen": pl.Expr.min,
    "last_seen": pl.Expr.max, "first_seen_ns": pl.Expr.min, "last_seen_ns": pl.Expr.max,
    "samples": pl.Expr.sum, "batch_id": pl.Expr.max,
}  # fmt: skip
