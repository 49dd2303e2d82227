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
    """The folding key: the identity where it is known, else the reporter row's own key."""
    known = (
        pl.col("broker").is_not_null() & pl.col("name").is_not_null() & (pl.col("create_ns") != 0)
    )
    # Two brokers of a fleet may report the same identity (brokers cloned alike): the
    # fleet broker in the agent id (``fleet_agent``) keeps their objects apart.
    fleet = fleet_broker(pl.col("agent"))
    return (
        pl.when(known)
        .then(pl.concat_list(pl.lit("i"), fleet, *[pl.col(c).cast(pl.Utf8) for c in IDENTITY]))
        .otherwise(
            pl.concat_list(
                pl.lit("r"), pl.col("agent"), pl.col("object_id"), pl.col("create_ns").cast(pl.Utf8)
            )
        )
        .list.join("\x1f")
    )


def fold_lifecycles(state: pl.DataFrame) -> pl.DataFrame:
    """``lifecycle_state`` rows -> one ``object_lifecycles`` row per object (see module).

    Sorted by (broker, package, class_name, name, create_ns, agent, object_id), so the
    same state gives the same file."""
    ranked = state.with_columns(
        identity_key().alias(_KEY),
        _d=pl.col("dialect").replace_strict(DIALECT_RANK, default=9, return_dtype=pl.Int8),
        _s=pl.col("state").replace_strict(STATE_RANK, default=9, return_dtype=pl.Int8),
    )
    ordered = ranked.sort("_d", "agent", "object_id", "create_ns")
    first = ordered.group_by(_KEY, maintain_order=True).agg(
        pl.col("agent", "dialect", "package", "class_name", "object_id", "index_key", "name",
               "broker", "create_ns", "generation").first(),
        pl.col("created_at").min(), pl.col("deleted_at").max(),
        pl.col("first_seen").min(), pl.col("last_seen").max(),
        pl.col("first_seen_ns").min(), pl.col("last_seen_ns").max(),
        pl.col("samples").sum(), pl.col("batch_id").max(),
        pl.struct("agent", "dialect", "object_id").alias("reporters"),
    )  # fmt: skip
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
    out = first.join(props, on=_KEY, how="left").join(ends, on=_KEY, how="left")
    return out.sort("broker", "package", "class_name", "name", "create_ns", "agent", "object_id",
                    nulls_last=True).drop(_KEY)  # fmt: skip
