"""``qmf sim --output``: a capture file, decoded by the very code path that reads the real qpidd capture."""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.records import Event, Heartbeat, ObjectSample, Record
from pipeline.codec.schema import SchemaRegistry
from pipeline.qmfxml import default_schema
from pipeline.sim.manifest import read_manifest, record_row

from .conftest import START_NS


def decode_file(path: str) -> list[tuple[CapturedMessage, list[Record]]]:
    """The path every capture takes: read_capture, then CapturedMessage.decode."""
    registry = default_schema().registry()
    out = []
    for m in read_capture(path):
        res = m.decode(registry)
        assert res.ok, (m.routing_key, res.problems)
        out.append((m, res.records))
    return out


def pattern(key: str) -> str:
    key = re.sub(r"^console\.obj\.1\.0\..*", "console.obj.1.0.<package>.<class>", key)
    return re.sub(r"^console\.event\.1\.0\..*", "console.event.1.0.<package>.<event>", key)


def shape(decoded: list[tuple[CapturedMessage, list[Record]]]) -> dict[str, Any]:
    pats: set[tuple[str, str]] = set()
    names: dict[tuple[str, str], set[str]] = defaultdict(set)
    multi = 0
    for m, recs in decoded:
        key = m.routing_key or ""
        if not key.startswith(("console.obj.", "console.event.", "console.heartbeat.")):
            continue
        assert m.content_type is None and m.app_id is None  # qpidd's v1 messages carry neither
        multi = max(multi, len(recs))
        for r in recs:
            pats.add((pattern(key), r.opcode))
            if isinstance(r, ObjectSample):
                names[(r.class_name, r.opcode)].update(r.values)
    return {"patterns": pats, "names": names, "max_records": multi}


def test_am2_capture_decodes_like_the_real_sample(
    shared_dir: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "sim.jsonl")
    manifest = str(tmp_path / "manifest.jsonl")
    rc = main(
        [
            "sim",
            "--output",
            out,
            "--manifest",
            manifest,
            "--dialect",
            "am2",
            "--intervals",
            "4",
            "--queues",
            "40",
            "--start-ns",
            str(START_NS),
            "--restart",
            "0:2",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sim = decode_file(out)
    real = decode_file(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl"))
    # exactly the manifest
    rows = [r for r in read_manifest(manifest) if r.get("source") == "publish"]
    recs = [(m, r) for m, rs in sim for r in rs]
    assert len(sim) == summary["messages"] and len(recs) == len(rows) == summary["records"]
    for (m, r), row in zip(recs, rows, strict=True):
        assert m.routing_key == m.subject == row["routing_key"]
        assert record_row(r) == {k: row[k] for k in record_row(r)}
    # the same shape as real qpidd traffic
    s, q = shape(sim), shape(real)
    assert {
        ("console.obj.1.0.<package>.<class>", "c"),
        ("console.obj.1.0.<package>.<class>", "i"),
        ("console.event.1.0.<package>.<event>", "e"),
        ("console.heartbeat.1.0", "h"),
    } <= q["patterns"] & s["patterns"]
    for cls in ("queue", "exchange", "binding", "subscription", "session", "connection", "broker"):
        assert s["names"][(cls, "i")] == q["names"][(cls, "i")], cls  # every statistic, in both
        assert q["names"][(cls, "c")] <= s["names"][(cls, "c")], cls
    assert q["names"][("memory", "c")] == s["names"][("memory", "c")]
    assert s["max_records"] > 1 and q["max_records"] > 1  # batched records
    events_real = {r.event_name for _, rs in real for r in rs if isinstance(r, Event)}
    events_sim = {r.event_name for _, rs in sim for r in rs if isinstance(r, Event)}
    assert {"clientConnect", "queueDeclare", "queueDelete"} <= events_real & events_sim
    hashes_real = {
        (r.class_name, r.schema_hash)
        for _, rs in real
        for r in rs
        if isinstance(r, ObjectSample | Event)
    }
    hashes_sim = {
        (r.class_name, r.schema_hash)
        for _, rs in sim
        for r in rs
        if isinstance(r, ObjectSample | Event)
    }
    assert {
        ("queue", bytes.fromhex("3db4e9111b6b1523a48b6855f4c5627b"))
    } <= hashes_real & hashes_sim
    beats = [r.timestamp_ns for _, rs in sim for r in rs if isinstance(r, Heartbeat)]
    assert beats == [START_NS + k * 1_000_000_000 for k in range(1, 5)]


@pytest.mark.parametrize("dialect", ["am1", "v2"])
def test_other_dialects_to_capture(
    tmp_path: Any, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "sim.jsonl")
    manifest = str(tmp_path / "manifest.jsonl")
    assert (
        main(
            [
                "sim",
                "-o",
                out,
                "--manifest",
                manifest,
                "--dialect",
                dialect,
                "--intervals",
                "2",
                "--start-ns",
                str(START_NS),
            ]
        )
        == 0
    )
    capsys.readouterr()
    decoded = decode_file(out)
    rows = [r for r in read_manifest(manifest) if r.get("source") == "publish"]
    assert sum(len(rs) for _, rs in decoded) == len(rows)
    if dialect == "v2":
        m = decoded[0][0]
        assert m.app_id == "qmf2" and m.content_type in ("amqp/list", "amqp/map")
        assert m.application_properties["qmf.agent"].startswith("apache.org:qpidd:")
        assert all((x.routing_key or "").startswith("agent.ind.") for x, _ in decoded)
    else:
        assert all((x.routing_key or "").startswith("mgmt.") for x, _ in decoded)


def test_am1_capture_decodes_from_its_own_schemas(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """AM1 with an empty registry: the broadcast carries every class, event classes included
    (one event record named like the class), so every event decodes and equals the manifest."""
    out = str(tmp_path / "am1.jsonl")
    manifest = str(tmp_path / "manifest.jsonl")
    rc = main(
        [
            "sim",
            "-o",
            out,
            "--manifest",
            manifest,
            "--dialect",
            "am1",
            "--intervals",
            "5",
            "--start-ns",
            str(START_NS),
        ]
    )
    assert rc == 0
    capsys.readouterr()
    registry = SchemaRegistry()  # nothing known in advance
    recs: list[Record] = []
    for m in read_capture(out):
        res = m.decode(registry)
        assert res.problems == [], (m.routing_key, res.problems)
        recs.extend(res.records)
    rows = [r for r in read_manifest(manifest) if r.get("source") == "publish"]
    assert len(recs) == len(rows)
    for r, row in zip(recs, rows, strict=True):
        assert record_row(r) == {k: row[k] for k in record_row(r)}
    # the events, one by one, equal the manifest's (count and values)
    events = [r for r in recs if isinstance(r, Event)]
    event_rows = [row for row in rows if row["kind"] == "event"]
    assert [record_row(e) for e in events] == [
        {k: row[k] for k in record_row(events[0])} for row in event_rows
    ]
    assert len(events) == 19
    assert {e.event_name for e in events} >= {"clientConnect", "queueDeclare", "queueDelete"}
    # every class and event class of the schema came with the capture, as qmfxml has it
    ours = default_schema()
    assert sorted((s.key for s in registry), key=str) == sorted((c.key for c in ours), key=str)
    for c in ours:
        got = registry.get(c.key)
        assert got is not None and got.kind == c.schema.kind
        if c.is_event:
            assert got == c.schema
    # and the summary `qmf decode --summary` prints has no decode problems
    assert main(["decode", "--input", out, "--summary"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_problems"] == 0
    assert sum(summary["v1_events"].values()) == len(events)
    assert summary["v1_schemas_captured"] == len(ours) == 49


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    assert main(["sim", "-o", str(tmp_path / "x.jsonl"), "--batch", "0"]) == 2
    assert "batch" in capsys.readouterr().err


def test_realtime_run_stops_at_its_duration(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "rt.jsonl")
    rc = main(
        [
            "sim",
            "-o",
            out,
            "--realtime",
            "--duration",
            "1.5",
            "--intervals",
            "1000",
            "--queues",
            "3",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "duration"
    assert 1 <= summary["intervals"] < 1000
    assert len(decode_file(out)) == summary["messages"]


def test_rate_and_message_bounds_from_the_command_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "n.jsonl")
    assert (
        main(["sim", "-o", out, "--max-messages", "25", "--rate", "500", "--intervals", "100"]) == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["messages"], summary["stopped_by"]) == (25, "max_messages")
    assert len(decode_file(out)) == 25


def test_an_existing_capture_or_manifest_is_not_replaced_without_overwrite(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``qmf sim -o`` and ``--manifest`` truncated an existing file: now refused (exit 2,
    the file as it was) unless ``--overwrite``."""
    out, man = tmp_path / "sim.jsonl", tmp_path / "truth.jsonl"
    args = ["sim", "-o", str(out), "--manifest", str(man), "--intervals", "1", "--queues", "2"]
    out.write_text("an earlier capture\n")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (f"qmf sim: {out} already exists (19 bytes) and is left as it is: "
                   "--overwrite to replace it, or choose another file\n")  # fmt: skip
    assert out.read_text() == "an earlier capture\n" and not man.exists()
    out.unlink()
    man.write_text("an earlier manifest\n")
    assert main(args) == 2
    assert f"qmf sim: {man} already exists (20 bytes)" in capsys.readouterr().err
    assert man.read_text() == "an earlier manifest\n" and not out.exists()
    out.write_text("an earlier capture\n")
    assert main([*args, "--overwrite"]) == 0
    capsys.readouterr()
    assert [m.routing_key for m in read_capture(str(out))][:1] != []  # replaced by this run's
    assert "an earlier" not in out.read_text() + man.read_text()
