"""`qmf run`, the README's main job, end to end on the real broker, Spark and Delta.

The shared broker may carry other traffic on the same exchange, so the test
checks the rows of its own simulated agent (routing keys name the agent's uuid)
against the simulator's manifest, exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline import delta
from pipeline.broker import delete_queue
from pipeline.codec.message import decode_message
from pipeline.codec.records import ObjectSample
from pipeline.codec.schema import SchemaRegistry

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def _manifest(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_qmf_run_lands_every_published_message_once(broker: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    queue = f"qmf.test-run-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable, "-m", "pipeline.cli", "run", "--data", str(data), "--queue", queue,
        "--duration", "6", "--agents", "1", "--queues", "5", "--progress", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    finally:
        delete_queue(queue)  # a durable queue bound to mgmt.# would collect traffic forever
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "qmf run: done." in proc.stdout

    manifest = _manifest(data / "sim-manifest.jsonl")
    published = [m for m in manifest if m.get("source") == "publish"]
    agent = published[0]["agent_uuid"]
    messages_sent = len({m["message"] for m in published})

    table = delta.read_arrow(str(data / "bronze"))
    rows = [r for r in table.to_pylist() if agent in (r["routing_key"] or "")]
    rows.sort(key=lambda r: (r["partition"], r["offset"]))
    assert len(rows) == messages_sent
    assert len({r["msg_key"] for r in rows}) == messages_sent

    registry = SchemaRegistry()
    decoded: Counter[tuple[Any, ...]] = Counter()
    problems = []
    for r in rows:
        result = decode_message(
            r["body"],
            registry=registry,
            application_properties=r["application_properties"],
            content_type=r["content_type"],
            app_id=r["app_id"],
            routing_key=r["routing_key"],
        )
        problems.extend(result.problems)
        for rec in result.records:
            if isinstance(rec, ObjectSample):
                decoded[("object", rec.opcode, rec.class_name, rec.update_ns)] += 1
            else:
                decoded[(rec.opcode,)] += 1
    assert problems == []
    expected: Counter[tuple[Any, ...]] = Counter()
    for m in published:
        if m["kind"] == "object":
            expected[("object", m["opcode"], m["class_name"], m["update_ns"])] += 1
        else:
            expected[(m["opcode"],)] += 1
    assert decoded == expected


def test_qmf_run_console_asks_the_agents(broker: Any, tmp_path: Path) -> None:
    """--console: the embedded receiver sends B/P/Q (and S for unseen classes); replies land."""
    data = tmp_path / "data"
    queue = f"qmf.test-run-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable, "-m", "pipeline.cli", "run", "--data", str(data), "--queue", queue,
        "--duration", "5", "--agents", "1", "--queues", "3", "--console", "AM1",
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    finally:
        delete_queue(queue)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("\n{") : proc.stdout.rindex("}") + 1])
    ops = summary["records_by_opcode"]
    assert ops["b"] == 1  # the one Broker Response to the console's Broker Request
    assert ops["z"] >= 2  # Command Completes ending the P and Q queries
    assert summary["decode_problems"] == 0
    # One bronze row per delivery: identical replies (twins) are deliveries too,
    # so rows are not distinct by content; only matched redeliveries are skipped.
    assert summary["bronze_rows"] == summary["landed_messages"] - summary["redeliveries_skipped"]
    assert summary["bronze_rows"] > 0
