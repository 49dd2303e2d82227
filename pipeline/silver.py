"""The silver job: bronze -> decoded Delta tables, exactly once per table, schemas late or not.

One micro-batch (``SilverBatchWriter.__call__``), streaming or batch:

1. the registry as it was *before* this batch (``RegistryTable.load``: rows
   first written by this app at this batch id or later are left out), so a
   replayed batch decodes exactly as its first attempt;
2. one Spark pass decodes every bronze row into every silver table
   (``pipeline.transforms.silver.decode_bronze``: ``mapInArrow`` over the
   vectorized codec); the compact Arrow results come back to the driver;
3. schemas met in the batch decode the batch's messages that were parked for
   want of them (content before its schema), and the messages parked by
   earlier batches whose schema is now known (read as of before this batch);
4. each non-empty table gets one Parquet file written by pyarrow and one
   Delta commit carrying ``(app_id, batch_id)`` (``pipeline.delta.
   commit_files``): a replay commits nothing twice. ``parked_resolved`` is
   written last, so a crash before it leaves the parked messages pending and
   the replay decodes them again into tables that skip the committed batch;
5. the registry gets the new schemas (merge, same app transaction).

Parked messages older than ``parked_max_age_s`` are reported (log warning,
``SilverBatchWriter.stale_parked``) on every batch until their schema arrives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import delta
from pipeline.bronze import checkpoint_query_id, trigger_kwargs
from pipeline.codec.schema import SchemaRegistry
from pipeline.delta_source import read_batch
from pipeline.registry import (
    DEFAULT_KINDS_FILE,
    RegistryTable,
    SeenSchema,
    StatisticKinds,
    schema_from_row,
)
from pipeline.streaming import await_query
from schemas.silver import AGENTS, METHOD_CALLS, PARKED, RESOLVED, SILVER_TABLES
from schemas.tables import BRONZE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.codec.capture import CapturedMessage
    from pipeline.transforms.silver import Decoded

log = logging.getLogger(__name__)

# Write order: parked_resolved last (see the module docstring).
WRITE_ORDER = (
    "object_samples",
    "events",
    "heartbeats",
    "method_responses",
    "method_calls",
    "agents",
    "quarantine",
    "parked",
    "parked_resolved",
)


@dataclass(frozen=True)
class SilverSettings:
    """What a silver run needs. Tables live under ``root/<name>`` (``path``)."""

    bronze: str
    root: str
    checkpoint: str = ""
    registry: str | None = None
    kinds_file: str | None = DEFAULT_KINDS_FILE
    trigger: str = "availableNow"
    max_files_per_trigger: int | None = None
    parked_max_age_s: float = 3600.0
    registry_touch_s: float = 60.0
    agents_touch_s: float = 60.0
    # Where a micro-batch is decoded: "spark" (mapInArrow on the executors) or "driver"
    # (read the batch's bronze files there with pyarrow, from the offset log's
    # positions, and decode them: no Spark job, less fixed cost per small batch).
    decode_on: str = "spark"
    query_name: str = "qmf_silver"
    # Folder shared with the receiver's console (receivers.schema_wants): the
    # schema keys of parked messages are listed there so the console asks for them.
    schema_wants: str | None = None

    def __post_init__(self) -> None:
        trigger_kwargs(self.trigger)
        if self.decode_on not in ("spark", "driver"):
            raise ValueError(f"decode_on {self.decode_on!r}: expected spark or driver")

    def path(self, name: str) -> str:
        if name == "schema_registry" and self.registry is not None:
            return self.registry
        return os.path.join(self.root, name)

    def source_options(self) -> dict[str, str]:
        """Options of the ``qmf-delta`` read of bronze besides ``path``."""
        if self.max_files_per_trigger is None:
            return {}
        return {"maxFilesPerTrigger": str(self.max_files_per_trigger)}


def ensure_tables(settings: SilverSettings) -> RegistryTable:
    """Create every silver table (idempotent) and seed the registry; returns the registry."""
    for name, schema in SILVER_TABLES.items():
        if name != "schema_registry":
            delta.create_table(settings.path(name), schema, name=name)
    reg = RegistryTable(settings.path("schema_registry"), StatisticKinds.load(settings.kinds_file))
    reg.ensure()
    return reg


# ------------------------------------------------------------------ Delta helpers


# A table of more rows is written as several Parquet files, one per thread:
# pyarrow's writer releases the GIL, and list columns make it the costliest step.
PARALLEL_WRITE_ROWS = 100_000
WRITE_THREADS = max(1, min(4, os.cpu_count() or 1))


def append_arrow(
    path: str, table: pa.Table, schema: pa.Schema, *, app_id: str, batch_id: int
) -> bool:
    """Append one Arrow table as Parquet files, exactly once; False if already committed.

    pyarrow writes the files straight into the table folder (one file, or one
    per thread for a large batch: ``PARALLEL_WRITE_ROWS``) and
    ``pipeline.delta.commit_files`` checks them and commits them together
    with the app transaction.
    """
    table = table.select(schema.names).cast(schema)
    parts = 1
    if table.num_rows > PARALLEL_WRITE_ROWS:
        parts = min(WRITE_THREADS, -(-table.num_rows // PARALLEL_WRITE_ROWS))
    step = -(-table.num_rows // parts)
    token = uuid.uuid4().hex
    names = [f"part-{batch_id:08d}-{token}-{i}.parquet" for i in range(parts)]
    flat = [f.name for f in schema if not pa.types.is_nested(f.type)]
    unique = {"msg_key", "body"}  # no repeats: a dictionary only costs

    def write(i: int) -> None:
        pq.write_table(
            table.slice(i * step, step),
            os.path.join(path, names[i]),
            compression="snappy",
            # Statistics and dictionaries for the flat columns only: the value lists
            # get neither (Delta keeps no stats for nested columns; ~35% of the time).
            write_statistics=flat,
            use_dictionary=[c for c in flat if c not in unique],
        )

    try:
        if parts == 1:
            write(0)
        else:
            with ThreadPoolExecutor(parts, thread_name_prefix="qmf-parquet") as pool:
                list(pool.map(write, range(parts)))
        result = delta.commit_files(
            path, [(n, {}) for n in names], app_id=app_id, batch_id=batch_id
        )
    except BaseException:
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(path, n))
        raise
    if result.skipped:
        for n in names:
            os.remove(os.path.join(path, n))
        return False
    return True


def table_before(path: str, app_id: str, batch_id: int) -> pa.Table:
    """The table as it was before ``app_id`` committed ``batch_id`` (or now, if it has not).

    Commits of one app come in batch order, so the version before the first
    commit of (app_id, >= batch_id) is the state that batch first saw.
    """
    from deltalake import DeltaTable

    done = delta.committed_batch(path, app_id)
    if done is None or done < batch_id:
        return delta.read_arrow(path)
    first: int | None = None
    for h in DeltaTable(path).history():
        if h.get("qmf.app_id") == app_id and int(h.get("qmf.batch_id", -1)) >= batch_id:
            v = int(h["version"])
            first = v if first is None else min(first, v)
    if first is None or first == 0:
        return delta.read_arrow(path) if first is None else delta.read_arrow(path, 0).slice(0, 0)
    return delta.read_arrow(path, first - 1)


def without(table: pa.Table, other: pa.Table) -> pa.Table:
    """Rows of ``table`` whose (partition, offset) is not in ``other`` (small tables: parking)."""
    drop = set(
        zip(other.column("partition").to_pylist(), other.column("offset").to_pylist(), strict=True)
    )
    keep = [
        k not in drop
        for k in zip(
            table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
        )
    ]
    return table.filter(pa.array(keep, pa.bool_()))


def merge_arrow(path: str, table: pa.Table, key: str, *, app_id: str, batch_id: int) -> bool:
    """Upsert Arrow rows on ``key`` (small tables), exactly once; False if already committed.

    Silver's results are Arrow on the driver, so no DataFrame is built for a few rows.
    """
    return not delta.merge_arrow(table, path, keys=[key], app_id=app_id, batch_id=batch_id).skipped


# ------------------------------------------------------------------ method calls


def _call_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Arrival order of a call half: received_at, then bronze identity and record index."""
    if row.get("request_partition") is not None and row.get("response_partition") is None:
        side = "request"
    else:
        side = "response"
    return tuple(row[f"{side}_{c}"] for c in ("at", "partition", "offset", "index"))


def _object_id(dialect: str, raw: bytes | None) -> Any:
    from pipeline.codec.types import Am1ObjectId, Am2ObjectId

    if raw is None:
        return None
    if dialect == "AM1":
        return Am1ObjectId.from_int(int.from_bytes(raw, "big"))
    return Am2ObjectId.from_ints(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big"))


def _am1_classes(samples: pa.Table, wanted: set[Any]) -> dict[Any, tuple[str, str, bytes]]:
    """(package, class, hash) of the wanted AM1 object ids among object samples (latest wins)."""
    from pipeline.codec.types import Am1ObjectId

    if samples.num_rows == 0 or not wanted:
        return {}
    nums = pa.array(sorted({o.object_num for o in wanted}), pa.int64())
    am1 = pc.equal(samples.column("dialect"), "AM1")
    t = samples.filter(pc.and_(am1, pc.is_in(samples.column("object_num"), nums)))
    t = t.sort_by([("batch_id", "ascending"), ("partition", "ascending"),
                   ("offset", "ascending"), ("record_index", "ascending")])  # fmt: skip
    out: dict[Any, tuple[str, str, bytes]] = {}
    cols = ("boot_seq", "bank", "object_num", "package", "class_name", "schema_hash")
    for b, k, n, pkg, cls, h in zip(*(t.column(c).to_pylist() for c in cols), strict=True):
        oid = Am1ObjectId(b, k, n)
        if oid in wanted:
            out[oid] = (pkg, cls, h)
    return out


class MethodCallTable:
    """Pairs v1 'M' requests with 'm' responses across micro-batches into ``method_calls``.

    Pending state: the latest unanswered request of each (dialect, seq), i.e. the
    table's request-only rows (an older request with the same number can no
    longer be answered). A response completes it (one upsert per batch on
    ``call_id``, with the app transaction); a response without a pending request
    gets a response-only row. Arguments are typed with the codec's
    ``MethodContext``: AM1 requests name only an object, whose class comes from
    its object samples (this batch's, else the latest in ``object_samples`` as of
    before the batch); a response is typed with its request's class and method.
    Every input is read as of before the batch, so a replay builds the same rows.
    """

    def __init__(self, path: str, samples_path: str) -> None:
        self.path = path
        self.samples_path = samples_path
        self._after: tuple[int, dict[tuple[str, int], dict[str, Any]]] | None = None

    def pending_before(self, app_id: str, batch_id: int) -> dict[tuple[str, int], dict[str, Any]]:
        if self._after is not None and self._after[0] == batch_id - 1:
            return dict(self._after[1])
        t = table_before(self.path, app_id, batch_id)
        waiting = [
            r
            for r in t.to_pylist()
            if r["request_partition"] is not None and r["response_partition"] is None
        ]
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for r in sorted(waiting, key=_call_order):
            out[(r["dialect"], r["seq"])] = r
        return out

    def _classes(
        self, wanted: set[Any], samples: pa.Table, app_id: str, batch_id: int
    ) -> dict[Any, tuple[str, str, bytes]]:
        """Class key of each wanted AM1 object id: this batch's samples, else the table's
        as of before the batch (read only when this batch's samples do not say)."""
        found = _am1_classes(samples, wanted)
        missing = wanted - set(found)
        if missing:
            found |= _am1_classes(table_before(self.samples_path, app_id, batch_id), missing)
        return found

    def build(
        self,
        parts: pa.Table,
        samples: pa.Table,
        registry: SchemaRegistry,
        app_id: str,
        batch_id: int,
    ) -> pa.Table:
        """This batch's rows to upsert: new requests, completed calls, lone responses."""
        from pipeline.codec.methods import MethodContext, PendingCall
        from pipeline.codec.records import MethodRequest, MethodResponse
        from pipeline.codec.schema import SchemaKey
        from pipeline.codec.vectorized import to_json

        pending = self.pending_before(app_id, batch_id)
        rows = sorted(parts.to_pylist(), key=_call_order)
        if not rows:
            self._after = (batch_id, pending)
            return METHOD_CALLS.empty_table()
        ctx = MethodContext()
        wanted = {
            _object_id("AM1", r["object_id_raw"])
            for r in rows
            if r["dialect"] == "AM1" and r["request_partition"] is not None
        }
        if wanted:
            ctx.objects.update(self._classes(wanted, samples, app_id, batch_id))
        out: dict[str, dict[str, Any]] = {}
        for part in rows:
            d, seq = part["dialect"], part["seq"]
            if part["request_partition"] is not None:
                req = MethodRequest(
                    dialect=d, opcode="M", seq=seq,
                    object_id=_object_id(d, part["object_id_raw"]),
                    method_name=part["method_name"], package=part["package"],
                    class_name=part["class_name"], schema_hash=part["schema_hash"],
                    raw_arguments=part["raw_in"] or b"",
                )  # fmt: skip
                typed, _err = ctx.type_record(req, registry)
                assert isinstance(typed, MethodRequest)
                if typed.arguments is not None:
                    part |= {
                        "package": typed.package, "class_name": typed.class_name,
                        "schema_hash": typed.schema_hash,
                        "arguments_in": to_json(typed.arguments),
                    }  # fmt: skip
                pending[(d, seq)] = part
                out[part["call_id"]] = part
                continue
            call = pending.pop((d, seq), None)
            if call is None:
                out[part["call_id"]] = part  # no request seen: a response-only row
                continue
            call = dict(call)
            for c in ("response_partition", "response_offset", "response_index", "response_at",
                      "agent", "status", "text", "raw_out"):  # fmt: skip
                call[c] = part[c]
            call["batch_id"] = batch_id
            if call["package"] is not None and call["schema_hash"] is not None:
                key = SchemaKey(call["package"], call["class_name"], call["schema_hash"])
                ctx.pending[(d, seq)] = PendingCall(
                    d, seq, _object_id(d, call["object_id_raw"]), key, call["method_name"]
                )
                resp = MethodResponse(
                    dialect=d, opcode="m", seq=seq, status=part["status"],
                    text=part["text"] or "", raw_arguments=part["raw_out"] or b"",
                )  # fmt: skip
                typed_r, _err = ctx.type_record(resp, registry)
                assert isinstance(typed_r, MethodResponse)
                if typed_r.arguments is not None:
                    call["arguments_out"] = to_json(typed_r.arguments)
                del ctx.pending[(d, seq)]
            out[call["call_id"]] = call
        self._after = (batch_id, pending)
        return pa.Table.from_pylist(list(out.values()), schema=METHOD_CALLS)


# ------------------------------------------------------------------ agents


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
    g = all_.group_by(["agent", "dialect"]).aggregate(
        [
            ("t", "min"),
            ("t", "max"),
            ("t", "count"),
            ("broker_bank", "max"),
            ("agent_bank", "max"),
            ("epoch", "max"),
        ]
    )
    out = pa.table(
        {
            "agent": g.column("agent"),
            "dialect": g.column("dialect"),
            "batch_id": pa.array(np.full(g.num_rows, batch_id, np.int64)),
            "broker_bank": g.column("broker_bank_max"),
            "agent_bank": g.column("agent_bank_max"),
            "epoch": g.column("epoch_max"),
            "first_seen": g.column("t_min"),
            "last_seen": g.column("t_max"),
            "records": g.column("t_count").cast(pa.int64()),
        }
    )
    return out.sort_by([("agent", "ascending"), ("dialect", "ascending")]).cast(AGENTS)


# ------------------------------------------------------------------ the writer


@dataclass
class BatchReport:
    """What one micro-batch did (for logs, tests and the benchmark)."""

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)
    new_schemas: int = 0
    resolved: int = 0
    stale_parked: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class SilverBatchWriter:
    """The ``foreachBatch`` function: one bronze micro-batch -> every silver table, exactly once."""

    def __init__(self, settings: SilverSettings, app_id: str | None = None) -> None:
        self.settings = settings
        self._app_id = app_id
        self.registry = ensure_tables(settings)
        self.kinds = self.registry.kinds
        self._reg_cache: tuple[tuple[int, int], SchemaRegistry] | None = None
        # State after the last batch this writer finished: (batch id, registry, pending
        # parked). The next batch id starts from it instead of re-reading the tables
        # (this writer is the only one writing them); any other batch id reloads.
        self._after: tuple[int, SchemaRegistry, pa.Table] | None = None
        self._agents_seen: dict[tuple[str, str], datetime] | None = None
        self.calls = MethodCallTable(settings.path("method_calls"), settings.path("object_samples"))
        self.reports: list[BatchReport] = []
        self.stale_parked: pa.Table = PARKED.empty_table()

    @property
    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = f"qmf-silver-{checkpoint_query_id(self.settings.checkpoint)}"
        return self._app_id

    def _agents_to_write(self, rows: pa.Table) -> pa.Table:
        """Observations of new agents, or of agents last written ``agents_touch_s`` ago or more.

        A commit per batch only to move ``last_seen`` by a second is pure
        fixed cost; ``agents_view`` gives first/last seen to that precision.
        """
        if self._agents_seen is None:
            t = delta.read_arrow(self.settings.path("agents"))
            self._agents_seen = {}
            for a, d, ls in zip(
                *(t.column(c).to_pylist() for c in ("agent", "dialect", "last_seen")), strict=True
            ):
                prev = self._agents_seen.get((a, d))
                self._agents_seen[(a, d)] = ls if prev is None else max(prev, ls)
        keep = []
        for i, (a, d, ls) in enumerate(
            zip(
                *(rows.column(c).to_pylist() for c in ("agent", "dialect", "last_seen")),
                strict=True,
            )
        ):
            prev = self._agents_seen.get((a, d))
            if prev is None or (ls - prev).total_seconds() >= self.settings.agents_touch_s:
                keep.append(i)
                self._agents_seen[(a, d)] = ls
        return rows.take(pa.array(keep, pa.int64()))

    def registry_before(self, batch_id: int) -> SchemaRegistry:
        if self._after is not None and self._after[0] == batch_id - 1:
            return self._after[1].copy()
        from deltalake import DeltaTable

        from pipeline.registry import to_registry, visible_rows

        version = DeltaTable(self.registry.path).version()
        rows = visible_rows(self.registry.table(), self.app_id, batch_id)
        key = (version, rows.num_rows)
        if self._reg_cache is None or self._reg_cache[0] != key:
            self._reg_cache = (key, to_registry(rows))
        return self._reg_cache[1].copy()

    def pending_parked(self, batch_id: int) -> pa.Table:
        """Parked messages not resolved, as of before this batch."""
        if self._after is not None and self._after[0] == batch_id - 1:
            return self._after[2]
        parked = table_before(self.settings.path("parked"), self.app_id, batch_id)
        if parked.num_rows == 0:
            return parked
        resolved = table_before(self.settings.path("parked_resolved"), self.app_id, batch_id)
        if resolved.num_rows == 0:
            return parked
        return without(parked, resolved)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from pipeline.transforms.silver import decode_arrow, decode_bronze, unpack

        t0 = time.perf_counter()
        registry = self.registry_before(batch_id)
        if self.settings.decode_on == "driver":
            bronze = batch_from_offset_log(self.settings, batch_id)
            if bronze is None:
                bronze = df.toArrow()
            decoded = decode_arrow(bronze, registry.copy(), batch_id, self.kinds)
        else:
            decoded = unpack(decode_bronze(df, registry, batch_id, self.kinds).toArrow())
        t1 = time.perf_counter()
        report = self.finish(decoded, registry, batch_id)
        report.seconds["decode"] = t1 - t0
        log.info("silver batch %d: %s", batch_id, report)

    def decode_local(self, bronze: pa.Table, batch_id: int) -> BatchReport:
        """The same batch, decoded on the driver (no Spark): tests, tools, tiny batches."""
        from pipeline.transforms.silver import decode_arrow

        registry = self.registry_before(batch_id)
        decoded = decode_arrow(bronze, registry.copy(), batch_id, self.kinds)
        return self.finish(decoded, registry, batch_id)

    def finish(self, decoded: Decoded, registry: SchemaRegistry, batch_id: int) -> BatchReport:
        """Steps 3-5 of the module docstring on a decoded batch."""
        from pipeline.transforms.silver import (
            CALL_PARTS_T,
            PARKED_T,
            SEEN_T,
            Decoded,
            decode_arrow,
            parse_key_text,
        )

        t0 = time.perf_counter()
        report = BatchReport(batch_id)
        seen_rows = [decoded.get(SEEN_T)]
        ext = registry.copy()
        for r in decoded.get(SEEN_T).to_pylist():
            s = schema_from_row(r)
            if s.key not in ext:
                report.new_schemas += 1
                ext.add(s)
        parts = [decoded]
        parked_now = decoded.get(PARKED_T)
        if parked_now.num_rows and report.new_schemas:
            known = np.array(
                [parse_key_text(m) in ext for m in parked_now.column("missing").to_pylist()]
            )
            if known.any():
                again = decode_arrow(
                    parked_now.filter(pa.array(known)), ext.copy(), batch_id, self.kinds
                )
                decoded.tables[PARKED_T] = parked_now.filter(pa.array(~known))
                parts.append(again)
                seen_rows.append(again.get(SEEN_T))
        resolved = RESOLVED.empty_table()
        pending = self.pending_parked(batch_id)
        if pending.num_rows:
            known = np.array(
                [parse_key_text(m) in ext for m in pending.column("missing").to_pylist()], bool
            )
            if known.any():
                todo = pending.filter(pa.array(known))
                again = decode_arrow(todo, ext.copy(), batch_id, self.kinds)
                still = again.get(PARKED_T)
                again.tables.pop(PARKED_T, None)  # still parked: stays pending, not parked twice
                done = without(todo, still)
                resolved = pa.table(
                    {
                        "partition": done.column("partition"),
                        "offset": done.column("offset"),
                        "batch_id": pa.array(np.full(done.num_rows, batch_id, np.int64)),
                        "parked_batch": done.column("batch_id"),
                    }
                ).cast(RESOLVED)
                parts.append(again)
                seen_rows.append(again.get(SEEN_T))
                report.resolved = resolved.num_rows
        merged = Decoded.concat(parts)
        merged.tables["agents"] = self._agents_to_write(agent_rows(merged, batch_id))
        merged.tables["parked_resolved"] = resolved
        parts = merged.tables.pop(CALL_PARTS_T, None)
        if parts is None:
            parts = METHOD_CALLS.empty_table()
        merged.tables["method_calls"] = self.calls.build(
            parts, merged.get("object_samples"), ext, self.app_id, batch_id
        )
        still = without(pending, resolved)
        self._report_stale(still, merged.get(PARKED_T), report)
        self._ask_for_schemas(still, merged.get(PARKED_T), ext)
        self._after = None
        t1 = time.perf_counter()
        for name in WRITE_ORDER:
            t = merged.tables.get(name)
            if t is None or t.num_rows == 0:
                continue
            report.rows[name] = t.num_rows
            if name == "method_calls":  # completes earlier rows: an upsert, not an append
                if merge_arrow(
                    self.settings.path(name), t, "call_id", app_id=self.app_id, batch_id=batch_id
                ):
                    report.committed.append(name)
                continue
            if append_arrow(
                self.settings.path(name),
                t,
                SILVER_TABLES[name],
                app_id=self.app_id,
                batch_id=batch_id,
            ):
                report.committed.append(name)
        seen = [
            SeenSchema(schema_from_row(r), r["source_agent"], r["first_seen"])
            for t in seen_rows
            for r in t.to_pylist()
        ]
        if self.registry.update(
            seen,
            app_id=self.app_id,
            batch_id=batch_id,
            touch_after_s=self.settings.registry_touch_s,
        ):
            report.committed.append("schema_registry")
        t2 = time.perf_counter()
        report.seconds.update({"resolve": t1 - t0, "write": t2 - t1})
        for sc in seen:
            if sc.schema.key not in ext:
                ext.add(sc.schema)
        self._after = (
            batch_id,
            ext,
            pa.concat_tables(
                [still.select(PARKED.names), merged.get(PARKED_T).select(PARKED.names).cast(PARKED)]
            ),
        )
        self.reports.append(report)
        return report

    def _ask_for_schemas(self, pending: pa.Table, new: pa.Table, known: SchemaRegistry) -> None:
        """List the schema keys parked messages wait for where the console reads them,
        and withdraw the keys decoded since (``receivers.schema_wants``)."""
        if self.settings.schema_wants is None:
            return
        from pipeline.transforms.silver import parse_key_text
        from receivers.schema_wants import SchemaWants

        wants = SchemaWants(self.settings.schema_wants)
        missing = {
            parse_key_text(m) for t in (pending, new) for m in t.column("missing").to_pylist() if m
        }
        wants.done([k for k in wants.pending() if k in known and k not in missing])
        if wants.want(sorted(missing, key=lambda k: (k.package, k.name, k.hash))):
            log.info("asked the console for %d schema(s) parked messages wait for", len(missing))

    def _report_stale(self, pending: pa.Table, new: pa.Table, report: BatchReport) -> None:
        both = pa.concat_tables(
            [pending.select(PARKED.names), new.select(PARKED.names).cast(PARKED)]
        )
        if both.num_rows == 0:
            self.stale_parked = PARKED.empty_table()
            return
        limit = datetime.now(UTC) - timedelta(seconds=self.settings.parked_max_age_s)
        old = both.filter(
            pc.less(
                both.column("received_at"), pa.scalar(limit, both.schema.field("received_at").type)
            )
        )
        self.stale_parked = old
        report.stale_parked = old.num_rows
        if old.num_rows:
            missing = sorted(set(old.column("missing").to_pylist()))
            log.warning(
                "%d parked message(s) older than %.0f s still wait for schemas: %s",
                old.num_rows,
                self.settings.parked_max_age_s,
                ", ".join(missing[:10]),
            )


# ------------------------------------------------------------------ runs


def batch_from_offset_log(settings: SilverSettings, batch_id: int) -> pa.Table | None:
    """Micro-batch ``batch_id`` of the silver stream (bronze rows) read on the driver.

    From the previous batch's offset-log position to this batch's, the files
    the ``qmf-delta`` source's ``partitions()`` would give, read with pyarrow
    (as gold does, ``pipeline.gold.batch_from_offset_log``). None for a
    query's first batch (its start is not logged) or without a checkpoint.
    """
    from schemas.tables import spark_schema

    reads = [(settings.bronze, spark_schema(BRONZE), BRONZE.names)]
    tables = read_batch(settings.checkpoint, batch_id, reads, settings.source_options())
    return None if tables is None else tables[0]


def bronze_range(
    spark: SparkSession,
    bronze: str,
    *,
    batch_ids: tuple[int, int] | None = None,
    received: tuple[datetime, datetime] | None = None,
) -> DataFrame:
    """Bronze rows of a batch-id range or a received_at range (both inclusive)."""
    from pyspark.sql import functions as F

    df = delta.read_table(spark, bronze)
    if batch_ids is not None:
        df = df.where(F.col("batch_id").between(batch_ids[0], batch_ids[1]))
    if received is not None:
        df = df.where(F.col("received_at").between(F.lit(received[0]), F.lit(received[1])))
    return df


def run_silver_batch(
    spark: SparkSession,
    settings: SilverSettings,
    batch_id: int,
    *,
    app_id: str = "qmf-silver-batch",
    batch_ids: tuple[int, int] | None = None,
    received: tuple[datetime, datetime] | None = None,
    writer: SilverBatchWriter | None = None,
) -> BatchReport:
    """Batch mode: decode a bronze range as silver batch ``batch_id`` of ``app_id``.

    The same writer as the stream, so results are identical; rerunning the
    same (app_id, batch_id) writes nothing twice.
    """
    w = writer or SilverBatchWriter(settings, app_id=app_id)
    w(bronze_range(spark, settings.bronze, batch_ids=batch_ids, received=received), batch_id)
    return w.reports[-1]


def start_silver(spark: SparkSession, settings: SilverSettings) -> StreamingQuery:
    """Start the streaming query over bronze (source ``qmf-delta``, the table's appends)."""
    from pipeline.delta_source import register

    register(spark)
    writer = SilverBatchWriter(settings)
    reader = (
        spark.readStream.format("qmf-delta")
        .options(**settings.source_options())
        .option("path", settings.bronze)
    )
    return (
        reader.load()
        .writeStream.queryName(settings.query_name)
        .foreachBatch(writer)
        .option("checkpointLocation", settings.checkpoint)
        .trigger(**trigger_kwargs(settings.trigger))  # type: ignore[arg-type]
        .start()
    )


def run_silver(
    spark: SparkSession,
    settings: SilverSettings,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> int:
    """Run the stream until AvailableNow drained bronze, ``timeout_s`` passed, or ``stop``.

    0: ended as intended; 2: AvailableNow did not finish in time; 1: failed.
    """
    query = start_silver(spark, settings)
    return await_query(
        query, "silver", available_now=settings.trigger == "availableNow", timeout_s=timeout_s,
        stop=stop,
    )  # fmt: skip


# ------------------------------------------------------------------ test data


def _s(v: Any) -> str | None:
    return None if v is None else str(v)


def bronze_rows(
    messages: Iterable[CapturedMessage],
    *,
    partition: str = "p0",
    first_offset: int = 0,
    batch_id: int = 0,
) -> pa.Table:
    """Bronze-shaped rows from captured messages (tests and benchmarks, no broker).

    Built with the receiver's landing code (``receivers.landing.to_table``)
    and cast by column *name* to ``schemas.tables.BRONZE``.
    """
    from receivers.landing import LandedMessage, to_table

    landed = []
    for m in messages:
        p = m.properties
        at = m.received_at_dt
        landed.append(
            LandedMessage(
                body=m.body,
                routing_key=m.routing_key,
                subject=m.subject,
                message_id=_s(p.get("message_id")),
                correlation_id=_s(p.get("correlation_id")),
                reply_to=_s(p.get("reply_to")),
                app_id=m.app_id,
                content_type=m.content_type,
                application_properties={k: str(v) for k, v in m.application_properties.items()},
                received_at_us=0 if at is None else int(at.timestamp() * 1_000_000),
            )
        )
    t = to_table(partition, first_offset, landed)
    cols: dict[str, Any] = {}
    for f in BRONZE:
        if f.name == "batch_id":
            cols[f.name] = pa.array(np.full(t.num_rows, batch_id, np.int64))
        elif f.name in t.column_names:
            cols[f.name] = t.column(f.name)
        else:
            cols[f.name] = pa.nulls(t.num_rows, f.type)
    return pa.table(cols).cast(BRONZE)


def write_bronze(path: str, tables: Sequence[pa.Table]) -> None:
    """Append bronze-shaped tables, one Delta commit each (test/benchmark data)."""
    from deltalake import write_deltalake

    delta.create_table(path, BRONZE, name="bronze")
    for t in tables:
        write_deltalake(path, t.cast(BRONZE), mode="append")


def counts(tables: Mapping[str, pa.Table]) -> dict[str, int]:
    return {k: v.num_rows for k, v in tables.items()}
