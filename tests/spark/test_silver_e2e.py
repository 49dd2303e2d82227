"""The real sample through broker, receiver, bronze job and silver job: the summary's counts.

``qmf replay`` publishes the 20 s qpidd capture to the project-local broker,
``qmf receive`` lands it, the bronze job writes it (helpers of
``tests/integration``), then the silver job decodes bronze in batch mode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline import broker as qmf_broker
from pipeline.codec.capture import read_capture
from pipeline.lake import delta
from pipeline.silver import SilverSettings, run_silver_batch
from tests.integration.e2e import (
    Child,
    children,
    drain_to_bronze,
    landed_rows,
    qmf_cmd,
    receive_cmd,
    unique_tag,
    wait_for,
)
from tests.integration.test_crash_recovery import wait_ready
from tests.spark.test_silver import check_against_summary

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def test_real_sample_through_broker_receiver_bronze_and_silver(
    isolated_broker: Any, spark: Any, shared_dir: str, tmp_path: Path
) -> None:
    # A node of its own: the queue takes everything on the management exchanges, and on
    # the shared node another test process's traffic would land there too.
    broker = qmf_broker.local_info(isolated_broker)
    sample = Path(shared_dir) / "samples" / "qpidd-capture-20s.jsonl"
    summary = json.loads((Path(shared_dir) / "samples" / "qpidd-capture-20s.summary.json").read_text())
    queue = f"qmf-silver-{unique_tag()}"
    qmf_broker.declare_queue(
        queue, [("qpid.management", "#"), ("qmf.default.topic", "#")], cfg=isolated_broker
    )
    landing, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    try:
        with children() as procs:
            receiver = Child("receiver", receive_cmd(broker.url, queue, landing, "r0"), tmp_path)
            procs.append(receiver)
            wait_ready(receiver)
            replay = Child("replay", qmf_cmd("replay", "--url", broker.url, "--input", str(sample)),
                           tmp_path)  # fmt: skip
            procs.append(replay)
            assert replay.wait(120) == 0, replay.stderr()[-3000:]
            wait_for(lambda: landed_rows(landing) >= 863, 60, "863 messages landed")
            assert receiver.terminate(60) == 0, receiver.stderr()[-3000:]
    finally:
        qmf_broker.delete_queue(queue, cfg=isolated_broker)
    drain_to_bronze(spark, landing, table, ck)
    assert delta.read_arrow(str(table)).num_rows == 863
    s = SilverSettings(bronze=str(table), root=str(tmp_path / "silver"))
    run_silver_batch(spark, s, 0)
    check_against_summary(s, list(read_capture(sample)), summary)
    assert delta.read_arrow(s.path("quarantine")).num_rows == 0
