"""`qmf sim --durable`: persistent messages in a durable queue survive a broker restart.

Without it RabbitMQ drops the simulator's (non-persistent, like qpidd's)
messages from a durable queue when the node restarts; the reliability tests
need the durable variant. Runs on a throw-away node.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import broker as qmf_broker

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _sim(url: str, manifest: Path, *extra: str) -> int:
    cmd = [
        sys.executable, "-m", "pipeline.cli", "sim", "--url", url, "--intervals", "2",
        "--queues", "3", "--seed", "5", "--manifest", str(manifest), *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return int(summary["messages"])


def test_durable_messages_survive_restart_non_durable_do_not(
    isolated_broker: Any, tmp_path: Path
) -> None:
    cfg = isolated_broker
    url = qmf_broker.local_info(cfg).url
    qmf_broker.declare_queue("sim-durable", [("qpid.management", "mgmt.#")], cfg=cfg)
    qmf_broker.declare_queue("sim-plain", [("qpid.management", "mgmt.#")], cfg=cfg)

    durable_sent = _sim(url, tmp_path / "a.jsonl", "--durable")
    plain_sent = _sim(url, tmp_path / "b.jsonl")
    assert durable_sent > 0 and plain_sent == durable_sent
    before = qmf_broker.queue_depths(cfg=cfg)
    assert before["sim-durable"] == durable_sent + plain_sent

    qmf_broker.restart_broker(cfg=cfg)
    after = qmf_broker.queue_depths(cfg=cfg)
    # Only the persistent copies survive, in both queues alike.
    assert after["sim-durable"] == durable_sent
    assert after["sim-plain"] == durable_sent
