"""Gold tables: statistic rates, object lifecycles, agent liveness, and the rate state.

Registered into ``schemas.tables.TABLES``. Times: QMF ``*_ns`` (exact int64)
beside Spark timestamps (microseconds). An object is ``(agent, object_id)``
where ``object_id`` is the dialect's object id as text (``pipeline.gold.transforms.
object_id``); the rates of one object's statistic form a *series* keyed by
``(agent, package, class_name, series)``, ``series`` being the index key when
known (so a re-created object or one renumbered by an agent restart continues
the series and its first interval says why there is no rate), else the object id.
A named broker of a fleet (silver's ``broker_name``, ``receivers.fleet``) qualifies
its agents, ``<broker_name>/<agent>``, and its broker identity, ``<broker_name>/...``
(``pipeline.gold.transforms.fleet_agent``): agent ids are unique within a broker only.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.tables import TABLES, TS

_OBJ = [
    pa.field("agent", pa.string(), nullable=False),
    pa.field("dialect", pa.string(), nullable=False),
    pa.field("package", pa.string(), nullable=False),
    pa.field("class_name", pa.string(), nullable=False),
    pa.field("object_id", pa.string(), nullable=False),
    pa.field("index_key", pa.string()),
]

# One row per (series, statistic) and pair of consecutive samples (by sample
# time). Counters: ``delta`` and ``rate`` (per second; NULL on a reset, with
# ``reset`` saying why; ``gap`` only for objects without a create time). A counter of an
# object created at most ``max_gap_s`` before its first sample, or re-created after its
# series' last sample (a restart), counts from 0 at its create time: that interval starts
# at the create time with ``prev_value`` 0, so an object's deltas sum to its last value.
# Other kinds carry values: ``value`` (as given at the
# end), ``prev_value`` and, for gauges, ``value_min``/``value_max`` of the two.
STATISTIC_RATES = pa.schema(
    [
        *_OBJ,
        pa.field("statistic", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("start_time", TS, nullable=False),
        pa.field("end_time", TS, nullable=False),
        pa.field("length_s", pa.float64(), nullable=False),
        pa.field("prev_value", pa.float64()),
        pa.field("value", pa.float64()),
        pa.field("delta", pa.float64()),
        pa.field("rate", pa.float64()),
        pa.field("value_min", pa.float64()),
        pa.field("value_max", pa.float64()),
        pa.field("reset", pa.string()),  # counter_decreased | recreated | agent_restart | gap
        pa.field("batch_id", pa.int64(), nullable=False),
    ]
)

# The baseline sample per (series, statistic): what the next sample pairs with;
# beside it, a later sample that came less than the minimum interval after it
# and waits (pending) until a later sample or the series going quiet.
# Rewritten whole by every gold batch (one file); deleted objects and series
# idle longer than the state TTL leave it.
RATE_STATE = pa.schema(
    [
        *_OBJ,
        pa.field("series", pa.string(), nullable=False),
        pa.field("statistic", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("update_ns", pa.int64(), nullable=False),
        pa.field("create_ns", pa.int64()),
        pa.field("generation", pa.int64()),  # epoch (AM2/V2) or boot sequence (AM1)
        pa.field("value", pa.float64()),
        # The create time this baseline still owes its first interval from (a new object
        # whose index key was not known yet); null once that interval was written.
        pa.field("from_create_ns", pa.int64()),
    ]
)

# Gold's lifecycle state: one row per object as one agent reports it (agent,
# object_id, create_ns: a V2 object re-created under the same name is a new row).
# ``state``: live | deleted | lost; ``end_reason``: deleted | agent_restart |
# agent_down (null while live). ``name``: the object's name for a person, its index
# references resolved to their targets' names (``pipeline.gold.names``: a queue of the
# default vhost is its queue name); ``broker``: its broker's identity,
# ``name@host:port``, the same for qpidd's AM2 and V2 agents. Both are recomputed every
# batch (a target seen later, or renamed). Rates and the live view join it on
# (agent, object_id); people read ``object_lifecycles``, its fold.
_LIFECYCLE = [
    pa.field("name", pa.string()),
    pa.field("broker", pa.string()),
    pa.field("create_ns", pa.int64(), nullable=False),  # 0 when the agent gave none
    pa.field("generation", pa.int64()),
    pa.field("created_at", TS),
    pa.field("deleted_at", TS),
    pa.field("first_seen", TS, nullable=False),
    pa.field("last_seen", TS, nullable=False),
    pa.field("first_seen_ns", pa.int64(), nullable=False),
    pa.field("last_seen_ns", pa.int64(), nullable=False),
    pa.field("samples", pa.int64(), nullable=False),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("properties_ns", pa.int64()),  # sample time of ``properties``
    pa.field("state", pa.string(), nullable=False),
    pa.field("end_reason", pa.string()),
    pa.field("ended_at", TS),
    pa.field("batch_id", pa.int64(), nullable=False),
]
LIFECYCLE_STATE = pa.schema([*_OBJ, *_LIFECYCLE])

# Who reported an object: one (agent, dialect, object_id) per lifecycle_state row folded.
REPORTER = pa.struct(
    [
        pa.field("agent", pa.string(), nullable=False),
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("object_id", pa.string(), nullable=False),
    ]
)

# One row per object, whichever agents and dialects reported it: the fold of
# ``lifecycle_state`` (``pipeline.gold.fold``) over its identity (broker, package,
# class_name, name, create_ns), e.g. qpidd's v1 agent ``1.0`` and v2 agent
# ``apache.org:qpidd:<uuid>``, or a query answer's object id without its epoch. A row
# whose broker or name is not known yet, or with no create time, is its own object.
# ``agent``, ``dialect``, ``object_id``, ``index_key`` and ``generation`` are the first
# reporter's (V2 before AM2 before AM1); times and ``samples`` span every reporter;
# ``state`` is ``deleted`` if any reporter saw the delete, else ``live`` if any is live;
# ``reporters`` lists them all. Rewritten whole by every gold batch that changed state.
OBJECT_LIFECYCLES = pa.schema(
    [*_OBJ, *_LIFECYCLE, pa.field("reporters", pa.list_(REPORTER), nullable=False)]
)

# One row per up interval of an agent, keyed (agent, up_start_ns): heartbeats
# continue it while the gap stays within ``missed`` intervals. ``state``:
# up (open) | down (missed heartbeats; ``down_at`` = last heartbeat + missed x
# interval, ``next_up`` = start of the next up interval if any) | restarted
# (the next heartbeat carried a new epoch). ``started_by``: first | restart | recovered.
AGENT_LIVENESS = pa.schema(
    [
        pa.field("agent", pa.string(), nullable=False),
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("epoch", pa.int64()),
        pa.field("up_start_ns", pa.int64(), nullable=False),
        pa.field("up_start", TS, nullable=False),
        pa.field("last_heartbeat_ns", pa.int64(), nullable=False),
        pa.field("last_heartbeat", TS, nullable=False),
        pa.field("heartbeats", pa.int64(), nullable=False),
        pa.field("interval_s", pa.float64(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("started_by", pa.string(), nullable=False),
        pa.field("down_at", TS),
        pa.field("next_up", TS),
        pa.field("batch_id", pa.int64(), nullable=False),
    ]
)

GOLD_TABLES: dict[str, pa.Schema] = {
    "statistic_rates": STATISTIC_RATES,
    "rate_state": RATE_STATE,
    "object_lifecycles": OBJECT_LIFECYCLES,
    "lifecycle_state": LIFECYCLE_STATE,
    "agent_liveness": AGENT_LIVENESS,
}
TABLES.update(GOLD_TABLES)
