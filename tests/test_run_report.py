"""``qmf run``'s closing report: tables for people, ``--json`` the JSON (also saved), and
what it says about a data folder that already holds tables."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.commands.run import earlier_tables, log_paths, report

SUMMARY = {
    "bronze_rows": 12,
    "landed_messages": 12,
    "redeliveries_skipped": 0,
    "top_queues_by_enqueue_rate": [
        {"agent": "1.0", "queue": '["0-0-1-0-3","q-rate-50"]', "name": "q-rate-50",
         "broker": "amqp-broker@vm:5672", "enqueue_rate": 50.0, "intervals": 3}
    ],
}  # fmt: skip


def test_json_prints_the_summary_and_saves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "logs" / "summary-1.json"
    report(SUMMARY, True, saved)
    out = capsys.readouterr().out
    assert out == json.dumps(SUMMARY, indent=1) + "\n"
    assert saved.read_text() == out and json.loads(out) == SUMMARY


def test_tables_for_people_name_the_json_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "summary-1.json"
    report(SUMMARY, False, saved)
    out = capsys.readouterr().out
    assert "q-rate-50" in out and "amqp-broker@vm:5672" in out and "{" not in out
    assert out.splitlines()[-1] == f"qmf run: the summary as JSON: {saved}"
    assert json.loads(saved.read_text()) == SUMMARY


def test_log_paths_share_the_run_time(tmp_path: Path) -> None:
    assert log_paths(tmp_path, "20261126-174930") == (
        tmp_path / "logs" / "spark-20261126-174930.log",
        tmp_path / "logs" / "summary-20261126-174930.json",
    )


def test_a_data_folder_with_tables_is_said_to_continue(tmp_path: Path) -> None:
    """A second run into the same --data adds to the tables and its summary counts both
    runs: said once at the start rather than discovered in the totals."""
    from pipeline.lake import delta

    assert earlier_tables(tmp_path) is None
    delta.create_table(tmp_path / "bronze", pa.schema([("x", pa.int64())]), name="bronze")
    assert earlier_tables(tmp_path) is None  # created, empty: nothing to continue
    delta.append_arrow(pa.table({"x": [1, 2, 3]}), tmp_path / "bronze", app_id="t", batch_id=0)
    assert earlier_tables(tmp_path) == (
        f"qmf run: {tmp_path} already holds an earlier run's tables (bronze 3 rows): this run "
        "continues them and the summary counts them too (--data DIR for a new one)"
    )


def test_the_simulator_replaces_only_this_runs_manifest() -> None:
    """qmf run's own manifest is this run's (said when the agents start): --overwrite."""
    import argparse

    from pipeline.cli import build_parser
    from pipeline.commands.run import _sim_command

    args = build_parser().parse_args(["run", "--duration", "10"])
    assert isinstance(args, argparse.Namespace)
    cmd = _sim_command(args, "amqp://x", Path("/d/sim-manifest.jsonl"))
    assert cmd[cmd.index("--manifest") + 1 :] == ["/d/sim-manifest.jsonl", "--overwrite"]


def test_a_jvm_that_does_not_start_is_reported_with_its_own_words(tmp_path: Path) -> None:
    """The JVM's output goes to the log file, so when it fails to start, its last lines
    are quoted on the terminal (not only pyspark's "gateway exited"). A java that
    refuses to start stands in for a broken Java; --url: no broker is needed."""
    import os
    import subprocess
    import sys

    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\necho "Error: Could not create the Java Virtual Machine." >&2\n'
                    "exit 1\n")  # fmt: skip
    java.chmod(0o755)
    env = {**os.environ, "JAVA_HOME": str(java.parent.parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "run", "--url", "amqp://127.0.0.1:1", "--no-sim",
         "--duration", "1", "--data", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.splitlines()
    (log,) = (tmp_path / "data" / "logs").glob("spark-*.log")
    assert err[0] == (
        "qmf run: Spark did not start: [JAVA_GATEWAY_EXITED] Java gateway process exited "
        "before sending its port number."
    )
    assert "  Error: Could not create the Java Virtual Machine." in err
    assert err[-1] == f"  (Spark's and the JVM's output: {log})"
    assert "Traceback" not in proc.stderr
