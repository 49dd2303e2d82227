"""Issue 8, "Must show": bronze keeps one row per delivery, on real traffic and across a crash.

* The real 20 s qpidd sample (863 messages, 13 twins, 45 bodies over 4 KB)
  replayed through the broker (``qmf replay``), landed by ``qmf receive`` and
  written by the bronze job: 863 rows, the multiset of bodies equal to the
  capture's.
* A receiver SIGKILLed between landing a group and settling it, while twins
  are in flight: after a restart (on its own partition, or a competitor on
  another) every delivery is in bronze once, twins twice, and exactly the
  killed group's redeliveries are left out.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline import broker as qmf_broker
from pipeline.lake import delta
from receivers.publisher import Publisher
from tests.integration.e2e import (
    Child,
    children,
    drain_to_bronze,
    landed_rows,
    landed_table,
    qmf_cmd,
    receive_cmd,
    unique_tag,
    wait_for,
)
from tests.integration.test_crash_recovery import wait_ready

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def test_real_sample_through_broker_receiver_and_bronze(
    isolated_broker: Any, spark: Any, shared_dir: str, tmp_path: Path
) -> None:
    # A node of its own: the queue takes everything on the management exchanges, and on
    # the shared node another test process's traffic would land there too.
    broker = qmf_broker.local_info(isolated_broker)
    sample = Path(shared_dir) / "samples" / "qpidd-capture-20s.jsonl"
    with open(sample, encoding="utf-8") as f:
        capture = [json.loads(line) for line in f if line.strip()]
    want = Counter(base64.b64decode(c["body_base64"]) for c in capture)
    assert sum(want.values()) == 863
    twins = Counter(
        (c["routing_key"], c["body_base64"], json.dumps(c["application_properties"], sort_keys=True))
        for c in capture
    )
    assert sum(n - 1 for n in twins.values()) == 13  # the sample's twins
    queue = f"qmf-sample-{unique_tag()}"
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
    out = delta.read_arrow(str(table))
    assert out.num_rows == 863
    assert Counter(out.column("body").to_pylist()) == want
    assert sorted(Counter(zip(out["routing_key"].to_pylist(), out["body"].to_pylist(),
                              strict=True)).values()) == sorted(
        Counter((c["routing_key"], base64.b64decode(c["body_base64"])) for c in capture).values()
    )  # fmt: skip
    # Bodies over 4 KB: Spark's Parquet writer gives their chunks no statistics.
    assert sum(n for b, n in want.items() if len(b) > 4096) == 45


def _publish_with_twins(url: str, tag: str) -> list[tuple[str, bytes, tuple[tuple[str, str], ...]]]:
    """600 deliveries: 400 distinct messages, 150 sent twice, 25 three times, back to back."""
    sent: list[tuple[str, bytes, tuple[tuple[str, str], ...]]] = []
    with Publisher(url, window=500) as pub:
        for i in range(400):
            key = f"mgmt.{tag}.obj.org.apache.qpid.broker.queue{i % 9}"
            body = b"AM1c" + i.to_bytes(4, "big") + bytes([i % 251]) * (50 + i % 300)
            props = (("i", str(i)),)
            copies = 3 if i % 16 == 0 else 2 if i % 8 in (1, 3, 5) else 1
            for _ in range(copies):
                pub.publish(key, body, application_properties=dict(props))
                sent.append((key, body, props))
        pub.flush()
    return sent


@pytest.mark.parametrize("restart_on", ["r0", "r1"])
def test_receiver_killed_between_landing_and_settling_with_twins_in_flight(
    broker: Any, spark: Any, tmp_path: Path, restart_on: str
) -> None:
    tag = unique_tag()
    queue = f"qmf-twins-{tag}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{tag}.#")])
    landing, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    try:
        sent = _publish_with_twins(broker.url, tag)
        assert len(sent) == 600 and len(set(sent)) == 400
        with children() as procs:
            dying = Child(
                "dying",
                [sys.executable, "-m", "tests.integration.killed_receiver", broker.url, queue,
                 str(landing), "r0", "2"],
                tmp_path,
            )  # fmt: skip
            procs.append(dying)
            assert dying.wait(120) == -signal.SIGKILL, dying.stderr()[-3000:]
            m = re.search(r"landing group 2 \((\d+) messages\), next offset (\d+)", dying.stdout())
            assert m, dying.stdout() + dying.stderr()[-3000:]
            killed, end = int(m.group(1)), int(m.group(2))
            receiver = Child("receiver", receive_cmd(broker.url, queue, landing, restart_on),
                             tmp_path)  # fmt: skip
            procs.append(receiver)
            wait_ready(receiver)
            wait_for(lambda: qmf_broker.queue_depths().get(queue) == 0, 120, "an empty queue",
                     step_s=0.5)  # fmt: skip
            wait_for(lambda: landed_rows(landing) >= 600 + killed, 60, "every delivery landed")
            assert receiver.terminate(60) == 0, receiver.stderr()[-3000:]
    finally:
        qmf_broker.delete_queue(queue)

    rows = landed_table(landing).to_pylist()
    dups = [r for r in rows if r["duplicate_of"] is not None]
    # Exactly the killed group came back as matched redeliveries, each to its own first copy.
    assert sorted(r["duplicate_of"] for r in dups) == sorted(
        f"r0:{o}" for o in range(end - killed, end)
    )
    assert all(r["redelivered"] for r in dups)
    assert len(rows) == 600 + killed

    drain_to_bronze(spark, landing, table, ck)
    out = delta.read_arrow(str(table)).to_pylist()
    got = Counter(
        (r["routing_key"], r["body"], tuple(sorted(r["application_properties"])))
        for r in out
    )
    assert got == Counter(sent)  # every delivery once, twins twice, triplets three times
    assert len(out) == 600
