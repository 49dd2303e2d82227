"""Issue 5, "Must show": the broker restarted mid-run with a durable queue loses nothing.

Runs on a throw-away node (``isolated_broker``) so the shared one is never
restarted. The simulator's AM1 messages (run in-process into memory, with its
manifest) are published as persistent messages to a durable queue; ``qmf
receive`` (child process, rabbitmq preset) lands them; the broker is restarted
gracefully while the queue still holds most of the run and the receiver holds
unsettled deliveries; the rest is published after the restart. The bronze job
(AvailableNow) then holds every message once, equal to the manifest.

Why not ``qmf sim`` against the broker here: it publishes transient messages
(no ``durable`` flag), which RabbitMQ drops from a durable queue at a restart,
and its publisher does not survive the broker going away.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import broker as qmf_broker
from pipeline.sim.manifest import Manifest
from pipeline.sim.model import LoadConfig
from pipeline.sim.runner import MemorySink, SimConfig, Simulation
from receivers.config import BrokerConfig
from receivers.publisher import Publisher
from tests.integration.e2e import (
    Child,
    assert_bronze_is_the_manifest,
    children,
    drain_to_bronze,
    landed_keys,
    landed_rows,
    receive_cmd,
    sim_agent_uuid,
    sim_seed,
    unique_tag,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def test_broker_restart_mid_run_durable_queue_to_bronze(
    isolated_broker: Any, spark: SparkSession, tmp_path: Path
) -> None:
    node = isolated_broker
    url = qmf_broker.local_info(node).url
    seed = sim_seed()
    agent = sim_agent_uuid(seed)
    manifest_path = tmp_path / "manifest.jsonl"
    manifest = Manifest(str(manifest_path), keep=False)
    sink = MemorySink()
    cfg = SimConfig(
        dialect="am1", load=LoadConfig(queues=500, connections=6), intervals=20, batch=10,
        seed=seed,
    )  # fmt: skip
    summary = Simulation(cfg, sink, manifest).run().__dict__
    manifest.close()
    msgs = [dataclasses.replace(m, durable=True) for m in sink.messages]
    n = len(msgs)
    assert n == summary["messages"] and n > 1_500

    queue = f"qmf-restart-{unique_tag()}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{agent}.#")], cfg=node)
    landing, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    logs = tmp_path / "logs"
    logs.mkdir()
    pub_cfg = BrokerConfig(urls=(url,))
    with children() as procs:
        receiver = Child(
            "receiver",
            # A deliberately slow consumer (20 in hand, one group per 200 ms, ~100 msg/s), so
            # the queue still holds most of the run when the broker restarts.
            receive_cmd(url, queue, landing, "p0", "--credit", "20", "--flush-count", "1000",
                        "--flush-ms", "200"),
            logs,
        )  # fmt: skip
        procs.append(receiver)
        wait_for(lambda: "ready: subscribed" in receiver.stderr() or not receiver.alive(), 60,
                 "the receiver to subscribe")  # fmt: skip
        with Publisher(pub_cfg) as pub:
            assert pub.publish_many(msgs[: n * 2 // 3]) == n * 2 // 3
        wait_for(lambda: landed_rows(landing) >= 50, 120, "the first messages landed")
        before = landed_rows(landing)
        depth = qmf_broker.queue_depths(cfg=node)[queue]
        qmf_broker.restart_broker(cfg=node)
        with Publisher(pub_cfg) as pub:
            assert pub.publish_many(msgs[n * 2 // 3 :]) == n - n * 2 // 3
        wait_for(lambda: len(set(landed_keys(landing))) >= n, 180, "every message landed",
                 step_s=1.0)  # fmt: skip
        wait_for(lambda: qmf_broker.queue_depths(cfg=node).get(queue) == 0, 60, "an empty queue")
        # One receiver process throughout: it reconnected by itself.
        assert receiver.terminate(60) == 0, receiver.stderr()[-3000:]
    # The restart came mid-run: the queue still held messages, some had landed.
    assert before < n * 2 // 3 and depth > 0

    drain_to_bronze(spark, landing, table, ck)
    landed = landed_keys(landing)
    out = assert_bronze_is_the_manifest(table, manifest_path, summary)
    assert set(out.column("partition").to_pylist()) == {"p0"}
    print(f"\n{n} messages, {len(landed)} landed rows ({len(landed) - n} copies), "
          f"queue depth {depth} at the restart")  # fmt: skip
