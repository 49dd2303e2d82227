"""Issue 49, "Many brokers, one pipeline": two real broker nodes, one ``qmf receive --config``.

The shared node is broker ``east``, a throw-away node (``isolated_broker``) broker
``west``. The same simulated agents (one seed: the same agent ids, the same
messages) publish persistent messages to a durable queue on each, so nothing but
the broker tells their records apart: exactly the collision a fleet must survive
(qpidd's v1 agent is ``1.0`` on every broker). The fleet file also names a broker
that is down (a closed port) and one that refuses our credentials: neither stops
the others. ``west``, a deliberately slow consumer reached through a relay, is stopped
mid-run while its durable queue still holds most of its messages and its receiver holds
unsettled deliveries (the relay is frozen first, so the stop cannot race the drain), and
started again: ``east`` keeps landing meanwhile, the same ``west``
receiver reconnects by itself and resumes; nothing is lost or doubled. Then bronze (the job's stream), silver and gold:

- bronze holds each broker's manifest exactly once, in partitions ``<name>-<n>``,
  each row with its ``broker_name``;
- silver keeps ``broker_name`` on every row, the two brokers' rows alike;
- gold keys each broker's agents apart (``east/<agent>``, ``west/<agent>``), and its
  rates and lifecycles of one broker equal the other's.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from pipeline import broker as qmf_broker
from pipeline.lake import delta
from pipeline.sim.manifest import Manifest
from pipeline.sim.model import LoadConfig
from pipeline.sim.runner import MemorySink, SimConfig, Simulation
from receivers.config import BrokerConfig
from receivers.landing import LandingLog
from receivers.publisher import Publisher
from tests.integration.e2e import (
    Child,
    assert_bronze_is_the_manifest,
    children,
    drain_to_bronze,
    qmf_cmd,
    sim_agent_uuid,
    sim_seed,
    unique_tag,
    wait_for,
)
from tests.relay import FreezableRelay

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]



def _landed_by_broker(landing: Path) -> dict[str, int]:
    log = LandingLog(landing)
    out: dict[str, int] = {}
    starts = log.start_offsets()
    for p, end in log.end_offsets().items():
        t = log.read(p, starts[p], end)
        for name in t.column("broker_name").to_pylist():
            out[name] = out.get(name, 0) + 1
    return out


def _strip(df: pl.DataFrame, broker: str) -> pl.DataFrame:
    """One broker's gold rows with its prefix taken off the agent, in a stable order."""
    prefix = f"{broker}/"
    rows = df.filter(pl.col("agent").str.starts_with(prefix)).with_columns(
        pl.col("agent").str.strip_prefix(prefix)
    )
    if "broker" in rows.columns:  # gold's broker identity starts with the fleet name too
        assert rows["broker"].str.starts_with(prefix).all()
        rows = rows.with_columns(pl.col("broker").str.strip_prefix(prefix))
    if "reporters" in rows.columns:  # the agents that reported each folded object
        rows = rows.with_columns(
            pl.col("reporters").list.eval(pl.element().struct.field("agent").str.strip_prefix(prefix))
        )
    keep = [c for c in rows.columns if c != "batch_id"]
    return rows.select(keep).sort(keep, nulls_last=True)


def test_two_brokers_one_stopped_and_restarted_mid_run(
    broker: Any, isolated_broker: Any, spark: SparkSession, tmp_path: Path
) -> None:
    east_url, west_url = broker.url, qmf_broker.local_info(isolated_broker).url
    west_relay = FreezableRelay(west_url)  # the receiver's way to west; the publisher's is direct
    seed = sim_seed()
    agent = sim_agent_uuid(seed)
    manifest_path = tmp_path / "manifest.jsonl"
    manifest = Manifest(str(manifest_path), keep=False)
    sink = MemorySink()
    cfg = SimConfig(dialect="am1", load=LoadConfig(queues=60, connections=2), intervals=12,
                    batch=10, seed=seed)  # fmt: skip
    summary = Simulation(cfg, sink, manifest).run().__dict__
    manifest.close()
    msgs = [dataclasses.replace(m, durable=True) for m in sink.messages]
    n = len(msgs)
    third = n // 3

    queue = f"qmf-fleet-{unique_tag()}"
    binding = [("qpid.management", f"mgmt.{agent}.#")]
    qmf_broker.declare_queue(queue, binding)
    qmf_broker.declare_queue(queue, binding, cfg=isolated_broker)
    bad = tmp_path / "bad.credentials"
    bad.write_text("user=qmf\npassword=not-the-password\n", encoding="utf-8")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f"""
[defaults]
preset = "rabbitmq"
queue = "{queue}"
heartbeat_interval = 1

[[broker]]
name = "east"
url = "{east_url}"

[[broker]]
name = "west"
url = "{west_relay.url}"
credit = 10          # a deliberately slow consumer (~20 msg/s): the stop finds the queue
flush_count = 1000   # still holding messages and the receiver holding unsettled ones
flush_ms = 500

[[broker]]
name = "gone"
url = "amqp://127.0.0.1:{qmf_broker.free_port()}"

[[broker]]
name = "locked"
url = "{east_url.replace("guest:guest@", "")}"
credentials_file = "bad.credentials"
sasl = ["PLAIN"]
""", encoding="utf-8")  # fmt: skip
    landing, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    logs = tmp_path / "logs"
    logs.mkdir()
    east_pub, west_pub = BrokerConfig(urls=(east_url,)), BrokerConfig(urls=(west_url,))
    try:
        with children() as procs:
            receiver = Child("receivers", qmf_cmd("receive", "--config", str(fleet), "--landing",
                                                  str(landing)), logs)  # fmt: skip
            procs.append(receiver)
            wait_for(lambda: "ready:" in receiver.stderr() or not receiver.alive(), 90,
                     "the fleet's receivers to start")  # fmt: skip
            err = receiver.stderr()
            assert "broker east: subscribed, partition east-0" in err, err
            assert "broker west: subscribed, partition west-0" in err, err
            with Publisher(east_pub) as pub:
                assert pub.publish_many(msgs[:third]) == third
            with Publisher(west_pub) as pub:
                assert pub.publish_many(msgs[: 2 * third]) == 2 * third
            # Stopped once its first messages landed, with most of the 2/3 published still
            # in its queue or in the receiver's hands. The relay is frozen first: a graceful
            # stop under CI's load took long enough for the receiver to drain the whole
            # queue meanwhile (CI-13, CI-15, CI-27). Thawed after the stop, the relay passes
            # on what the node sent before it went (at most the credit's worth of
            # deliveries, then the close), and refuses the receiver's reconnects while the
            # node is down.
            wait_for(lambda: _landed_by_broker(landing).get("west", 0) >= 10, 120,
                     "west's first messages landed", step_s=0.05)  # fmt: skip
            west_relay.freeze()
            qmf_broker.stop_broker(cfg=isolated_broker)
            west_relay.thaw()
            stopped_at = time.monotonic()
            # East carries on while west is down: its second third lands meanwhile.
            with Publisher(east_pub) as pub:
                assert pub.publish_many(msgs[third : 2 * third]) == third
            wait_for(lambda: _landed_by_broker(landing).get("east", 0) >= 2 * third, 120,
                     "east's second third landed while west is down")  # fmt: skip
            east_while_down = time.monotonic() - stopped_at
            west_down = _landed_by_broker(landing).get("west", 0)

            qmf_broker.start_broker(cfg=isolated_broker)
            with Publisher(west_pub) as pub:
                assert pub.publish_many(msgs[2 * third :]) == n - 2 * third
            with Publisher(east_pub) as pub:
                assert pub.publish_many(msgs[2 * third :]) == n - 2 * third
            wait_for(lambda: min(_landed_by_broker(landing).get(b, 0) for b in ("east", "west"))
                     >= n, 180, "every message of both brokers landed", step_s=1.0)  # fmt: skip
            wait_for(lambda: qmf_broker.queue_depths(cfg=isolated_broker).get(queue) == 0, 60,
                     "west's queue empty")  # fmt: skip
            assert receiver.terminate(60) == 0, receiver.stderr()[-3000:]
        err = receiver.stderr()
    finally:
        west_relay.close()
        qmf_broker.delete_queue(queue)
        if qmf_broker.broker_status(cfg=isolated_broker).running:
            qmf_broker.delete_queue(queue, cfg=isolated_broker)
    # The broker that refused us was retried, and said why; the one that is down never
    # stopped the others; neither landed anything.
    assert "broker locked: failed (" in err and "retried" in err, err
    assert "stopped locked: not running" in err or "stopped locked: 0 received" in err, err
    assert "stopped gone: 0 received, 0 landed" in err, err
    assert set(_landed_by_broker(landing)) == {"east", "west"}
    # West stopped mid-run: its queue still held messages, some had landed; what it had
    # in hand unsettled came again after the start (matched, or landed as copies).
    assert 0 < west_down < 2 * third, west_down
    print(f"\n{n} messages per broker; {west_down} of west's had landed when it stopped; "
          f"east's second third landed in {east_while_down:.1f} s "
          "while west was down")  # fmt: skip

    drain_to_bronze(spark, landing, table, ck)
    for name in ("east", "west"):
        out = assert_bronze_is_the_manifest(table, manifest_path, summary, broker_name=name)
        assert set(out.column("partition").to_pylist()) == {f"{name}-0"}

    from pipeline.gold import GoldSettings, run_gold_batch
    from pipeline.silver import SilverBatchWriter, SilverSettings

    silver = SilverSettings(bronze=str(table), root=str(tmp_path / "silver"))
    SilverBatchWriter(silver, app_id="qmf-silver").decode_local(delta.read_arrow(str(table)), 0)
    samples = delta.read_arrow(str(tmp_path / "silver" / "object_samples"))
    by = samples.group_by("broker_name").aggregate([("offset", "count")]).to_pylist()
    counts = {r["broker_name"]: r["offset_count"] for r in by}
    assert set(counts) == {"east", "west"} and counts["east"] == counts["west"] > 0
    beats = delta.read_arrow(str(tmp_path / "silver" / "heartbeats"))
    assert pc.count_distinct(beats.column("broker_name")).as_py() == 2

    gold = tmp_path / "gold"
    run_gold_batch(spark, GoldSettings(silver=str(tmp_path / "silver"), root=str(gold)), 0,
                   app_id="qmf-gold")  # fmt: skip
    for name in ("statistic_rates", "object_lifecycles", "agent_liveness"):
        df = pl.read_delta(str(gold / name))
        agents = set(df["agent"].to_list())
        assert agents and all(a.split("/", 1)[0] in ("east", "west") for a in agents), agents
        east, west = _strip(df, "east"), _strip(df, "west")
        assert east.height > 0 and east.equals(west), name

    # The live view (qmf top, qmf serve-metrics) groups by broker: each queue once per
    # broker, every broker identity starting with its fleet name, the two alike.
    from pipeline.views.live import LiveView

    view = LiveView(tmp_path)
    view.refresh()
    queues = view.queues()
    assert {q.broker.split("/", 1)[0] for q in queues} == {"east", "west"}

    def live(name: str) -> list[tuple[Any, ...]]:
        return sorted((q.broker.split("/", 1)[1], q.name, q.enqueue_rate, q.depth)
                      for q in queues if q.broker.startswith(f"{name}/"))  # fmt: skip

    assert live("east") and live("east") == live("west")
