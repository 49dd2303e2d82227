"""The ``method_calls`` silver table: v1 'M' and 'm' paired by (dialect, seq), arguments typed.

Classes and methods are qpid's own (the XML seed of the silver registry):
broker ``echo`` (bidirectional uint32 + str16), ``query`` (input str8s, output
map), ``create`` (input str8s, map, bool), ``getLogLevel`` (output str8) and
queue ``purge`` (input uint32 + map). Messages are encoded with the codec;
bronze batches are written one by one and the silver job runs in batch mode
through Spark once per bronze batch, as the stream would. Requests wait in the
table (request-only rows) until a later batch's response completes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.codec.capture import CapturedMessage
from pipeline.codec.records import MethodRequest, MethodResponse, ObjectSample, Record
from pipeline.codec.schema import ClassSchema, SchemaRegistry
from pipeline.codec.types import Am1ObjectId, Am2ObjectId
from pipeline.codec.v1 import encode_record
from pipeline.lake import delta
from pipeline.qmfxml import default_schema
from pipeline.silver import (
    BatchReport,
    SilverBatchWriter,
    SilverSettings,
    bronze_rows,
    run_silver_batch,
    write_bronze,
)
from pipeline.sim.wire import encode_arguments
from schemas.silver import METHOD_CALLS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

XML = default_schema()
BROKER = XML.get("org.apache.qpid.broker", "broker").schema
QUEUE = XML.get("org.apache.qpid.broker", "queue").schema
REG = SchemaRegistry([BROKER, QUEUE])
BROKER_ID = Am1ObjectId(1, 2, 3)  # the AM1 broker object (its class: from its sample)
UNSEEN_ID = Am1ObjectId(1, 2, 99)  # never sampled: its calls stay untyped
QUEUE_ID = Am2ObjectId(0, 4, 1, 0, 17)  # AM2 'M' carries the class key itself
T0 = 1_795_338_000_000_000_000
AM1_KEY = "mgmt.amq1.method.reply"  # AM1 routing key: agent "amq1"


def args(schema: ClassSchema, method: str, direction: str, values: Mapping[str, Any], dialect: str = "AM1") -> bytes:
    """The wire bytes of a method's arguments of one direction (I: I+IO, O: O+IO)."""
    (m,) = [m for m in schema.methods if m.name == method]
    elems = [a for a in m.arguments if direction in str(a.extra["dir"])]
    return encode_arguments(dialect, elems, values)


def request(dialect: str, seq: int, oid: Any, method: str, raw: bytes, schema: ClassSchema | None = None) -> MethodRequest:
    key = {} if schema is None else {
        "package": schema.key.package, "class_name": schema.key.name, "schema_hash": schema.key.hash,
    }  # fmt: skip
    return MethodRequest(
        dialect=dialect, opcode="M", seq=seq, object_id=oid, method_name=method,
        raw_arguments=raw, **key,
    )  # fmt: skip


def response(dialect: str, seq: int, status: int, text: str, raw: bytes = b"") -> MethodResponse:
    return MethodResponse(
        dialect=dialect, opcode="m", seq=seq, status=status, text=text, raw_arguments=raw
    )


def broker_sample() -> ObjectSample:
    values = {e.name: 0 for e in BROKER.statistics}
    return ObjectSample(
        dialect="AM1", opcode="i", seq=0, package=BROKER.key.package, class_name="broker",
        schema_hash=BROKER.key.hash, update_ns=T0, create_ns=T0, delete_ns=0,
        object_id=BROKER_ID, values=values,
    )  # fmt: skip


def msg(rec: Record, second: int, routing_key: str | None = AM1_KEY) -> CapturedMessage:
    return CapturedMessage(
        body=encode_record(rec, REG),
        routing_key=routing_key,
        received_at=f"2026-11-22T09:00:{second:02d}Z",
    )


def at(second: int) -> datetime:
    return datetime(2026, 11, 22, 9, 0, second, tzinfo=UTC)


class Run:
    """Bronze batches appended one at a time, each decoded as the same-numbered silver batch."""

    def __init__(self, spark: SparkSession, tmp: Any, **settings: Any) -> None:
        self.spark = spark
        self.s = SilverSettings(bronze=str(tmp / "bronze"), root=str(tmp / "silver"), **settings)
        self.offset = 0
        self.writer = SilverBatchWriter(self.s, app_id="test-methods")

    def batch(self, k: int, msgs: Sequence[CapturedMessage]) -> BatchReport:
        write_bronze(self.s.bronze, [bronze_rows(msgs, first_offset=self.offset, batch_id=k)])
        self.offset += len(msgs)
        return self.decode(k)

    def decode(self, k: int, writer: SilverBatchWriter | None = None) -> BatchReport:
        return run_silver_batch(
            self.spark, self.s, k, batch_ids=(k, k), writer=writer or self.writer
        )

    def calls(self) -> dict[tuple[str, int], dict[str, Any]]:
        rows = delta.read_arrow(self.s.path("method_calls")).to_pylist()
        out = {(r["dialect"], r["seq"]): r for r in rows}
        assert len(out) == len(rows)
        return out


# Arguments of the calls, typed and raw.
ECHO_IN = args(BROKER, "echo", "I", {"sequence": 42, "body": "ping"})
ECHO_OUT = args(BROKER, "echo", "O", {"sequence": 42, "body": "pong"})
QUERY_IN = args(BROKER, "query", "I", {"type": "queue", "name": "q1"})
QUERY_OUT = args(BROKER, "query", "O", {"results": {"msgDepth": 7, "durable": True}})
CREATE_IN = args(
    BROKER, "create", "I",
    {"type": "queue", "name": "q2", "properties": {"auto-delete": False}, "strict": True},
)  # fmt: skip
LEVEL_OUT = args(BROKER, "getLogLevel", "O", {"level": "info+"})
PURGE_IN = args(QUEUE, "purge", "I", {"request": 5, "filter": {"k": "v"}}, "AM2")
EXPECTED_IN_ERROR = (
    "method arguments at offset 6 do not fit: echo of org.apache.qpid.broker:broker"
    f"({BROKER.key.hash.hex()}): truncated lstr at offset 6: expected 4 bytes, found 2"
)
EXPECTED_OUT_ERROR = (
    "method arguments at offset 10 do not fit: echo of org.apache.qpid.broker:broker"
    f"({BROKER.key.hash.hex()}): 1 bytes left after them"
)


# Where the calls are paired: on the driver (small batches), or in one Spark task per
# bucket of (dialect, seq) (the task path above its threshold; 0 forces it).
PATHS = {
    "driver": {"decode_on": "driver"},
    "tasks": {"decode_on": "tasks", "calls_driver_max_rows": 0},
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_calls_pair_across_batches_typed_both_ways(
    spark: SparkSession, tmp_path: Any, path: str
) -> None:
    run = Run(spark, tmp_path, **PATHS[path])
    # Batch 0: the broker's AM1 sample, then requests; no response yet.
    r0 = run.batch(0, [
        msg(broker_sample(), 0, "mgmt.amq1.stats.org.apache.qpid.broker.broker"),
        msg(request("AM1", 7, BROKER_ID, "echo", ECHO_IN), 1),
        msg(request("AM2", 7, QUEUE_ID, "purge", PURGE_IN, QUEUE), 2, None),
        msg(request("AM1", 11, UNSEEN_ID, "echo", ECHO_IN), 3),
    ])  # fmt: skip
    assert r0.rows["method_calls"] == 3 and "method_calls" in r0.committed
    assert r0.paired_on == path
    c = run.calls()
    assert set(c) == {("AM1", 7), ("AM2", 7), ("AM1", 11)}
    echo = c[("AM1", 7)]
    assert {k: echo[k] for k in (
        "call_id", "batch_id", "request_batch", "request_partition", "request_offset",
        "request_index", "request_at", "response_partition", "object_id", "object_id_raw",
        "package", "class_name", "schema_hash", "method_name", "status", "text",
        "arguments_in", "arguments_out", "raw_in", "raw_out",
    )} == {
        "call_id": "p0:1:0", "batch_id": 0, "request_batch": 0, "request_partition": "p0",
        "request_offset": 1, "request_index": 0, "request_at": at(1),
        "response_partition": None, "object_id": "1-2-3",
        "object_id_raw": BROKER_ID.to_int().to_bytes(8, "big"),
        "package": "org.apache.qpid.broker", "class_name": "broker",
        "schema_hash": BROKER.key.hash, "method_name": "echo", "status": None, "text": None,
        "arguments_in": '{"body":"ping","sequence":42}', "arguments_out": None,
        "raw_in": ECHO_IN, "raw_out": None,
    }  # fmt: skip
    assert json.loads(c[("AM2", 7)]["arguments_in"]) == {"request": 5, "filter": {"k": "v"}}
    unseen = c[("AM1", 11)]
    assert (unseen["package"], unseen["arguments_in"], unseen["raw_in"]) == (None, None, ECHO_IN)

    # Batch 1: responses to batch 0's requests; a request on the broker seen in batch 0
    # (its class read from object_samples) answered in the same batch; one left pending;
    # a response nobody asked for.
    r1 = run.batch(1, [
        msg(response("AM1", 7, 0, "OK", ECHO_OUT), 10),
        msg(response("AM2", 7, 0, "OK"), 11, None),
        msg(request("AM1", 8, BROKER_ID, "query", QUERY_IN), 12),
        msg(request("AM1", 9, BROKER_ID, "create", CREATE_IN), 13),
        msg(response("AM1", 8, 0, "OK", QUERY_OUT), 14),
        msg(response("AM1", 99, 0, "OK", LEVEL_OUT), 15),
    ])  # fmt: skip
    assert r1.rows["method_calls"] == 5
    c = run.calls()
    echo = c[("AM1", 7)]
    assert {k: echo[k] for k in (
        "call_id", "batch_id", "request_batch", "response_partition", "response_offset",
        "response_index", "response_at", "agent", "status", "text", "arguments_in",
        "arguments_out", "raw_in", "raw_out",
    )} == {
        "call_id": "p0:1:0", "batch_id": 1, "request_batch": 0, "response_partition": "p0",
        "response_offset": 4, "response_index": 0, "response_at": at(10), "agent": "amq1",
        "status": 0, "text": "OK", "arguments_in": '{"body":"ping","sequence":42}',
        "arguments_out": '{"body":"pong","sequence":42}', "raw_in": ECHO_IN,
        "raw_out": ECHO_OUT,
    }  # fmt: skip
    purge = c[("AM2", 7)]
    assert (purge["status"], purge["text"], purge["arguments_out"], purge["raw_out"]) == (
        0, "OK", "{}", b""
    )
    query = c[("AM1", 8)]
    assert (query["request_batch"], query["batch_id"], query["class_name"]) == (1, 1, "broker")
    assert query["arguments_in"] == '{"name":"q1","type":"queue"}'
    assert json.loads(query["arguments_out"]) == {"results": {"msgDepth": 7, "durable": True}}
    create = c[("AM1", 9)]
    assert json.loads(create["arguments_in"]) == {
        "type": "queue", "name": "q2", "properties": {"auto-delete": False}, "strict": True,
    }  # fmt: skip
    assert create["response_partition"] is None
    lone = c[("AM1", 99)]
    assert {k: lone[k] for k in (
        "call_id", "request_partition", "response_offset", "method_name", "status",
        "arguments_out", "raw_out",
    )} == {
        "call_id": "p0:9:0", "request_partition": None, "response_offset": 9,
        "method_name": None, "status": 0, "arguments_out": None, "raw_out": LEVEL_OUT,
    }  # fmt: skip

    # Batch 2, by a new writer (pending state read back from the table): the pending
    # create fails (no output arguments), the unseen object's echo is answered (untyped),
    # and a getLogLevel is asked and answered (output only).
    fresh = SilverBatchWriter(run.s, app_id="test-methods")
    write_bronze(run.s.bronze, [bronze_rows([
        msg(response("AM1", 9, 7, "exists"), 20),
        msg(response("AM1", 11, 0, "OK", ECHO_OUT), 21),
        msg(request("AM1", 12, BROKER_ID, "getLogLevel", b""), 22),
        msg(response("AM1", 12, 0, "OK", LEVEL_OUT), 23),
    ], first_offset=run.offset, batch_id=2)])  # fmt: skip
    run.offset += 4
    r2 = run.decode(2, fresh)
    assert r2.rows["method_calls"] == 3
    c = run.calls()
    assert len(c) == 7
    create = c[("AM1", 9)]
    assert (create["status"], create["text"], create["arguments_out"], create["raw_out"]) == (
        7, "exists", None, b""
    )
    assert (create["arguments_in_error"], create["arguments_out_error"]) == (None, None)
    assert json.loads(create["arguments_in"])["strict"] is True  # kept from batch 1
    unseen = c[("AM1", 11)]
    assert (unseen["arguments_in"], unseen["arguments_out"]) == (None, None)
    assert (unseen["raw_in"], unseen["raw_out"], unseen["batch_id"]) == (ECHO_IN, ECHO_OUT, 2)
    level = c[("AM1", 12)]
    assert (level["arguments_in"], level["arguments_out"]) == ("{}", '{"level":"info+"}')

    # Replays of any batch by another writer commit nothing; the table is unchanged.
    before = delta.read_arrow(run.s.path("method_calls")).sort_by("call_id")
    replay = SilverBatchWriter(run.s, app_id="test-methods")
    for k in (1, 2):
        again = run.decode(k, replay)
        assert "method_calls" not in again.committed and again.paired_on == ""  # not paired again
    assert delta.read_arrow(run.s.path("method_calls")).sort_by("call_id").equals(before)
    # the audit copies are still beside the typed view: method_responses keeps every 'm'
    responses = delta.read_arrow(run.s.path("method_responses"))
    assert responses.num_rows == 7
    assert isinstance(responses, pa.Table)


def _by_file(path: str) -> dict[str, set[str]]:
    """The call ids in the table's live files, by kind of file: open, closed, other."""
    from pipeline.silver.methods import CLOSED_PREFIX, OPEN_PREFIX

    out: dict[str, set[str]] = {"open": set(), "closed": set(), "other": set()}
    for f in delta.snapshot_files(path)[2]:
        name = delta.staged_name(f.local_path)
        kind = "open" if name.startswith(OPEN_PREFIX) else "closed" if name.startswith(CLOSED_PREFIX) else "other"
        out[kind] |= set(pq.read_table(f.local_path, columns=["call_id"]).column("call_id").to_pylist())
    return out


@pytest.mark.parametrize("path", sorted(PATHS))
def test_waiting_requests_live_in_open_files_and_other_files_are_taken_in(
    spark: SparkSession, tmp_path: Any, path: str
) -> None:
    """The pending state is the open files: only requests that may still be answered.
    A request superseded by a later one of the same (dialect, seq) is closed, never
    answered. A compaction's file (another writer's) is read once and split."""
    from deltalake import DeltaTable

    from pipeline.silver.methods import stored_before

    run = Run(spark, tmp_path, **PATHS[path])
    calls = run.s.path("method_calls")
    run.batch(0, [
        *(msg(request("AM1", q, UNSEEN_ID, "echo", ECHO_IN), q) for q in (1, 2, 3, 4)),
        msg(request("AM2", 1, QUEUE_ID, "purge", PURGE_IN, QUEUE), 5, None),
    ])  # fmt: skip
    assert _by_file(calls) == {
        "open": {"p0:0:0", "p0:1:0", "p0:2:0", "p0:3:0", "p0:4:0"}, "closed": set(), "other": set(),
    }  # fmt: skip
    r1 = run.batch(1, [
        msg(response("AM1", 1, 0, "OK", ECHO_OUT), 10),
        msg(response("AM1", 2, 0, "OK", ECHO_OUT), 11),
        msg(request("AM1", 3, UNSEEN_ID, "echo", ECHO_IN), 12),  # supersedes p0:2:0
        msg(request("AM1", 5, UNSEEN_ID, "echo", ECHO_IN), 13),
    ])  # fmt: skip
    assert (r1.rows["method_calls"], r1.paired_on) == (4, path)
    assert _by_file(calls) == {
        "open": {"p0:3:0", "p0:4:0", "p0:7:0", "p0:8:0"},
        "closed": {"p0:0:0", "p0:1:0", "p0:2:0"}, "other": set(),
    }  # fmt: skip

    DeltaTable(calls).optimize.compact()  # another writer: one file of every row
    assert _by_file(calls)["other"] == {f"p0:{i}:0" for i in (0, 1, 2, 3, 4, 7, 8)}
    (compacted,) = stored_before(calls, run.writer.app_id, 2)[1]
    assert (compacted.rows, compacted.nulls) == (7, 5)  # 5 request-only rows: a candidate

    r2 = run.batch(2, [
        msg(response("AM1", 3, 0, "OK", ECHO_OUT), 20),
        msg(response("AM1", 4, 0, "OK", ECHO_OUT), 21),
    ])  # fmt: skip
    assert r2.rows["method_calls"] == 2
    assert _by_file(calls) == {
        "open": {"p0:4:0", "p0:8:0"},
        "closed": {"p0:0:0", "p0:1:0", "p0:2:0", "p0:3:0", "p0:7:0"}, "other": set(),
    }  # fmt: skip
    rows = {r["call_id"]: r for r in delta.read_arrow(calls).to_pylist()}
    assert len(rows) == 7
    # seq 3's answer (offset 9) completes the later request; the earlier one stays unanswered
    assert (rows["p0:7:0"]["response_offset"], rows["p0:7:0"]["batch_id"]) == (9, 2)
    assert (rows["p0:2:0"]["response_offset"], rows["p0:2:0"]["batch_id"]) == (None, 0)
    assert (rows["p0:3:0"]["seq"], rows["p0:3:0"]["response_offset"]) == (4, 10)
    assert (rows["p0:4:0"]["dialect"], rows["p0:4:0"]["response_offset"]) == ("AM2", None)
    left = stored_before(calls, run.writer.app_id, 3)[1]  # the open files only (one per bucket)
    assert sum(f.rows or 0 for f in left) == 2 and all(f.nulls == f.rows for f in left)


def test_a_file_of_answered_calls_is_no_candidate(tmp_path: Any) -> None:
    """Another writer's file whose log says it holds no request-only row is not read."""
    from deltalake import write_deltalake

    from pipeline.silver.methods import stored_before

    path = str(tmp_path / "calls")
    base = {"dialect": "AM1", "batch_id": 0, "request_partition": "p0", "request_offset": 0,
            "request_index": 0}  # fmt: skip
    done = pa.Table.from_pylist(
        [{**base, "call_id": "p0:0:0", "seq": 1, "response_partition": "p0", "response_offset": 1}],
        schema=METHOD_CALLS,
    )
    waiting = pa.Table.from_pylist(
        [{**base, "call_id": "p0:2:0", "seq": 2, "request_offset": 2}], schema=METHOD_CALLS
    )
    write_deltalake(path, done)
    write_deltalake(path, waiting, mode="append")
    (candidate,) = stored_before(path, "app", 0)[1]
    assert (candidate.rows, candidate.nulls) == (1, 1)
    got = pq.read_table(candidate.live.local_path).column("call_id").to_pylist()
    assert got == ["p0:2:0"]


def call_traffic(seed: int, files: int) -> tuple[list[list[CapturedMessage]], dict[str, Any]]:
    """Random v1 calls over ``files`` bronze files: AM1 calls on a sampled and an unseen
    object, AM2 calls with their class key, answers in the same file or a later one (or
    none), requests superseded by another of the same seq, answers nobody asked for.
    Returns the files and what pairing them in arrival order gives (call id -> the
    offset of its answer, None for a request never answered)."""
    import random

    rng = random.Random(seed)
    sample = msg(broker_sample(), 0, "mgmt.amq1.stats.org.apache.qpid.broker.broker")
    # (file, time in ms, message, its call half: (dialect, seq, is a request) or None)
    timed: list[tuple[int, int, CapturedMessage, tuple[str, int, bool] | None]] = [
        (0, 0, sample, None)
    ]
    for seq in range(1, 200):
        d = rng.choice(["AM1", "AM2"])
        key = AM1_KEY if d == "AM1" else None
        f = rng.randrange(files)
        t = f * 10_000 + rng.randrange(1, 5_000)
        if rng.random() < 0.1:  # an answer nobody asked for
            out = ECHO_OUT if d == "AM1" else b""
            timed.append((f, t, msg(response(d, seq, 0, "OK", out), 0, key), (d, seq, False)))
            continue
        for _ in range(2 if rng.random() < 0.1 else 1):  # sometimes asked twice
            if d == "AM1":
                rec = request(d, seq, rng.choice([BROKER_ID, UNSEEN_ID]), "echo", ECHO_IN)
            else:
                rec = request(d, seq, QUEUE_ID, "purge", PURGE_IN, QUEUE)
            timed.append((f, t, msg(rec, 0, AM1_KEY if d == "AM1" else None), (d, seq, True)))
            f = rng.randrange(f, files)
            t = max(t + 1, f * 10_000 + rng.randrange(1, 5_000))
        if rng.random() < 0.8:
            status = rng.choice([0, 0, 0, 7])
            out = ECHO_OUT if d == "AM1" and status == 0 else b""
            timed.append((f, t, msg(response(d, seq, status, "OK", out), 0, key), (d, seq, False)))
    timed.sort(key=lambda x: (x[0], x[1]))
    base = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    by_file: list[list[CapturedMessage]] = [[] for _ in range(files)]
    expected: dict[str, Any] = {}
    pending: dict[tuple[str, int], str] = {}
    for offset, (f, t, m, half) in enumerate(timed):
        at = (base + timedelta(milliseconds=t)).isoformat().replace("+00:00", "Z")
        by_file[f].append(CapturedMessage(body=m.body, routing_key=m.routing_key, received_at=at))
        if half is None:
            continue
        cid = f"p0:{offset}:0"
        if half[2]:
            pending[half[:2]] = cid
            expected[cid] = None
        else:
            expected[pending.pop(half[:2], None) or cid] = offset
    return by_file, expected


def test_many_calls_pair_alike_in_tasks_and_on_the_driver(
    spark: SparkSession, tmp_path: Any
) -> None:
    """Six bronze files, two per micro-batch (two decode tasks each): the halves of one
    bucket come from both tasks and from earlier batches. Paired in one Spark task per
    bucket and on the driver, the tables are identical, and as pairing every message
    in arrival order gives."""
    from tests.spark.test_silver_paths import _stream

    files, expected = call_traffic(7, 6)
    parts, first = [], 0
    for k, fm in enumerate(files):
        parts.append(bronze_rows(fm, first_offset=first, batch_id=k))
        first += len(fm)
    tables = {}
    # (decode on, pairing threshold, where the pairing must run): the task path's default
    # threshold keeps this batch's few hundred halves on the driver
    runs = {"tasks": ("tasks", 0, "tasks"), "tasks-small": ("tasks", None, "driver"),
            "driver": ("driver", 0, "driver")}  # fmt: skip
    for name, (mode, most, paired) in runs.items():
        kw = {} if most is None else {"calls_driver_max_rows": most}
        s, reports = _stream(spark, tmp_path / name, parts, mode, **kw)
        assert [(r.tasks, r.paired_on) for r in reports] == [(2 if mode == "tasks" else 0, paired)] * 3
        tables[name] = delta.read_arrow(s.path("method_calls")).sort_by("call_id").to_pylist()
    assert tables["tasks"] == tables["driver"] == tables["tasks-small"]
    got = {r["call_id"]: r["response_offset"] for r in tables["tasks"]}
    assert got == expected
    assert sum(v is None for v in got.values()) > 10 and sum(v is not None for v in got.values()) > 100
    typed = [r for r in tables["tasks"] if r["arguments_out"] is not None]
    assert {r["class_name"] for r in typed} == {"broker", "queue"}


@pytest.mark.parametrize("buckets", [1, 2, 3, 8])
def test_each_dialects_calls_spread_evenly_over_the_buckets(buckets: int) -> None:
    from pipeline.silver.methods import bucket_of

    for dialect in ("AM1", "AM2"):
        t = pa.table({"dialect": [dialect] * 240, "seq": pa.array(range(240), pa.int64())})
        b = bucket_of(t, buckets)
        assert sorted(b.tolist()) == sorted(list(range(buckets)) * (240 // buckets))
        assert b.tolist() == bucket_of(t, buckets).tolist()  # stable


def test_part_files_name_their_bucket(tmp_path: Any) -> None:
    from pipeline.silver.methods import PartWriter, bucket_of, part_bucket

    t = pa.Table.from_pylist(
        [{"call_id": f"p0:{i}:0", "dialect": "AM2", "seq": i, "batch_id": 3} for i in range(7)],
        schema=METHOD_CALLS,
    )
    w = PartWriter(delta.Stage(tmp_path, "app", 3).prefix, 3, 4)
    w.write(t.slice(0, 4))
    w.write(t.slice(4))
    files = w.close()
    assert sorted(part_bucket(f.location) for f in files) == [0, 1, 2, 3]
    for f in files:
        rows = pq.read_table(f.location)
        assert set(bucket_of(rows, 4).tolist()) == {part_bucket(f.location)}
        assert delta.staged_name(f.location).startswith("calls-parts-00000003-b0000")
        assert os.path.basename(f.location).startswith(os.path.basename(delta.batch_prefix(tmp_path, "app", 3)))
    assert sum(f.rows for f in files) == 7


@pytest.mark.parametrize("path", sorted(PATHS))
def test_arguments_that_do_not_fit_keep_their_bytes_and_say_why(
    spark: SparkSession, tmp_path: Any, path: str
) -> None:
    """A known method whose bytes do not fit it: arguments null, raw bytes kept, the
    reason beside them; an unknown object has nothing to type with: no reason."""
    run = Run(spark, tmp_path, **PATHS[path])
    run.batch(0, [
        msg(broker_sample(), 0, "mgmt.amq1.stats.org.apache.qpid.broker.broker"),
        msg(request("AM1", 1, BROKER_ID, "echo", ECHO_IN[:-2]), 1),  # cut short
        msg(response("AM1", 1, 0, "OK", ECHO_OUT + b"\x00"), 2),  # a byte too many
        msg(request("AM1", 2, UNSEEN_ID, "echo", ECHO_IN[:-2]), 3),
    ])  # fmt: skip
    c = run.calls()
    bad = c[("AM1", 1)]
    assert (bad["arguments_in"], bad["raw_in"], bad["arguments_out"], bad["raw_out"]) == (
        None, ECHO_IN[:-2], None, ECHO_OUT + b"\x00"
    )
    assert bad["arguments_in_error"] == EXPECTED_IN_ERROR
    assert bad["arguments_out_error"] == EXPECTED_OUT_ERROR
    assert (bad["class_name"], bad["status"]) == ("broker", 0)  # the class from its sample
    unseen = c[("AM1", 2)]
    assert (unseen["class_name"], unseen["arguments_in"], unseen["arguments_in_error"]) == (
        None, None, None
    )
