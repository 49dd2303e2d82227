"""The silver job on real bronze tables: the real capture, corrupted messages, replays.

Bronze is built from the real qpidd capture without a broker
(``pipeline.silver.bronze_rows``: the receiver's landing rows, cast by column
name to the bronze schema) and written as Delta; the job then runs in batch
mode through Spark (``mapInArrow``) exactly as the stream would.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.lake import delta
from pipeline.silver import SilverSettings, bronze_rows, run_silver_batch, write_bronze
from schemas.silver import SILVER_TABLES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

CAPTURE = "samples/qpidd-capture-20s.jsonl"


def capture(shared_dir: str) -> list[CapturedMessage]:
    return list(read_capture(os.path.join(shared_dir, CAPTURE)))


def settings_for(tmp: Any) -> SilverSettings:
    return SilverSettings(bronze=str(tmp / "bronze"), root=str(tmp / "silver"))


def read(settings: SilverSettings, name: str) -> pa.Table:
    return delta.read_arrow(settings.path(name))


def all_counts(settings: SilverSettings) -> dict[str, int]:
    return {n: read(settings, n).num_rows for n in SILVER_TABLES if n != "schema_registry"}


def test_real_sample_matches_the_summary(spark: SparkSession, shared_dir: str, tmp_path: Any) -> None:
    msgs = capture(shared_dir)
    with open(os.path.join(shared_dir, "samples/qpidd-capture-20s.summary.json")) as fh:
        summary = json.load(fh)
    s = settings_for(tmp_path)
    # Three bronze commits in two partitions, as two receivers would land them.
    write_bronze(
        s.bronze,
        [
            bronze_rows(msgs[:300], partition="p0", batch_id=0),
            bronze_rows(msgs[300:600], partition="p1", batch_id=0),
            bronze_rows(msgs[600:], partition="p0", first_offset=300, batch_id=1),
        ],
    )
    report = run_silver_batch(spark, s, 0)
    assert "quarantine" not in report.rows and report.rows["object_samples"] > 0
    check_against_summary(s, msgs, summary)

    # Notebook views: one per class version, and <class> for the newest.
    from pipeline.silver.transforms import register_wide_views

    samples_df = delta.read_table(spark, s.path("object_samples"))
    names = register_wide_views(spark, samples_df, read(s, "schema_registry").to_pylist())
    assert "queue" in names
    named = spark.sql("SELECT DISTINCT name FROM queue WHERE name IS NOT NULL").collect()
    assert "act-steady" in {r["name"] for r in named}  # a queue of the summary's rates
    assert spark.sql("SELECT msgDepth FROM queue WHERE msgDepth IS NOT NULL").count() > 0

    # A replay of the batch writes nothing.
    before = all_counts(s)
    again = run_silver_batch(spark, s, 0)
    assert again.committed == []
    assert all_counts(s) == before


def check_against_summary(s: SilverSettings, msgs: list[CapturedMessage], summary: dict[str, Any]) -> None:
    """Silver counts of the whole capture equal the independent decoder's summary."""
    samples = read(s, "object_samples")
    v1 = samples.filter(pa.compute.is_in(samples.column("dialect"), pa.array(["AM1", "AM2"])))
    by_op = Counter(v1.column("opcode").to_pylist())
    want_ops = summary["v1_records_by_opcode"]
    assert dict(by_op) == {op: want_ops[op] for op in "cig"}
    assert sum(1 for d in v1.column("delete_ns").to_pylist() if d) == summary[
        "v1_records_with_delete_time"
    ]
    classes = Counter(f"{p}:{c}" for p, c in zip(
        v1.column("package").to_pylist(), v1.column("class_name").to_pylist(), strict=True))  # fmt: skip
    assert dict(classes) == summary["v1_classes_in_content"]

    v2_ctype = summary["v2_by_opcode_content_ctype"]
    v2 = samples.filter(pa.compute.equal(samples.column("dialect"), "V2"))
    v2_msgs = Counter(
        op
        for op, _p, _o in {
            (op, p, o)
            for op, p, o in zip(
                v2.column("opcode").to_pylist(),
                v2.column("partition").to_pylist(),
                v2.column("offset").to_pylist(),
                strict=True,
            )
        }
    )
    # Query responses may be empty lists (no object matched): count those with data.
    from pipeline.codec.message import decode_message
    from pipeline.codec.records import ObjectSample
    from pipeline.silver.registry import StatisticKinds, seed_table, to_registry

    reg0 = to_registry(seed_table(StatisticKinds.load()))
    with_data = sum(
        1
        for m in msgs
        if m.application_properties.get("qmf.opcode") == "_query_response"
        and any(
            isinstance(r, ObjectSample)
            for r in decode_message(
                m.body, registry=reg0, application_properties=m.application_properties,
                content_type=m.content_type, app_id=m.app_id,
            ).records
        )
    )  # fmt: skip
    assert 0 < with_data <= v2_ctype["_query_response|_data|amqp/list"]
    assert v2_msgs == {
        "_data_indication": v2_ctype["_data_indication|_data|amqp/list"],
        "_query_response": with_data,
    }

    events = read(s, "events")
    ev = Counter(
        n for n, d in zip(events.column("event_name").to_pylist(), events.column("dialect").to_pylist(), strict=True)
        if d != "V2"
    )  # fmt: skip
    assert dict(ev) == summary["v1_events"]
    assert events.num_rows == sum(summary["v1_events"].values()) + v2_ctype[
        "_data_indication|_event|amqp/list"
    ]
    beats = read(s, "heartbeats")
    assert Counter(beats.column("dialect").to_pylist()) == {
        "AM2": summary["v1_records_by_opcode"]["h"],
        "V2": v2_ctype["_agent_heartbeat_indication|None|amqp/map"],
    }
    methods = read(s, "method_responses")
    assert Counter(methods.column("kind").to_pylist()) == {
        "method_response": summary["v1_records_by_opcode"]["m"]
        + v2_ctype["_method_response|None|amqp/map"],
        "exception": v2_ctype["_exception|None|amqp/map"],
    }
    assert read(s, "quarantine").num_rows == 0
    assert read(s, "parked").num_rows == 0
    # Identity: (partition, offset, record_index) is unique (msg_key is not: twins).
    ident = set(zip(*(samples.column(c).to_pylist() for c in ("partition", "offset", "record_index")), strict=True))
    assert len(ident) == samples.num_rows
    # Every schema the capture carried is in the registry, seeded or seen.
    reg = read(s, "schema_registry")
    assert reg.num_rows >= summary["v1_schemas_captured"]


def _hdr(opcode: str, seq: int = 0) -> bytes:
    return b"AM2" + opcode.encode() + struct.pack(">I", seq)


def test_corrupted_messages_go_to_quarantine(spark: SparkSession, shared_dir: str, tmp_path: Any) -> None:
    msgs = capture(shared_dir)
    stats = [m for m in msgs if m.body[:4] == b"AM2i"]
    good = stats[:6]
    base = stats[6]
    bad_bodies = {
        "Truncated": base.body[:-3],
        "BadMagic": b"QM2" + base.body[3:],
        "UnknownType": base.body + _hdr("G") + struct.pack(">II", 8, 1) + b"\x01a\xe5\x00",
        "UnknownOpcode": base.body + b"AM2?" + struct.pack(">I", 0),
    }
    bad = [
        CapturedMessage(body=b, routing_key=base.routing_key, received_at=base.received_at)
        for b in bad_bodies.values()
    ]
    s = settings_for(tmp_path)
    write_bronze(s.bronze, [bronze_rows([*good[:3], *bad, *good[3:]])])
    run_silver_batch(spark, s, 0)

    # The per-record count of the base message, from a clean decode of it alone.
    from pipeline.codec.message import decode_message
    from pipeline.silver.registry import StatisticKinds, seed_table, to_registry

    reg = to_registry(seed_table(StatisticKinds.load()))
    n_base = len(decode_message(base.body, registry=reg.copy()).records)
    n_good = sum(len(decode_message(m.body, registry=reg.copy()).records) for m in good)

    q = read(s, "quarantine").sort_by("offset")
    assert q.column("offset").to_pylist() == [3, 4, 5, 6]
    assert q.column("error").to_pylist() == list(bad_bodies)
    assert q.column("body").to_pylist() == list(bad_bodies.values())
    # Where decoding stopped: the good records before the problem are in silver.
    assert q.column("record_index").to_pylist() == [n_base - 1, 0, n_base, n_base]
    samples = read(s, "object_samples")
    per_offset = Counter(samples.column("offset").to_pylist())
    assert per_offset == {
        **{o: len(decode_message(m.body, registry=reg.copy()).records)
           for o, m in zip([0, 1, 2, 7, 8, 9], good, strict=True)},
        3: n_base - 1, 5: n_base, 6: n_base,
    }  # fmt: skip
    assert samples.num_rows == n_good + 3 * n_base - 1
    assert read(s, "parked").num_rows == 0


def _rows(settings: SilverSettings, name: str) -> list[tuple[Any, ...]]:
    t = read(settings, name)
    cols = [c for c in t.column_names if c not in ("batch_id", "first_app", "first_batch", "first_seen", "last_seen")]
    return sorted(tuple(map(repr, r)) for r in zip(*(t.column(c).to_pylist() for c in cols), strict=True))


def three_parts_and_batch(
    spark: SparkSession, msgs: list[CapturedMessage], step: int, tmp: Any
) -> tuple[list[pa.Table], SilverSettings]:
    """Bronze parts of ``step``, ``step`` and the rest of the messages (offsets
    continuing), and silver made from all of them in one batch (the reference)."""
    parts = [
        bronze_rows(msgs[:step], batch_id=0),
        bronze_rows(msgs[step : 2 * step], first_offset=step, batch_id=1),
        bronze_rows(msgs[2 * step :], first_offset=2 * step, batch_id=2),
    ]
    batch = settings_for(tmp / "batch")
    write_bronze(batch.bronze, parts)
    run_silver_batch(spark, batch, 0)
    return parts, batch


@pytest.mark.parametrize("decode_on", ["tasks", "driver"])
def test_stream_equals_batch_and_restarts_from_its_checkpoint(
    spark: SparkSession, shared_dir: str, tmp_path: Any, decode_on: str
) -> None:
    """Streaming over bronze's log (Delta's streaming source) gives what the batch mode
    gives, decoded by Spark or on the driver (which reads every batch from the files of
    its plan, the first and the restart's batch included)."""
    from pipeline.silver import run_silver

    parts, batch = three_parts_and_batch(spark, capture(shared_dir), 250, tmp_path)

    stream = SilverSettings(
        bronze=str(tmp_path / "stream" / "bronze"),
        root=str(tmp_path / "stream" / "silver"),
        checkpoint=str(tmp_path / "stream" / "checkpoint"),
        max_files_per_trigger=1,
        decode_on=decode_on,
    )
    write_bronze(stream.bronze, parts[:2])
    assert run_silver(spark, stream, timeout_s=300) == 0
    write_bronze(stream.bronze, parts[2:])
    assert run_silver(spark, stream, timeout_s=300) == 0  # restart: only the new commit
    for name in ("object_samples", "events", "heartbeats", "method_responses", "quarantine", "parked"):
        assert _rows(stream, name) == _rows(batch, name), name
    assert read(stream, "object_samples").num_rows == read(batch, "object_samples").num_rows > 0
    # Three bronze commits, one file per trigger: three micro-batches.
    assert sorted(set(read(stream, "object_samples").column("batch_id").to_pylist())) == [0, 1, 2]


def test_an_old_checkpoint_is_refused_and_a_new_one_continues_where_it_ended(
    spark: SparkSession, shared_dir: str, tmp_path: Any
) -> None:
    """The upgrade from the ``qmf-delta`` release: the old checkpoint (its stream read
    bronze up to version 2, so its last end offset is version 3, index 0) is refused with
    the version to start at; a new checkpoint started there reads only what came after,
    so silver equals a single batch over all of bronze: nothing missing, nothing twice."""
    from pipeline.runtime.jobrun import starting_version_arg, starting_versions
    from pipeline.runtime.streaming import OldCheckpointError
    from pipeline.silver import run_silver, start_silver

    parts, batch = three_parts_and_batch(spark, capture(shared_dir), 300, tmp_path)

    bronze, root = str(tmp_path / "bronze"), str(tmp_path / "silver")
    write_bronze(bronze, parts[:2])  # versions 1 and 2 (0 creates the table)
    before = SilverSettings(bronze=bronze, root=root, checkpoint=str(tmp_path / "ck-before"))
    assert run_silver(spark, before, timeout_s=300) == 0  # what the old release wrote
    old = tmp_path / "ck-old"  # its checkpoint, as qmf-delta left it
    (old / "offsets").mkdir(parents=True)
    end = {"version": 3, "index": 0, "from": {"version": 2, "index": 0}}
    (old / "offsets" / "4").write_text(f"v1\n{{}}\n{json.dumps(end)}\n")
    write_bronze(bronze, parts[2:])  # version 3, after the upgrade

    with pytest.raises(OldCheckpointError, match=r"--starting-version bronze=3 \("):
        start_silver(spark, SilverSettings(bronze=bronze, root=root, checkpoint=str(old)))
    given = starting_versions([starting_version_arg("bronze=3")], ("bronze",))
    new = SilverSettings(
        bronze=bronze, root=root, checkpoint=str(tmp_path / "ck-new"),
        starting_version=given["bronze"],
    )  # fmt: skip
    assert run_silver(spark, new, timeout_s=300) == 0
    for name in ("object_samples", "events", "heartbeats", "method_responses", "quarantine"):
        assert _rows(new, name) == _rows(batch, name), name
    assert read(new, "object_samples").num_rows == read(batch, "object_samples").num_rows > 0



def test_a_job_given_an_old_checkpoint_exits_2_with_one_line(tmp_path: Any) -> None:
    """``jobs/gold.py`` over a checkpoint of the ``qmf-delta`` release: exit 2, and the
    line says what to do for both of its sources (no traceback)."""
    import subprocess

    from tests.integration.e2e import stream_job

    old = tmp_path / "ck"
    (old / "offsets").mkdir(parents=True)
    ends = [{"version": 7, "index": 0}, {"version": 5, "index": 0}]
    (old / "offsets" / "2").write_text("v1\n{}\n" + "\n".join(json.dumps(e) for e in ends) + "\n")
    log_path = tmp_path / "gold.log"
    with open(log_path, "wb") as log:
        job = stream_job("gold.py", ["--silver", str(tmp_path / "silver"), "--root",
                                     str(tmp_path / "gold"), "--checkpoint", str(old)], log)  # fmt: skip
        try:
            assert job.wait(timeout=300) == 2, log_path.read_text()[-3000:]
        except subprocess.TimeoutExpired:
            job.kill()
            raise
    text = log_path.read_text()
    assert (
        f"qmf-gold: gold: checkpoint {old} holds the offsets of the previous release's "
        "qmf-delta source (batch 2); Delta's streaming source cannot resume them: move it "
        "aside and start with a new checkpoint and --starting-version object_samples=7 "
        "--starting-version heartbeats=5 (the first version it has not read)\n"
    ) in text
    assert "Traceback" not in text
