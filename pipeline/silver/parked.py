"""Parked messages between batches: what the driver keeps is a summary by schema key.

A message whose schema is missing parks whole, with its bytes, in the ``parked``
table (written by the task that decoded it). The driver keeps, across batches,
only the *pending summary*: one row per (stored key, missing key) with the
number of messages and the oldest receive time. ``stored`` is the key the row
was parked with (the ``missing`` column of the table); ``missing`` is what it
waits for now, which differs when a message decoded again parked for another
of its classes. A batch that brings a schema some summary row waits for
decodes the messages stored under that row's key again, in tasks that read
the ``parked`` table's files (``pipeline.silver.tasks.resolve_task``); the
summary is then replaced for those stored keys. So the driver's memory grows
with the keys that wait, never with the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec.schema import SchemaRegistry
from pipeline.lake import delta
from pipeline.silver.decode import parse_key_text
from schemas.tables import TS

PENDING = pa.schema(
    [
        pa.field("stored", pa.string(), nullable=False),
        pa.field("missing", pa.string(), nullable=False),
        pa.field("messages", pa.int64(), nullable=False),
        pa.field("oldest", TS, nullable=False),
    ]
)


def summarize(parked: pa.Table, stored: pa.Array | pa.ChunkedArray | None = None) -> pa.Table:
    """The pending summary of parked rows (``missing``, ``received_at``); ``stored``:
    the key each row is stored under, when not its ``missing`` (a row decoded again)."""
    if parked.num_rows == 0:
        return PENDING.empty_table()
    missing = parked.column("missing")
    t = pa.table(
        {
            "stored": missing if stored is None else stored,
            "missing": missing,
            "received_at": parked.column("received_at").cast(TS),
        }
    )
    return _grouped(t, "received_at")


def merge(parts: Iterable[pa.Table]) -> pa.Table:
    """One summary of several (the same key pair summed)."""
    tables = [p for p in parts if p.num_rows]
    if not tables:
        return PENDING.empty_table()
    t = pa.concat_tables([p.select(PENDING.names).cast(PENDING) for p in tables])
    return _grouped(t, "oldest", count="messages")


def _grouped(t: pa.Table, time: str, count: str | None = None) -> pa.Table:
    aggs: list[tuple[str, str]] = [(time, "min")]
    aggs.append((count, "sum") if count else ("missing", "count"))
    g = t.group_by(["stored", "missing"], use_threads=False).aggregate(aggs)
    n = g.column(f"{count}_sum" if count else "missing_count")
    out = pa.table(
        {
            "stored": g.column("stored"),
            "missing": g.column("missing"),
            "messages": n.cast(pa.int64()),
            "oldest": g.column(f"{time}_min"),
        }
    ).cast(PENDING)
    return out.sort_by([("stored", "ascending"), ("missing", "ascending")])


def without(table: pa.Table, other: pa.Table) -> pa.Table:
    """Rows of ``table`` whose (partition, offset) is not in ``other``."""
    drop = set(
        zip(other.column("partition").to_pylist(), other.column("offset").to_pylist(), strict=True)
    )
    if not drop:
        return table
    keep = [
        k not in drop
        for k in zip(
            table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
        )
    ]
    return table.filter(pa.array(keep, pa.bool_()))


def from_tables(parked: str, resolved: str, app_id: str, batch_id: int) -> pa.Table:
    """The pending summary as of before ``batch_id``, from the tables: the parked rows'
    keys and times only (no bodies), less the resolved ones. Read once, when a writer
    starts or resumes at another batch; afterwards the writer carries it on."""
    cols = ["partition", "offset", "missing", "received_at"]
    schema, files = delta.files_before_batch(parked, app_id, batch_id)
    if not files:
        return PENDING.empty_table()
    rows = pa.concat_tables([delta.read_data_file(f, schema, cols) for f in files])
    rschema, rfiles = delta.files_before_batch(resolved, app_id, batch_id)
    if rfiles:
        done = pa.concat_tables(
            [delta.read_data_file(f, rschema, ["partition", "offset"]) for f in rfiles]
        )
        rows = without(rows, done)
    return summarize(rows)


def decodable(pending: pa.Table, known: SchemaRegistry) -> list[str]:
    """The ``missing`` keys of a summary that ``known`` now holds."""
    return sorted(
        m for m in set(pending.column("missing").to_pylist()) if parse_key_text(m) in known
    )


def retry_keys(pending: pa.Table, known: SchemaRegistry) -> list[str]:
    """The stored keys whose messages must be decoded again: some of them wait for a
    schema ``known`` now holds."""
    now = set(decodable(pending, known))
    return sorted(
        {
            s
            for s, m in zip(
                pending.column("stored").to_pylist(), pending.column("missing").to_pylist(),
                strict=True,
            )
            if m in now
        }
    )


def keep_others(pending: pa.Table, stored: Sequence[str]) -> pa.Table:
    """The summary rows not stored under ``stored`` (those were decoded again)."""
    if not stored or pending.num_rows == 0:
        return pending
    mask = pc.invert(pc.is_in(pending.column("stored"), pa.array(list(stored), pa.string())))
    return pending.filter(mask)


def stale(pending: pa.Table, max_age_s: float) -> pa.Table:
    """Summary rows whose oldest message has waited longer than ``max_age_s``."""
    if pending.num_rows == 0:
        return pending
    limit = pa.scalar(datetime.now(UTC) - timedelta(seconds=max_age_s), TS)
    return pending.filter(pc.less(pending.column("oldest"), limit))
