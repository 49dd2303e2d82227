"""`qmf run`, the README's main job, end to end on the real broker, Spark and Delta."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.broker import delete_queue
from pipeline.commands.run import QUEUE
from pipeline.lake import delta
from tests.integration.e2e import decoded_messages, manifest_messages, node_env
from tests.terminal import spark_noise

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def test_readme_main_command_lands_every_published_message_once(
    isolated_broker: Any, tmp_path: Path
) -> None:
    """The README's first command as written (``.venv/bin/qmf run``), only shorter.

    Default agents, queues and message sizes (large 'i' bodies: Parquet writes
    no statistics for them), tables in ``./data`` of the working folder. Bronze
    must then hold every message the simulator's manifest lists, exactly once.
    What a person reads: no Spark or JVM line on the terminal (they are in the log
    file it names), the summary as tables naming the top queues by their names; the
    JSON form of the same summary (saved beside the log) equals the manifest.
    """
    qmf = Path(sys.executable).parent / "qmf"
    env = node_env(isolated_broker)
    delete_queue(QUEUE, cfg=isolated_broker)  # the run's durable queue: start without leftovers
    try:
        proc = subprocess.run([str(qmf), "run", "--duration", "15"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    finally:
        delete_queue(QUEUE, cfg=isolated_broker)  # bound to mgmt.#: it would collect traffic
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "qmf run: done." in proc.stdout
    data = tmp_path / "data"

    # A quiet terminal: Spark's and the JVM's lines went to the log file named once.
    terminal = proc.stdout + proc.stderr
    assert spark_noise(terminal) == []
    our_line = re.compile(r"(qmf run: |(WARNING|ERROR|CRITICAL) (pipeline|receivers|schemas|qmf)\b)")
    assert [line for line in proc.stderr.splitlines() if not our_line.match(line)] == []
    (log,) = (data / "logs").glob("spark-*.log")
    assert terminal.count(f"qmf run: Spark's and the JVM's own output: {log}\n") == 1
    log_text = log.read_text()
    assert "WARNING: Using incubator modules" in log_text  # the JVM's stderr, kept
    assert spark_noise(log_text)  # Spark's own warnings are there, not lost
    # The summary for people: tables, the top queues by name.
    top = proc.stdout[proc.stdout.index("Top queues by enqueue rate") :].splitlines()[4:9]
    names = [line.split("│")[1].strip() for line in top]
    assert len(names) == 5 and all(re.fullmatch(r"q\d{5}", n) for n in names), top
    for title in ("Objects", "Events by severity", "Agents", "Pipeline"):
        assert f"\n{title}" in proc.stdout
    assert "{" not in proc.stdout  # no JSON dump without --json
    expected, expected_records = manifest_messages(data / "sim-manifest.jsonl")
    agents = {json.loads(m)[0].split(".")[1] for m in expected}
    assert len(agents) == 2  # the default two agents
    # This module's own node carries this run's traffic only: every row is its agents'
    # (AM1 routing keys name them: mgmt.<agent>.*).
    table = delta.read_arrow(str(data / "bronze"))
    ours = [(k or "").split(".")[1:2] in ([a] for a in agents)
            for k in table.column("routing_key").to_pylist()]  # fmt: skip
    assert all(ours), Counter(k for k, o in zip(table.column("routing_key").to_pylist(), ours, strict=True) if not o)
    got, got_records = decoded_messages(table)
    assert Counter(got) == Counter(expected)
    assert got_records == expected_records
    assert max(len(b) for b in table.column("body").to_pylist()) > 4096
    (saved,) = (data / "logs").glob("summary-*.json")
    assert f"qmf run: the summary as JSON: {saved}\n" in proc.stdout
    summary = json.loads(saved.read_text())  # what `qmf run --json` prints (test_run_report)
    assert summary["landed_messages"] - summary["redeliveries_skipped"] == summary["bronze_rows"]
    assert "qmf run: " in proc.stdout and " | bronze " in proc.stdout  # the progress line

    # Silver and gold, through the summary, against the manifest.
    rows = [json.loads(line) for line in open(data / "sim-manifest.jsonl", encoding="utf-8")]
    published = Counter(r["kind"] for r in rows if r.get("source") == "publish")
    creates = {(r["agent"], json.dumps(r["object_id"])): r["interval"] for r in rows
               if r.get("kind") == "create"}  # fmt: skip
    deletes = {(r["agent"], json.dumps(r["object_id"])): r["interval"] for r in rows
               if r.get("kind") == "delete"}  # fmt: skip
    assert summary["silver_object_samples"] == published["object"]
    assert summary["silver_events"] == sum(summary["events_by_severity"].values())
    assert summary["silver_events"] == published["event"]
    assert summary["silver_heartbeats"] == published["heartbeat"]
    assert summary["silver_quarantine"] == summary["silver_parked"] == 0
    objects = summary["objects"]
    assert (objects["created"], objects["deleted"]) == (len(creates), len(deletes))
    assert objects["transient"] == sum(1 for k, i in deletes.items() if creates.get(k) == i)
    assert [len(summary["top_queues_by_enqueue_rate"]), summary["agents"]["seen"]] == [5, 2]
    assert [q["name"] for q in summary["top_queues_by_enqueue_rate"]] == names
    brokers = {a["broker"] for a in summary["agents"]["by_agent"]}
    assert len(brokers) == 2 and all(b.startswith("amqp-broker@") for b in brokers), brokers


def test_qmf_run_console_asks_the_agents(isolated_broker: Any, tmp_path: Path) -> None:
    """--console: the embedded receiver sends B/P/Q (and S for unseen classes); replies land.

    The run lasts 15 s: the queries go out once the console's link is up, and each one
    crosses the broker twice (request, reply); in a CI run beside another test worker
    and its Spark session, 5 s saw one of the two Command Completes (2026-12-02)."""
    data = tmp_path / "data"
    queue = f"qmf.test-run-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable, "-m", "pipeline.cli", "run", "--data", str(data), "--queue", queue,
        "--duration", "15", "--agents", "1", "--queues", "3", "--console", "AM1", "--json",
    ]  # fmt: skip
    env = node_env(isolated_broker)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    finally:
        delete_queue(queue, cfg=isolated_broker)
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
