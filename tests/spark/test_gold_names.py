"""Gold names objects and brokers on real qpidd traffic (no Spark: silver and gold writers).

``../shared/samples/qpidd-amqp10/qmf1-qmf2-60s.jsonl`` is a qpidd 1.40 publishing QMF v1
(AM2, agent ``1.0``) and v2 (agent ``apache.org:qpidd:<uuid>``) while queues q-rate-5/20/50
took a known load. The broker, system and vhost objects are held back to a second gold
batch: the first names what it can, the second completes every row, as gold recomputes
names over all objects.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec.capture import read_capture
from pipeline.gold import GoldBatchWriter, GoldSettings, gold_input_arrow
from pipeline.lake import delta
from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows

SAMPLE = "samples/qpidd-amqp10/qmf1-qmf2-60s.jsonl"
BROKER = "amqp-broker@vm:25672"
HELD = ("broker", "system", "vhost")


def test_names_and_broker_identity_complete_when_their_targets_arrive(
    shared_dir: str, tmp_path: Path
) -> None:
    ss = SilverSettings(bronze=str(tmp_path / "bronze"), root=str(tmp_path / "silver"))
    msgs = list(read_capture(os.path.join(shared_dir, SAMPLE)))
    SilverBatchWriter(ss, app_id="silver").decode_local(bronze_rows(msgs), 0)
    samples = delta.read_arrow(os.path.join(ss.root, "object_samples"))
    beats = delta.read_arrow(os.path.join(ss.root, "heartbeats"))
    held = pc.is_in(samples["class_name"], pa.array(HELD))
    gs = GoldSettings(silver=ss.root, root=str(tmp_path / "gold"))
    gold = GoldBatchWriter(gs, app_id="gold")

    def lifecycles() -> pl.DataFrame:
        return pl.from_arrow(delta.read_arrow(gs.path("lifecycle_state")))  # type: ignore[return-value]

    gold.write(gold_input_arrow(samples.filter(pc.invert(held)), beats), 0)
    first = lifecycles()
    agents = sorted(first["agent"].unique().to_list())
    assert len(agents) == 2 and agents[0] == "1.0" and agents[1].startswith("apache.org:qpidd:")
    # No broker object yet: each row names its agent. The default vhost is not known
    # either; its queues are named by their queue names all the same.
    assert first.select("agent", "broker").unique().sort("agent").rows() == [(a, a) for a in agents]
    loaded = first.filter(pl.col("name").str.starts_with("q-rate-"))
    assert sorted(loaded.select("agent", "name").rows()) == sorted(
        (a, q) for a in agents for q in ("q-rate-20", "q-rate-5", "q-rate-50")
    )

    gold.write(gold_input_arrow(samples.filter(held), beats.slice(0, 0)), 1)
    after = lifecycles()
    assert after["broker"].unique().to_list() == [BROKER]  # both dialects, every row
    # The rows the second batch rewrote: every row (broker) of both agents.
    assert after.filter(pl.col("batch_id") == 1).height == after.height
    by_dialect = {
        d: sorted(g.filter(pl.col("class_name") != "system")["name"].to_list())
        for (d,), g in after.group_by("dialect")
    }
    assert by_dialect["AM2"] == by_dialect["V2"]  # AM2 and V2 name the same objects alike
    named = dict(after.filter(pl.col("dialect") == "V2").select("class_name", "name").unique().rows())
    assert named["vhost"] == "/" and named["broker"] == "amqp-broker" and named["acl"] == "acl"
    queues = set(after.filter(pl.col("class_name") == "queue")["name"].to_list())
    assert {"q-rate-5", "q-rate-20", "q-rate-50", "tq-1", "tq-2", "tq-3"} <= queues
    bindings = set(after.filter(pl.col("class_name") == "binding")["name"].to_list())
    assert '""/q-rate-50/q-rate-50' in bindings  # default exchange / queue / binding key
