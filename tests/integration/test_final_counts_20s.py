"""Issue 47, "Must show", on the 20 s AMQP 0-10 sample (qpidd with QMF v1 and v2, many
short-lived queues, 21 query responses of another console): replayed through the real
RabbitMQ node and receiver, then bronze, silver and gold.

* every deleted queue (the sample's delete records) ends in gold with the delete
  record's counts, and its deltas from its creation sum to them;
* no object is under two agents: ``object_lifecycles`` has one row per object, folded
  from qpidd's v1 and v2 agents, and the query responses (``qmf.agent: broker``) are
  named for qpidd's own agent by the receiver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.final_counts import (
    check_final_counts,
    deleted_queue_finals,
    objects_per_identity,
    reporters_per_identity,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

SAMPLE = "qpidd-capture-20s.jsonl"
QPIDD = "apache.org:qpidd:96e8ff02-7df9-4aaa-b0bd-0ef186095f23"


@pytest.fixture(scope="module")
def lake(
    isolated_broker: Any, spark: Any, shared_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    from tests.integration.test_qpidd_amqp10 import _through_the_pipeline

    # Paced, so the exchanges' messages reach the queue in the capture's order: the
    # replies came 4 s after qpidd's first heartbeat, which names their agent.
    return _through_the_pipeline(
        isolated_broker, spark, Path(shared_dir) / "samples" / SAMPLE, tmp_path_factory.mktemp("q20"),
        replay_rate=400.0,
    )  # fmt: skip


def test_every_deleted_queue_ends_with_its_final_counts(lake: Path, shared_dir: str) -> None:
    finals = deleted_queue_finals(Path(shared_dir) / "samples" / SAMPLE)
    assert len(finals) == 34  # 17 queues deleted, each seen in AM2 and in V2
    got = check_final_counts(lake, Path(shared_dir) / "samples" / SAMPLE)
    assert got == {"queues": 34, "sums": 68}


def test_no_object_under_two_agents(lake: Path) -> None:
    """One ``object_lifecycles`` row per object: qpidd's v1 agent ``1.0`` and its v2 agent
    report each of the 173 objects (and the query answers, ``qmf.agent: broker``, are
    named for the v2 agent by the receiver), and the row names the v2 agent."""
    per = objects_per_identity(lake)
    assert len(per) == 173 and all(len(rows) == 1 for rows in per.values())
    rows = [rows[0] for rows in per.values()]
    assert {r["agent"] for r in rows} == {QPIDD} and {r["dialect"] for r in rows} == {"V2"}
    assert {rep["agent"] for r in rows for rep in r["reporters"]} == {QPIDD, "1.0"}
    assert len({r["broker"] for r in rows}) == 1  # one broker


def test_each_object_is_folded_from_both_dialects(lake: Path) -> None:
    """Every object's (broker, class, name, create time) has one lifecycle_state row per
    dialect that reported it: the v1 and v2 agents of the one broker, and the query
    answers, agree; the fold's reporters are exactly those rows."""
    per = reporters_per_identity(lake)
    # One exception, qpidd's: the first query answer of exchange tool-ex1 gave its object
    # id no _agent_epoch (the later answers and publishes do), so V2 has two object ids,
    # both folded into its one row.
    odd = {k[2]: v for k, v in per.items() if v != ["AM2", "V2"]}
    assert odd == {"tool-ex1": ["AM2", "V2", "V2"]}
    assert len(per) == 173
    folded = objects_per_identity(lake)
    assert {k: sorted(rep["dialect"] for rep in rows[0]["reporters"]) for k, rows in folded.items()} == per
