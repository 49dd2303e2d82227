"""Issue 5: several receivers compete on one durable queue; bronze gets the union once.

Three ``qmf receive`` children consume one durable queue (rabbitmq preset),
each into its own landing partition, while ``qmf sim`` publishes; one of them
is SIGKILLed mid-run, so the broker hands its unsettled deliveries to the
others (copies of messages it had already landed, in other partitions), and
is restarted on its partition. Every copy a redelivery made is marked
``duplicate_of`` its first copy (possibly in another partition), and the bronze
job (AvailableNow) holds each published message once, equal to the manifest.
Then 200 landed messages are published again field for field: to the broker
those are new messages (twins), so bronze gets each a second time.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from pipeline import broker as qmf_broker
from pipeline.lake import delta
from receivers.landing import LandingLog
from receivers.publisher import OutMessage, Publisher
from tests.integration.e2e import (
    Child,
    assert_bronze_is_the_manifest,
    children,
    drain_to_bronze,
    landed_keys,
    landed_rows,
    landed_table,
    manifest_messages,
    qmf_cmd,
    receive_cmd,
    sim_agent_uuid,
    sim_seed,
    unique_tag,
    wait_for,
)


def republish(url: str, rows: pa.Table) -> list[str]:
    """Publish landed rows again exactly as they came (same msg_key); their keys."""
    msgs = [
        OutMessage(
            routing_key=r["routing_key"], body=r["body"], content_type=r["content_type"],
            app_id=r["app_id"], message_id=r["message_id"], correlation_id=r["correlation_id"],
            application_properties=dict(r["application_properties"]) or None,
        )
        for r in rows.to_pylist()
    ]  # fmt: skip
    with Publisher(url) as pub:
        assert pub.publish_many(msgs) == len(msgs)
    return [str(k) for k in rows.column("msg_key").to_pylist()]


pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = ("c0", "c1", "c2")


def test_competing_receivers_union_lands_in_bronze_once(
    broker: Any, spark: SparkSession, tmp_path: Path
) -> None:
    seed = sim_seed()
    agent = sim_agent_uuid(seed)
    queue = f"qmf-compete-{unique_tag()}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{agent}.#")])
    landing, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    logs = tmp_path / "logs"
    logs.mkdir()
    manifest = tmp_path / "manifest.jsonl"

    def receiver(name: str, partition: str) -> Child:
        # A small credit window keeps the broker dealing messages round-robin to all three.
        cmd = receive_cmd(broker.url, queue, landing, partition, "--credit", "50",
                          "--flush-count", "25", "--flush-ms", "200")  # fmt: skip
        c = Child(name, cmd, logs)
        procs.append(c)
        wait_for(lambda: "ready: subscribed" in c.stderr() or not c.alive(), 60,
                 f"{name} to subscribe")  # fmt: skip
        assert c.alive(), c.stderr()[-3000:]
        return c

    try:
        with children() as procs:
            rs = {p: receiver(f"receiver-{p}", p) for p in PARTITIONS}
            sim = Child(
                "sim",
                qmf_cmd(
                    "sim", "--url", broker.url, "--dialect", "am1", "--seed", str(seed),
                    "--first-bank", str(10_000 + seed % 100_000), "--no-broker-key",
                    "--queues", "300", "--connections", "6", "--intervals", "20",
                    "--batch", "10", "--rate", "100", "--manifest", str(manifest),
                ),
                logs,
            )  # fmt: skip
            procs.append(sim)
            wait_for(lambda: landed_rows(landing) >= 400 or not sim.alive(), 120, "a run going")
            assert sim.alive(), "the kill must come mid-run"
            assert rs["c1"].kill() == -signal.SIGKILL
            rs["c1"] = receiver("receiver-c1-again", "c1")
            assert sim.wait(300) == 0, sim.stderr()[-3000:]
            summary = json.loads(sim.stdout().strip().splitlines()[-1])
            n = summary["messages"]
            wait_for(lambda: len(set(landed_keys(landing))) >= n, 120, "every message landed",
                     step_s=1.0)  # fmt: skip
            wait_for(lambda: qmf_broker.queue_depths().get(queue) == 0, 60, "an empty queue")
            landed = landed_table(landing)
            first_run = LandingLog(landing).end_offsets()
            drain_to_bronze(spark, landing, table, ck)
            out = assert_bronze_is_the_manifest(table, manifest, summary)
            assert set(out.column("partition").to_pylist()) <= set(PARTITIONS)
            # A publisher sending 200 landed messages again, field for field: new
            # deliveries to the broker (twins), never flagged as redelivered.
            resent = republish(broker.url, landed.filter(pc.is_null(landed["duplicate_of"]))
                               .slice(0, 200))  # fmt: skip
            wait_for(lambda: landed_rows(landing) >= sum(first_run.values()) + len(resent), 120,
                     "the copies landed", step_s=1.0)  # fmt: skip
            for c in rs.values():
                assert c.terminate(60) == 0, c.stderr()[-3000:]
    finally:
        qmf_broker.delete_queue(queue)

    log = LandingLog(landing)
    assert sorted(log.partitions()) == list(PARTITIONS)
    assert all(first_run[p] > 0 for p in PARTITIONS), first_run
    keys = landed.column("msg_key").to_pylist()
    expected, _ = manifest_messages(manifest)
    assert len(set(keys)) == len(expected) == n
    # Every extra landed copy of the run is a redelivery matched to its first copy.
    dups = landed.filter(pc.is_valid(landed["duplicate_of"]))
    assert dups.num_rows == len(keys) - n
    assert all(dups["redelivered"].to_pylist())
    first = {f"{r['partition']}:{r['offset']}": r["msg_key"]
             for r in landed.select(["partition", "offset", "msg_key"]).to_pylist()}  # fmt: skip
    assert [first[d] for d in dups["duplicate_of"].to_pylist()] == dups["msg_key"].to_pylist()

    drain_to_bronze(spark, landing, table, ck)  # the twins, from the same checkpoint
    after = delta.read_arrow(str(table))
    assert after.num_rows == n + len(resent)
    assert Counter(after["msg_key"].to_pylist()) == Counter(set(keys)) + Counter(resent)
    print(f"\n{n} messages; landed per partition {first_run}, "
          f"{dups.num_rows} redelivered copies matched after the kill; {len(resent)} twins")  # fmt: skip
