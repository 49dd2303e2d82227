"""Lakes for the live view's tests, built without Spark: captured or simulated QMF traffic
decoded by the silver writer on the driver, gold derived by the gold writer in several
batches cut in landing order (as the stream reads silver), in ``qmf run``'s layout
(``ROOT/silver/<table>``, ``ROOT/gold/<table>``).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec.capture import read_capture
from pipeline.commands.metrics import MetricsState, make_server
from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input_arrow
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

# The health families of the default exposition (tests/test_metrics.py checks their values).
HEALTH = ("qmf_agent_last_seen_timestamp_seconds", "qmf_agent_publish_interval_seconds",
          "qmf_agent_silence_seconds", "qmf_agent_up", "qmf_pipeline_newest_timestamp_seconds",
          "qmf_quarantined_messages_total", "qmf_events_total", "qmf_receiver_connected")  # fmt: skip
QPIDD_SAMPLE = "samples/qpidd-amqp10/qmf1-qmf2-60s.jsonl"
START_NS = 1_800_000_000_000_000_000
# Two AM2 agents, a few queues, short-lived queues (created and deleted: ended objects).
SIM_ARGS = ("--dialect", "am2", "--agents", "2", "--queues", "8", "--transients", "2",
            "--events", "2", "--intervals", "16", "--interval", "1", "--seed", "5",
            "--start-ns", str(START_NS))  # fmt: skip


def _offsets(t: pa.Table, lo: int, hi: int) -> pa.Table:
    return t.filter(pc.and_(pc.greater_equal(t["offset"], lo), pc.less(t["offset"], hi)))


@dataclass
class GoldRun:
    """Gold input cut into batches, of which the first ``written`` were written."""

    settings: GoldSettings
    batches: list[pl.DataFrame]
    written: int

    def write(self, batch: int, writer: GoldBatchWriter | None = None) -> None:
        """Writes gold batch ``batch`` (with ``writer``: e.g. one that skips a table)."""
        w = writer or GoldBatchWriter(self.settings, app_id="gold")
        w.write(self.batches[batch], batch)
        self.written = max(self.written, batch + 1)


def build(
    capture: str | os.PathLike[str], root: Path, batches: int, written: int | None = None
) -> GoldRun:
    """Silver from the capture, then gold in ``batches`` batches cut by landing offset, of
    which the first ``written`` (default: all) are written."""
    msgs = list(read_capture(os.fspath(capture)))
    ss = SilverSettings(bronze=str(root / "bronze"), root=str(root / "silver"))
    SilverBatchWriter(ss, app_id="silver").decode_local(bronze_rows(msgs), 0)
    samples = delta.read_arrow(os.path.join(ss.root, "object_samples"))
    beats = delta.read_arrow(os.path.join(ss.root, "heartbeats"))
    size = -(-len(msgs) // batches)
    cut = [
        gold_input_arrow(_offsets(samples, b * size, (b + 1) * size),
                         _offsets(beats, b * size, (b + 1) * size))
        for b in range(batches)
    ]  # fmt: skip
    run = GoldRun(GoldSettings(silver=ss.root, root=str(root / "gold")), cut, 0)
    for b in range(batches if written is None else written):
        run.write(b)
    return run


def simulate(root: Path) -> Path:
    """A ``qmf sim`` capture (``SIM_ARGS``) under ``root``."""
    from pipeline.cli import main

    root.mkdir(parents=True, exist_ok=True)
    capture = root / "sim.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["sim", "-o", str(capture), *SIM_ARGS]) == 0
    return capture


@contextlib.contextmanager
def metrics_server(root: Path) -> Iterator[str]:
    """``qmf serve-metrics``' HTTP server over the lake at ``root`` on a free port: its URL."""
    server = make_server(MetricsState(root), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
