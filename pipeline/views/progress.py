"""What a running pipeline shows its user: a live progress line and an end-of-run summary.

The progress line is redrawn in place on a terminal (rich) and printed line by
line elsewhere (a pipe, a log: ``qmf soak`` parses those lines). The summary is
a dict (``qmf run --json`` prints it) and, for people, tables named as a person
names things: queues and agents by the gold lifecycles' ``name`` and ``broker``
(rates carry ids only: they are joined on ``(agent, object_id)``).

Both read the Delta tables as they are on disk (no Spark): row counts come from
the add actions' ``numRecords`` (``pipeline.lake.delta`` writes it for every file,
from the Parquet footer's row count, which always exists), and the summary
reads only the columns it needs, file by file. Its cost is bounded however
long the run was: the top queues come from the newest ``SUMMARY_RATE_ROWS``
rate rows (a 30-minute run at 10,000 queues writes ~400M; reading them whole
took 23 GB and the kernel killed ``qmf run`` at its end).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live

ENQUEUE_STATISTIC = "msgTotalEnqueues"
SUMMARY_RATE_ROWS = 5_000_000  # newest statistic_rates rows the end-of-run summary reads
_RATE_COLS = ["agent", "dialect", "class_name", "index_key", "object_id", "statistic", "rate"]
SEVERITIES = ("emerg", "alert", "crit", "error", "warn", "notice", "info", "debug")


def table_rows(path: str | os.PathLike[str]) -> int:
    """Rows of a Delta table from its log (0 while it does not exist)."""
    from pipeline.lake import delta, storage

    if not delta.table_exists(path):
        return 0
    actions = storage.rs_table(path).get_add_actions(flatten=True)
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


@dataclass(frozen=True)
class ProgressStats:
    """One progress observation: totals and the rates since the previous one."""

    elapsed_s: float
    landed: int
    bronze: int
    counts: Mapping[str, int]
    in_per_s: float
    samples_per_s: float

    def line(self) -> str:
        """``qmf run:  12.3s | in 410 msg/s (4,000 landed) | bronze 4,000 (lag 80) | …``:
        every table's rows (``qmf soak`` parses this form)."""
        counts = self.counts
        parts = [
            f"{self.elapsed_s:6.1f}s",
            f"in {self.in_per_s:,.0f} msg/s ({self.landed:,} landed)",
            f"bronze {self.bronze:,} (lag {max(self.landed - self.bronze, 0):,})",
            f"decoded {self.samples_per_s:,.0f} samples/s",
            "rows " + " ".join(f"{k}={v:,}" for k, v in counts.items() if k != "quarantine"),
            f"quarantine {counts.get('quarantine', 0):,}",
        ]
        return "qmf run: " + " | ".join(parts)

    def compact(self) -> str:
        """The same for a terminal line: silver and gold rows summed per layer."""
        silver = sum(self.counts.get(k, 0) for k in SILVER_PROGRESS)
        gold = sum(self.counts.get(k, 0) for k in GOLD_PROGRESS)
        return (
            f"qmf run {self.elapsed_s:.0f}s | in {self.in_per_s:,.0f} msg/s, {self.landed:,} "
            f"landed | bronze {self.bronze:,} (lag {max(self.landed - self.bronze, 0):,}) | "
            f"{self.samples_per_s:,.0f} samples/s | rows: silver {silver:,}, gold {gold:,} | "
            f"quarantine {self.counts.get('quarantine', 0):,}"
        )


SILVER_PROGRESS = ("object_samples", "events", "heartbeats")
GOLD_PROGRESS = ("statistic_rates", "object_lifecycles", "agent_liveness")


def progress_stats(
    elapsed_s: float, landed: int, bronze: int, counts: Mapping[str, int], rates: Rates
) -> ProgressStats:
    """Totals now, with their rates since the last call (``rates`` remembers)."""
    samples = counts.get("object_samples", 0)
    return ProgressStats(
        elapsed_s, landed, bronze, dict(counts),
        rates.per_s("landed", landed), rates.per_s("samples", samples),
    )  # fmt: skip


def progress_line(
    elapsed_s: float, landed: int, bronze: int, counts: Mapping[str, int], rates: Rates
) -> str:
    """``12.3s in 410 msg/s | bronze 4,000 (lag 80) | decoded 21,000 rec/s | rows …``."""
    return progress_stats(elapsed_s, landed, bronze, counts, rates).line()


class ProgressDisplay:
    """Where the progress goes: one line redrawn in place on a terminal, one printed
    line per update elsewhere. While the live line shows, whatever else is written to
    stdout or stderr (our warnings) is printed above it."""

    def __init__(
        self, file: IO[str] | None = None, live: bool | None = None, width: int | None = None
    ) -> None:
        self.file = sys.stdout if file is None else file
        self.live = _isatty(self.file) if live is None else live
        self.width = width  # None: the terminal's (a longer line folds onto the next)
        self._live: Live | None = None

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            console = Console(file=self.file, force_terminal=True, width=self.width)
            self._live = Live(Text(""), console=console, auto_refresh=False, transient=False,
                              redirect_stdout=True, redirect_stderr=True)  # fmt: skip
            self._live.start()
        return self

    def update(self, stats: ProgressStats) -> None:
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(stats.compact(), overflow="fold"), refresh=True)
        else:
            print(stats.line(), file=self.file, flush=True)

    def close(self) -> None:
        """End the live line (it stays on the screen as the last state)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()


def _isatty(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


def _columns_schema(path: str, columns: list[str]) -> pa.Schema:
    """The table's fields ``columns``, nullable (as ``delta.iter_batches`` yields them)."""
    from pipeline.lake import delta

    return pa.schema([delta.table_schema(path).field(c).with_nullable(True) for c in columns])


def _read(path: str, columns: list[str]) -> pa.Table | None:
    """Only ``columns`` of the table, file by file (None while it does not exist)."""
    from pipeline.lake import delta

    if not delta.table_exists(path):
        return None
    schema = _columns_schema(path, columns)
    return pa.Table.from_batches(list(delta.iter_batches(path, columns, 65_536)), schema=schema)


def _queue_rates(path: str, max_rows: int) -> tuple[pa.Table | None, int, int]:
    """The enqueue-rate rows of queues among the newest ``max_rows`` rate rows,
    filtered file by file (memory: the matching rows only); and rows read / in all."""
    from pipeline.lake import delta, storage

    if not delta.table_exists(path):
        return None, 0, 0
    files, taken, total = delta.newest_files(path, max_rows)
    schema = _columns_schema(path, _RATE_COLS)
    parts: list[pa.Table] = []
    for f in files:
        for b in storage.parquet_file(f).iter_batches(batch_size=262_144, columns=_RATE_COLS):
            keep = pc.and_(pc.equal(b.column("class_name"), "queue"),
                           pc.equal(b.column("statistic"), ENQUEUE_STATISTIC))  # fmt: skip
            if pc.any(keep).as_py():
                parts.append(pa.Table.from_batches([b.filter(keep)]).cast(schema))
    return (pa.concat_tables(parts) if parts else schema.empty_table()), taken, total


@dataclass(frozen=True)
class Named:
    """An object's current name and broker (its latest lifecycle row)."""

    name: str | None
    broker: str | None
    batch_id: int
    last_seen_ns: int


Names = Mapping[tuple[str, str], Named]  # (agent, object_id) -> its name and broker
_LIFE_COLS = ["agent", "class_name", "object_id", "index_key", "created_at", "deleted_at",
              "first_seen_ns", "last_seen_ns", "state", "batch_id"]  # fmt: skip
_NAME_COLS = ["name", "broker"]  # gold's names; absent from tables written before them


def _lifecycles(path: str) -> pa.Table | None:
    """A lifecycle table's summary columns, or None where gold has not made it."""
    from pipeline.lake import delta

    if not delta.table_exists(path):
        return None
    return _read(path, _table_columns(path, _LIFE_COLS + _NAME_COLS))


def lifecycle_names(life: pa.Table) -> dict[tuple[str, str], Named]:
    """The latest row per ``(agent, object_id)`` (max ``batch_id``, then ``last_seen_ns``):
    the name and broker an object has now. Null where the table predates the columns."""
    cols = {c: life[c].to_pylist() for c in ("agent", "object_id", "batch_id", "last_seen_ns")}
    names = life["name"].to_pylist() if "name" in life.column_names else None
    brokers = life["broker"].to_pylist() if "broker" in life.column_names else None
    out: dict[tuple[str, str], Named] = {}
    for i, key in enumerate(zip(cols["agent"], cols["object_id"], strict=True)):
        row = Named(
            names[i] if names is not None else None, brokers[i] if brokers is not None else None,
            int(cols["batch_id"][i] or 0), int(cols["last_seen_ns"][i] or 0),
        )  # fmt: skip
        cur = out.get(key)
        if cur is None or (row.batch_id, row.last_seen_ns) >= (cur.batch_id, cur.last_seen_ns):
            out[key] = row
    return out


def agent_brokers(names: Names) -> dict[str, str]:
    """Each agent's broker identity: the broker of its most recently seen named object."""
    best: dict[str, tuple[tuple[int, int], str]] = {}
    for (agent, _), n in names.items():
        if n.broker:
            rank = (n.batch_id, n.last_seen_ns)
            if agent not in best or rank >= best[agent][0]:
                best[agent] = (rank, n.broker)
    return {a: b for a, (_, b) in best.items()}


def _latest(names: Names, agent: str, object_ids: Iterable[str]) -> Named | None:
    """Of an object's series (one id per agent restart), the latest lifecycle's names."""
    rows = [n for oid in object_ids if (n := names.get((agent, oid))) is not None]
    return max(rows, key=lambda n: (n.batch_id, n.last_seen_ns)) if rows else None


def top_queues(rates: pa.Table, n: int = 5, names: Names | None = None) -> list[dict[str, Any]]:
    """Queues by their mean enqueue rate over the run (rated intervals only), named by
    their latest lifecycle (else by their index key's last value, else the object id)
    and their broker (else their agent).

    One queue is one (broker, name): its rows under every object id (a restart renumbers
    it) and key form (statistics before its properties) count together, and a broker that
    publishes it through several agents (qpidd's QMF v1 and v2) lists it once, from the
    agent with the most rated intervals (V2 on a tie)."""
    from pipeline.views.live import key_name

    t = rates.filter(
        pc.and_(
            pc.equal(rates["class_name"], "queue"),
            pc.and_(pc.equal(rates["statistic"], ENQUEUE_STATISTIC), pc.is_valid(rates["rate"])),
        )
    )
    if t.num_rows == 0:
        return []
    import polars as pl

    from pipeline.gold.transforms import series_key

    names = names or {}
    brokers = agent_brokers(names)
    # One row per (agent, series): a series keeps its key across a restart (series_key),
    # named by the latest of its objects; rows keyed by an object id (statistics before
    # the properties) join their queue by that name below.
    frame = pl.from_arrow(pa.table({
        "agent": t["agent"], "object_id": t["object_id"],
        "dialect": t["dialect"] if "dialect" in t.column_names else pa.nulls(t.num_rows, pa.string()),
        "index_key": t["index_key"], "rate": t["rate"],
    }))  # fmt: skip
    assert isinstance(frame, pl.DataFrame)
    g = (
        frame.with_columns(series=pl.coalesce(series_key(), pl.col("object_id")))
        .group_by("agent", "series")
        .agg(pl.col("rate").sum().alias("rate_sum"), pl.len().alias("rate_count"),
             pl.col("object_id").unique().alias("oids"), pl.col("index_key").max())
    )  # fmt: skip
    queues: dict[tuple[str, str, str], list[Any]] = {}  # (broker, agent, name) -> sums
    for r in g.iter_rows(named=True):
        oids = sorted(r["oids"])
        named = _latest(names, r["agent"], oids)
        name = (named.name if named is not None else None) or key_name(r["index_key"], oids[-1])
        broker = (named.broker if named is not None else None) or brokers.get(r["agent"]) or r["agent"]
        acc = queues.setdefault((broker, r["agent"], name), [0.0, 0, r["index_key"]])
        acc[0] += r["rate_sum"]
        acc[1] += r["rate_count"]
        acc[2] = acc[2] or r["index_key"]
    best: dict[tuple[str, str], tuple[tuple[int, bool], str, list[Any]]] = {}
    for (broker, agent, name), acc in queues.items():
        rank = (acc[1], ":" in agent)  # most intervals; a v2 agent's name has colons
        if (broker, name) not in best or rank > best[(broker, name)][0]:
            best[(broker, name)] = (rank, agent, acc)
    out = [
        {"agent": agent, "queue": acc[2] or name, "name": name, "broker": broker,
         "enqueue_rate": round(acc[0] / acc[1], 3), "intervals": acc[1]}
        for (broker, name), (_, agent, acc) in best.items()
    ]  # fmt: skip
    out.sort(key=lambda q: (-q["enqueue_rate"], q["queue"]))
    return out[:n]


def _table_columns(path: str, wanted: Iterable[str]) -> list[str]:
    """Those of ``wanted`` the table has (its log's schema)."""
    from pipeline.lake import delta

    have = set(delta.table_schema(path).names)
    return [c for c in wanted if c in have]


def _objects(life: pa.Table) -> dict[str, Any]:
    """Objects seen, created, deleted and transient, in all and per class."""
    created = pc.is_valid(life["created_at"])
    deleted = pc.is_valid(life["deleted_at"])
    # Created and deleted between two publications: one publication shows both.
    once = pc.equal(life["first_seen_ns"], life["last_seen_ns"])
    transient = pc.and_(pc.and_(created, deleted), once)
    flags = pa.table({
        "class_name": life["class_name"], "created": pc.cast(created, pa.int64()),
        "deleted": pc.cast(deleted, pa.int64()), "transient": pc.cast(transient, pa.int64()),
        "live": pc.cast(pc.equal(life["state"], "live"), pa.int64()),
    })  # fmt: skip
    per = flags.group_by("class_name").aggregate(
        [("class_name", "count"), ("created", "sum"), ("deleted", "sum"), ("transient", "sum"),
         ("live", "sum")]
    )  # fmt: skip
    by_class = {
        r["class_name"]: {"seen": r["class_name_count"], "created": r["created_sum"],
                          "deleted": r["deleted_sum"], "transient": r["transient_sum"],
                          "live": r["live_sum"]}
        for r in per.sort_by("class_name").to_pylist()
    }  # fmt: skip
    return {
        "seen": life.num_rows,
        "created": int(pc.sum(created).as_py() or 0),
        "deleted": int(pc.sum(deleted).as_py() or 0),
        "transient": int(pc.sum(transient).as_py() or 0),
        "by_state": _counts(life["state"]),
        "by_class": by_class,
    }


def _agents(live: pa.Table, brokers: Mapping[str, str]) -> dict[str, Any]:
    """Agents seen, their up intervals by state and restarts; per agent its broker and
    its latest interval's state."""
    rows = sorted(live.to_pylist(), key=lambda r: (r["agent"], r["up_start_ns"] or 0))
    per: dict[str, dict[str, Any]] = {}
    for r in rows:
        a = per.setdefault(r["agent"], {
            "agent": r["agent"], "broker": brokers.get(r["agent"], r["agent"]),
            "dialect": r["dialect"], "intervals": 0, "restarts": 0, "heartbeats": 0,
        })  # fmt: skip
        a["intervals"] += 1
        a["restarts"] += r["started_by"] == "restart"
        a["heartbeats"] += int(r["heartbeats"] or 0)
        a["state"] = r["state"]  # the latest interval's, rows being in start order
    return {
        "seen": len(per),
        "intervals_by_state": _counts(live["state"]),
        "restarts": int(pc.sum(pc.equal(live["started_by"], "restart")).as_py() or 0),
        "by_agent": sorted(per.values(), key=lambda a: (a["broker"], a["agent"])),
    }


def summary(root: str | os.PathLike[str], rate_rows: int = SUMMARY_RATE_ROWS) -> dict[str, Any]:
    """The end-of-run summary of the tables under ``root`` (bronze, silver/, gold/)."""
    from pipeline.lake import storage

    root = os.fspath(root)
    out: dict[str, Any] = {"bronze_rows": table_rows(storage.join(root, "bronze"))}
    silver = storage.join(root, "silver")
    for name in ("object_samples", "events", "heartbeats", "agents", "quarantine", "parked"):
        out[f"silver_{name}"] = table_rows(storage.join(silver, name))
    gold = storage.join(root, "gold")
    # Names per (agent, object_id) from each agent's lifecycle rows; objects counted
    # once from their fold (``object_lifecycles``: qpidd's v1 and v2 agents are one).
    state = _lifecycles(storage.join(gold, "lifecycle_state"))
    life = _lifecycles(storage.join(gold, "object_lifecycles"))
    names = lifecycle_names(state) if state is not None else {}
    rates, taken, total = _queue_rates(storage.join(gold, "statistic_rates"), rate_rows)
    out["top_queues_by_enqueue_rate"] = [] if rates is None else top_queues(rates, names=names)
    if taken < total:
        out["top_queues_over"] = f"the newest {taken:,} of {total:,} rate rows"
    if life is not None:
        out["objects"] = _objects(life)
    events = _read(storage.join(silver, "events"), ["severity"])
    if events is not None:
        sev = events["severity"].to_pylist()
        labels = [SEVERITIES[s] if s is not None and 0 <= s < len(SEVERITIES) else str(s)
                  for s in sev]  # fmt: skip
        out["events_by_severity"] = dict(sorted(_counts(pa.array(labels, pa.string())).items()))
    live_cols = ["agent", "dialect", "state", "started_by", "up_start_ns", "heartbeats"]
    live = _read(storage.join(gold, "agent_liveness"), live_cols)
    if live is not None:
        out["agents"] = _agents(live, agent_brokers(names))
    return out


def _counts(col: pa.Array | pa.ChunkedArray) -> dict[str, int]:
    vc = pc.value_counts(col)
    return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}


# ---------------------------------------------------------------------------- for people


def _table(
    title: str,
    columns: Iterable[tuple[str, str]],
    rows: Iterable[Iterable[Any]],
    caption: str | None = None,
    total: Iterable[Any] | None = None,
) -> RenderableType:
    """A rich table: ``columns`` are (header, justify); ``total`` a last row, set apart."""
    from rich.table import Table

    def cells(row: Iterable[Any]) -> list[str]:
        return [f"{v:,}" if isinstance(v, int) else str(v) for v in row]

    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for header, justify in columns:
        t.add_column(header, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*cells(row))
    if total is not None:
        t.add_section()
        t.add_row(*cells(total))
    return t


def summary_tables(s: Mapping[str, Any]) -> list[RenderableType]:
    """The summary as tables for people: top queues, objects, events, agents, pipeline."""
    out: list[RenderableType] = []
    top = s.get("top_queues_by_enqueue_rate") or []
    if top:
        out.append(_table(
            "Top queues by enqueue rate",
            [("queue", "left"), ("broker", "left"), ("msg/s (mean)", "right"),
             ("intervals", "right")],
            ([q["name"], q["broker"], f"{q['enqueue_rate']:,.1f}", q["intervals"]] for q in top),
            caption=f"over {s['top_queues_over']}" if s.get("top_queues_over") else None,
        ))  # fmt: skip
    objects = s.get("objects")
    if objects:
        rows = [[cls, c["seen"], c["created"], c["deleted"], c["transient"], c["live"]]
                for cls, c in objects.get("by_class", {}).items()]  # fmt: skip
        total = ["all", objects["seen"], objects["created"], objects["deleted"],
                 objects["transient"], objects.get("by_state", {}).get("live", 0)]  # fmt: skip
        out.append(_table(
            "Objects",
            [("class", "left"), ("seen", "right"), ("created", "right"), ("deleted", "right"),
             ("transient", "right"), ("live now", "right")],
            rows, total=total,
        ))  # fmt: skip
    events = s.get("events_by_severity")
    if events:
        order = {name: i for i, name in enumerate(SEVERITIES)}
        rows = sorted(events.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
        out.append(_table("Events by severity", [("severity", "left"), ("events", "right")],
                          rows, total=("all", sum(events.values()))))  # fmt: skip
    agents = s.get("agents")
    if agents:
        out.append(_table(
            "Agents",
            [("broker", "left"), ("agent", "left"), ("dialect", "left"), ("state", "left"),
             ("up intervals", "right"), ("restarts", "right")],
            ([a["broker"], a["agent"], a["dialect"], a["state"], a["intervals"], a["restarts"]]
             for a in agents.get("by_agent", [])),
        ))  # fmt: skip
    out.append(_table("Pipeline", [("what", "left"), ("count", "right")], _pipeline_rows(s)))
    return out


_PIPELINE_ROWS = (
    ("landed_messages", "messages landed"),
    ("redeliveries_skipped", "redeliveries skipped"),
    ("bronze_rows", "bronze rows"),
    ("silver_object_samples", "silver object samples"),
    ("silver_events", "silver events"),
    ("silver_heartbeats", "silver heartbeats"),
    ("silver_agents", "silver agent observations"),  # rows: one per agent when new or moved on (agents_touch_s)
    ("silver_quarantine", "quarantine"),
    ("silver_parked", "parked (waiting for a schema)"),
)


def _pipeline_rows(s: Mapping[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, label in _PIPELINE_ROWS:
        if key in s:
            rows.append((label, s[key]))
    if s.get("records_by_opcode") is not None:
        rows.append(("decode problems (bronze decoded again)", s.get("decode_problems", 0)))
    return rows


def print_summary(s: Mapping[str, Any], file: IO[str] | None = None) -> None:
    """The summary's tables on ``file`` (stdout): as wide as the terminal, or as wide as
    they need elsewhere (rich's 80 columns would cut broker and agent names in a log)."""
    from rich.console import Console

    file = sys.stdout if file is None else file
    console = Console(file=file, width=None if _isatty(file) else 200)
    for table in summary_tables(s):
        console.print(table)
    if s.get("summary_skipped"):
        console.print(s["summary_skipped"], highlight=False)
