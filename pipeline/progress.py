"""What a running pipeline shows its user: a live progress line and an end-of-run summary.

Both read the Delta tables as they are on disk (no Spark): row counts come from
the add actions' ``numRecords`` (``pipeline.delta`` writes it for every file,
from the Parquet footer's row count, which always exists), and the summary
reads only the columns it needs, file by file. Its cost is bounded however
long the run was: the top queues come from the newest ``SUMMARY_RATE_ROWS``
rate rows (a 30-minute run at 10,000 queues writes ~400M; reading them whole
took 23 GB and the kernel killed ``qmf run`` at its end).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

ENQUEUE_STATISTIC = "msgTotalEnqueues"
SUMMARY_RATE_ROWS = 5_000_000  # newest statistic_rates rows the end-of-run summary reads
_RATE_COLS = ["agent", "class_name", "index_key", "object_id", "statistic", "rate"]
SEVERITIES = ("emerg", "alert", "crit", "error", "warn", "notice", "info", "debug")


def table_rows(path: str | os.PathLike[str]) -> int:
    """Rows of a Delta table from its log (0 while it does not exist)."""
    from deltalake import DeltaTable

    from pipeline import delta

    if not delta.table_exists(path):
        return 0
    actions = DeltaTable(str(path)).get_add_actions(flatten=True)
    col = pa.table(actions).column("num_records")
    return int(pc.sum(col).as_py() or 0)


@dataclass
class Rates:
    """Turns successive totals into per-second rates (one progress line to the next)."""

    last: dict[str, tuple[float, int]] = field(default_factory=dict)

    def per_s(self, name: str, total: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        prev = self.last.get(name)
        self.last[name] = (now, total)
        if prev is None or now <= prev[0]:
            return 0.0
        return (total - prev[1]) / (now - prev[0])


def progress_line(
    elapsed_s: float, landed: int, bronze: int, counts: Mapping[str, int], rates: Rates
) -> str:
    """``12.3s in 410 msg/s | bronze 4,000 (lag 80) | decoded 21,000 rec/s | rows …``."""
    samples = counts.get("object_samples", 0)
    parts = [
        f"{elapsed_s:6.1f}s",
        f"in {rates.per_s('landed', landed):,.0f} msg/s ({landed:,} landed)",
        f"bronze {bronze:,} (lag {max(landed - bronze, 0):,})",
        f"decoded {rates.per_s('samples', samples):,.0f} samples/s",
        "rows " + " ".join(f"{k}={v:,}" for k, v in counts.items() if k != "quarantine"),
        f"quarantine {counts.get('quarantine', 0):,}",
    ]
    return "qmf run: " + " | ".join(parts)


def _columns_schema(path: str, columns: list[str]) -> pa.Schema:
    """The table's fields ``columns``, nullable (as ``delta.iter_batches`` yields them)."""
    from pipeline import delta

    return pa.schema([delta.table_schema(path).field(c).with_nullable(True) for c in columns])


def _read(path: str, columns: list[str]) -> pa.Table | None:
    """Only ``columns`` of the table, file by file (None while it does not exist)."""
    from pipeline import delta

    if not delta.table_exists(path):
        return None
    schema = _columns_schema(path, columns)
    return pa.Table.from_batches(list(delta.iter_batches(path, columns, 65_536)), schema=schema)


def _queue_rates(path: str, max_rows: int) -> tuple[pa.Table | None, int, int]:
    """The enqueue-rate rows of queues among the newest ``max_rows`` rate rows,
    filtered file by file (memory: the matching rows only); and rows read / in all."""
    import pyarrow.parquet as pq

    from pipeline import delta

    if not delta.table_exists(path):
        return None, 0, 0
    files, taken, total = delta.newest_files(path, max_rows)
    schema = _columns_schema(path, _RATE_COLS)
    parts: list[pa.Table] = []
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=262_144, columns=_RATE_COLS):
            keep = pc.and_(pc.equal(b.column("class_name"), "queue"),
                           pc.equal(b.column("statistic"), ENQUEUE_STATISTIC))  # fmt: skip
            if pc.any(keep).as_py():
                parts.append(pa.Table.from_batches([b.filter(keep)]).cast(schema))
    return (pa.concat_tables(parts) if parts else schema.empty_table()), taken, total


def top_queues(rates: pa.Table, n: int = 5) -> list[dict[str, Any]]:
    """Queues by their mean enqueue rate over the run (rated intervals only)."""
    t = rates.filter(
        pc.and_(
            pc.equal(rates["class_name"], "queue"),
            pc.and_(pc.equal(rates["statistic"], ENQUEUE_STATISTIC), pc.is_valid(rates["rate"])),
        )
    )
    if t.num_rows == 0:
        return []
    name = pc.coalesce(t["index_key"], t["object_id"])
    g = pa.table({"agent": t["agent"], "queue": name, "rate": t["rate"]}).group_by(
        ["agent", "queue"]
    ).aggregate([("rate", "mean"), ("rate", "count")])
    g = g.sort_by([("rate_mean", "descending"), ("queue", "ascending")]).slice(0, n)
    return [
        {"agent": r["agent"], "queue": r["queue"], "enqueue_rate": round(r["rate_mean"], 3),
         "intervals": r["rate_count"]}
        for r in g.to_pylist()
    ]  # fmt: skip


def summary(root: str | os.PathLike[str], rate_rows: int = SUMMARY_RATE_ROWS) -> dict[str, Any]:
    """The end-of-run summary of the tables under ``root`` (bronze, silver/, gold/)."""
    root = str(root)
    out: dict[str, Any] = {"bronze_rows": table_rows(os.path.join(root, "bronze"))}
    silver = os.path.join(root, "silver")
    for name in ("object_samples", "events", "heartbeats", "agents", "quarantine", "parked"):
        out[f"silver_{name}"] = table_rows(os.path.join(silver, name))
    gold = os.path.join(root, "gold")
    rates, taken, total = _queue_rates(os.path.join(gold, "statistic_rates"), rate_rows)
    out["top_queues_by_enqueue_rate"] = [] if rates is None else top_queues(rates)
    if taken < total:
        out["top_queues_over"] = f"the newest {taken:,} of {total:,} rate rows"
    life = _read(os.path.join(gold, "object_lifecycles"),
                 ["created_at", "deleted_at", "first_seen_ns", "last_seen_ns", "state"])  # fmt: skip
    if life is not None:
        created = pc.is_valid(life["created_at"])
        deleted = pc.is_valid(life["deleted_at"])
        # Created and deleted between two publications: one publication shows both.
        once = pc.equal(life["first_seen_ns"], life["last_seen_ns"])
        out["objects"] = {
            "seen": life.num_rows,
            "created": int(pc.sum(created).as_py() or 0),
            "deleted": int(pc.sum(deleted).as_py() or 0),
            "transient": int(pc.sum(pc.and_(pc.and_(created, deleted), once)).as_py() or 0),
            "by_state": _counts(life["state"]),
        }
    events = _read(os.path.join(silver, "events"), ["severity"])
    if events is not None:
        sev = events["severity"].to_pylist()
        names = [SEVERITIES[s] if s is not None and 0 <= s < len(SEVERITIES) else str(s)
                 for s in sev]  # fmt: skip
        out["events_by_severity"] = dict(sorted(_counts(pa.array(names, pa.string())).items()))
    live = _read(os.path.join(gold, "agent_liveness"), ["agent", "state", "started_by"])
    if live is not None:
        out["agents"] = {
            "seen": len(set(live["agent"].to_pylist())),
            "intervals_by_state": _counts(live["state"]),
            "restarts": int(pc.sum(pc.equal(live["started_by"], "restart")).as_py() or 0),
        }
    return out


def _counts(col: pa.Array | pa.ChunkedArray) -> dict[str, int]:
    vc = pc.value_counts(col)
    return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}
