"""Agent observations of a batch: per (broker, agent, dialect) first/last record time, record
count, latest banks and epoch. Computed per decoded part (a Spark task's, or the
driver's) and merged: every column is a min, max or sum, so parts merge exactly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.silver import AGENTS

if TYPE_CHECKING:
    from pipeline.silver.decode import Decoded


def agent_rows(decoded: Decoded, batch_id: int) -> pa.Table:
    """Per (agent, dialect): first/last record time, record count, latest banks and epoch."""
    parts = []
    for name, tcol in (
        ("object_samples", "update_time"),
        ("heartbeats", "heartbeat_time"),
        ("events", "event_time"),
    ):
        t = decoded.tables.get(name)
        if t is None or t.num_rows == 0:
            continue
        n = t.num_rows
        parts.append(
            pa.table(
                {
                    "broker_name": t.column("broker_name"),
                    "agent": t.column("agent"),
                    "dialect": t.column("dialect"),
                    "t": t.column(tcol),
                    "broker_bank": t.column("broker_bank")
                    if "broker_bank" in t.column_names
                    else pa.nulls(n, pa.int32()),
                    "agent_bank": t.column("agent_bank")
                    if "agent_bank" in t.column_names
                    else pa.nulls(n, pa.int32()),
                    "epoch": t.column("epoch")
                    if "epoch" in t.column_names
                    else pa.nulls(n, pa.int64()),
                }
            )
        )
    if not parts:
        return AGENTS.empty_table()
    all_ = pa.concat_tables(parts)
    all_ = all_.filter(pc.and_(pc.is_valid(all_.column("agent")), pc.is_valid(all_.column("t"))))
    return _aggregate(all_, batch_id, ("t", "min"), ("t", "max"), ("t", "count"))


def merge_agent_rows(parts: Sequence[pa.Table], batch_id: int) -> pa.Table:
    """``agent_rows`` of several parts of one batch as if computed over all of it."""
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return AGENTS.empty_table()
    if len(parts) == 1:
        return parts[0]
    both = pa.concat_tables(parts)
    return _aggregate(
        both, batch_id, ("first_seen", "min"), ("last_seen", "max"), ("records", "sum")
    )


def _aggregate(
    rows: pa.Table,
    batch_id: int,
    first: tuple[str, str],
    last: tuple[str, str],
    records: tuple[str, str],
) -> pa.Table:
    """Per (agent, dialect): ``first``, ``last``, ``records`` (column, aggregate) and the
    latest banks and epoch, as AGENTS rows of ``batch_id``."""
    g = rows.group_by(["broker_name", "agent", "dialect"], use_threads=False).aggregate(
        [first, last, records, ("broker_bank", "max"), ("agent_bank", "max"), ("epoch", "max")]
    )

    def col(spec: tuple[str, str]) -> pa.ChunkedArray:
        return g.column(f"{spec[0]}_{spec[1]}")

    out = pa.table(
        {
            "agent": g.column("agent"),
            "dialect": g.column("dialect"),
            "batch_id": pa.array(np.full(g.num_rows, batch_id, np.int64)),
            "broker_name": g.column("broker_name"),
            "broker_bank": g.column("broker_bank_max"),
            "agent_bank": g.column("agent_bank_max"),
            "epoch": g.column("epoch_max"),
            "first_seen": col(first),
            "last_seen": col(last),
            "records": col(records).cast(pa.int64()),
        }
    )
    order = [("agent", "ascending"), ("dialect", "ascending"), ("broker_name", "ascending")]
    return out.sort_by(order).cast(AGENTS)
