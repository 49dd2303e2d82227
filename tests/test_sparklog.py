"""Spark's and the JVM's output to a log file, our own records to the terminal."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.runtime import sparklog
from tests.terminal import spark_noise


@pytest.fixture
def clean_loggers() -> Iterator[None]:
    """Remove the handlers and settings the functions under test install."""
    yield
    for name in (*sparklog.OUR_LOGGERS, ""):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if getattr(h, "_qmf", False) or isinstance(h, logging.FileHandler):
                logger.removeHandler(h)
                h.close()
        logger.propagate = True


def test_every_line_of_a_child_record_is_marked() -> None:
    fmt = sparklog.MarkedFormatter(sparklog.LINE_FORMAT)
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("qmf.receiver", logging.ERROR, "f", 1, "stopped: %s", ("x",),
                                sys.exc_info())  # fmt: skip
    lines = fmt.format(rec).splitlines()
    assert lines[0] == "[qmf] ERROR qmf.receiver: stopped: x"
    assert lines[-1] == "[qmf] ValueError: boom"
    assert all(line.startswith(sparklog.MARKER) for line in lines) and len(lines) >= 4


def test_child_logging_only_where_the_driver_asked_for_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_loggers: None
) -> None:
    monkeypatch.delenv(sparklog.CHILD_ENV, raising=False)
    assert sparklog.child_logging() is False  # a spark-submit job: Python's defaults
    monkeypatch.setenv(sparklog.CHILD_ENV, "1")
    assert sparklog.child_logging() is True
    assert sparklog.child_logging() is True  # idempotent: one handler per logger
    assert sum(getattr(h, "_qmf", False) for h in logging.getLogger("qmf").handlers) == 1
    logging.getLogger("qmf.receiver").warning("disconnected (%s); reconnecting", "refused")
    logging.getLogger("pipeline.source").info("not shown: below WARNING")
    logging.getLogger("py4j.clientserver").warning("not ours")
    err = capsys.readouterr().err.splitlines()
    assert "[qmf] WARNING qmf.receiver: disconnected (refused); reconnecting" in err
    assert [line for line in err if line.startswith("[qmf]")] == [
        "[qmf] WARNING qmf.receiver: disconnected (refused); reconnecting"
    ]


def test_the_tail_forwards_only_marked_lines(tmp_path: Path) -> None:
    """From where the file ended when it started; a line split across writes waits."""
    log = tmp_path / "spark.log"
    log.write_text("[qmf] WARNING old: written before the tail started\n")
    got: list[str] = []
    tail = sparklog.LogTail(log, got.append)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("26/11/26 17:44:08 WARN DAGScheduler: Failed to cancel job group 1.\n")
        fh.write("[qmf] WARNING qmf.receiver: disconnected\n[qmf] ERROR pipeline.sou")
    assert tail.poll() == 1
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("rce: gone\n\tat java.base/java.lang.Thread.run(Thread.java:840)\n")
    assert tail.poll() == 1
    tail.stop()
    assert got == ["WARNING qmf.receiver: disconnected\n", "ERROR pipeline.source: gone\n"]


def test_driver_logging_ours_to_the_terminal_the_rest_to_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_loggers: None
) -> None:
    log = tmp_path / "spark.log"
    sparklog.terminal_logging(log)
    logging.getLogger("pipeline.silver").warning("1 parked message(s) still wait")
    logging.getLogger("py4j.clientserver").error("Closing down clientserver connection")
    for h in logging.getLogger().handlers:
        h.flush()
    assert capsys.readouterr().err == "WARNING pipeline.silver: 1 parked message(s) still wait\n"
    text = log.read_text()
    assert "ERROR py4j.clientserver: Closing down clientserver connection" in text
    assert "WARNING pipeline.silver: 1 parked message(s) still wait" in text  # complete file


WORKER_SCRIPT = """
import logging, os, sys
from pipeline.runtime import sparklog
from pipeline.spark import get_spark, spark_log

def warn_from_a_worker(batches):
    sparklog.child_logging()  # what our code in Spark's Python processes calls
    logging.getLogger("pipeline.test_worker").warning("hello from a Spark worker")
    yield from batches

spark = get_spark("qmf-test-log", log_file=sys.argv[1])
print("log:", spark_log(), flush=True)
print("our other children mark:", os.environ.get(sparklog.CHILD_ENV), flush=True)
rows = spark.range(0, 3, numPartitions=1).mapInArrow(warn_from_a_worker, "id long").count()
print("rows:", rows, flush=True)
spark.stop()
sparklog.flush()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_a_logged_spark_session_keeps_the_terminal_quiet(tmp_path: Path) -> None:
    """A JVM launched with a log file: its warnings and stderr land there, not on the
    terminal; a warning our code logs inside a Spark Python worker reaches the terminal
    (through the file and the driver's tail) once, without the marker."""
    log = tmp_path / "logs" / "spark.log"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop(sparklog.CHILD_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER_SCRIPT), str(log)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"log: {log}", "our other children mark: None", "rows: 3"]
    terminal = proc.stdout + proc.stderr
    assert spark_noise(terminal) == []
    assert proc.stderr.splitlines() == ["WARNING pipeline.test_worker: hello from a Spark worker"]
    text = log.read_text()
    assert text.startswith("# qmf-test-log (pid ")
    assert "WARNING: Using incubator modules" in text  # the JVM's stderr, before log4j
    assert "[qmf] WARNING pipeline.test_worker: hello from a Spark worker" in text
