"""What every notebook in ``notebooks/`` needs: where the tables are, how to read them,
a SparkSession, and where figures go.

Notebooks read the folder ``qmf run --data DATA`` wrote (``QMF_DATA``, default
``data``): ``DATA/bronze``, ``DATA/silver/<table>``, ``DATA/gold/<table>``.
Plain reads go through polars' native Delta reader, which lists the table's
files with delta-rs and reads them itself; ``DeltaTable.to_pandas`` and
``to_pyarrow_table``/``to_pyarrow_dataset`` are avoided because they can
abort the process at exit (docs: spark-delta-notes pitfall 7). Spark reads go
through ``pipeline.lake.delta.read_table`` with the project's session.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.views.alerts import AlertThresholds
from pipeline.views.live import last_index_value

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure
    from pyspark.sql import DataFrame, SparkSession

DATA_ENV = "QMF_DATA"
OUT_ENV = "QMF_NOTEBOOK_OUT"
LAYERS = ("bronze", "silver", "gold")


def data_root() -> Path | str:
    """The ``qmf run --data`` folder the notebook reads, or a bucket's URI
    (``s3a://bucket/prefix``, the store's settings from the standard variables)."""
    from pipeline.views.live import data_location

    return data_location(os.environ.get(DATA_ENV, "data"))


def table_path(layer: str, name: str | None = None) -> Path | str:
    """``DATA/bronze`` or ``DATA/<silver|gold>/<name>``."""
    from pipeline.lake import storage

    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; one of {LAYERS}")
    root = data_root()
    if layer == "bronze":
        parts = ["bronze"]
    elif not name:
        raise ValueError(f"a {layer} table needs a name")
    else:
        parts = [layer, name]
    return storage.join(root, *parts) if isinstance(root, str) else root.joinpath(*parts)


def read_polars(layer: str, name: str | None = None) -> pl.DataFrame:
    """The whole table as a polars DataFrame (an empty table gives its columns, no rows)."""
    import polars as pl

    from pipeline.lake import delta

    path = table_path(layer, name)
    if not delta.table_exists(path):
        raise FileNotFoundError(
            f"no Delta table at {path}: is {DATA_ENV} the qmf run --data folder?"
        )
    if isinstance(path, str):  # on a store
        from pipeline.lake import storage

        return pl.read_delta(path, storage_options=storage.S3Settings.from_env().storage_options())
    return pl.read_delta(str(path))


def _latest(life: pl.DataFrame) -> pl.DataFrame:
    """The latest lifecycle row of every (agent, object_id): max batch_id, then last_seen_ns."""
    return (
        life.sort("batch_id", "last_seen_ns")
        .group_by("agent", "object_id", maintain_order=True)
        .last()
    )


def _with_key_names(frame: pl.DataFrame, missing: pl.Expr) -> pl.DataFrame:
    """``frame`` + ``_from_key``: the last value of the index key of the rows where
    ``missing`` holds, computed once per distinct key (rates repeat a key on millions
    of rows)."""
    import polars as pl

    keys = frame.filter(missing).select("index_key").unique().drop_nulls()
    keys = keys.with_columns(
        pl.col("index_key")
        .map_elements(last_index_value, return_dtype=pl.String)
        .alias("_from_key")
    )
    return frame.join(keys, on="index_key", how="left", maintain_order="left")


def object_names(life: pl.DataFrame) -> pl.DataFrame:
    """One row per (agent, object_id) of gold ``lifecycle_state``: the object's current
    ``name`` (its latest row's). Tables from before gold carried names (no ``name`` column,
    or null) fall back to the index key's last value, then the object id, so a notebook
    still says ``q00021`` rather than ``["1-1-3","q00021"]``."""
    import polars as pl

    latest = _latest(life)
    if "name" not in latest.columns:
        latest = latest.with_columns(pl.lit(None, pl.String).alias("name"))
    latest = _with_key_names(latest, pl.col("name").is_null())
    return latest.select(
        "agent",
        "object_id",
        pl.coalesce("name", "_from_key", "object_id").alias("name"),
    )


def with_names(frame: pl.DataFrame, names: pl.DataFrame, alias: str = "name") -> pl.DataFrame:
    """``frame`` (statistic rates, which carry no names) with the object's name as ``alias``,
    joined on (agent, object_id); a row with no lifecycle is named from its own index key,
    else its object id."""
    import polars as pl

    joined = frame.join(
        names.select("agent", "object_id", pl.col("name").alias("_name")),
        on=["agent", "object_id"],
        how="left",
        maintain_order="left",
    )
    joined = _with_key_names(joined, pl.col("_name").is_null())
    return joined.with_columns(pl.coalesce("_name", "_from_key", "object_id").alias(alias)).drop(
        "_name", "_from_key"
    )


def agent_brokers(life: pl.DataFrame) -> dict[str, tuple[str, str]]:
    """agent id -> (its broker, its dialect): the gold ``broker`` of the agent's latest
    lifecycle row that has one; the agent id when no broker object was seen or the table
    predates the column."""
    import polars as pl

    brokers: dict[str, str] = {}
    if "broker" in life.columns:
        named = life.filter(pl.col("broker").is_not_null() & (pl.col("broker") != pl.col("agent")))
        brokers = dict(_by_agent_latest(named).select("agent", "broker").iter_rows())
    dialects = dict(_by_agent_latest(life).select("agent", "dialect").iter_rows())
    return {a: (brokers.get(a) or a, d) for a, d in sorted(dialects.items())}


def agent_labels(life: pl.DataFrame) -> dict[str, str]:
    """agent id -> how a person names it: its broker (``agent_brokers``). One broker
    publishing through several agents (qpidd's QMF v1 and v2) gets the dialect added,
    ``amqp-broker@vm:25672 (V2)``; agents that still share a label get the start of
    their id, so no two agents read the same."""
    brokers = agent_brokers(life)
    labels = {a: broker for a, (broker, _) in brokers.items()}
    labels = _disambiguate(labels, lambda a: brokers[a][1], "({})")
    return _disambiguate(labels, lambda a: a[:8], "[{}]")


def one_agent_per_broker(frame: pl.DataFrame, life: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """The rows of ``frame`` (with ``agent`` and ``key``, e.g. a queue's name) from one
    agent per broker and key: qpidd publishes every object through two agents of one
    broker (QMF v1 and v2), which would show each queue twice. The V2 agent's rows are
    kept, else the lowest agent id's (the live view's choice on a tie)."""
    import polars as pl

    brokers = agent_brokers(life)
    agents = pl.DataFrame(
        {
            "agent": list(brokers),
            "_broker": [b for b, _ in brokers.values()],
            "_not_v2": [d != "V2" for _, d in brokers.values()],
        },
        schema={"agent": pl.String, "_broker": pl.String, "_not_v2": pl.Boolean},
    )
    ranked = frame.join(agents, on="agent", how="left", maintain_order="left").with_columns(
        pl.coalesce("_broker", "agent").alias("_broker"), pl.col("_not_v2").fill_null(True)
    )
    pick = ranked.group_by("_broker", *key).agg(
        pl.col("agent").sort_by("_not_v2", "agent").first().alias("_pick")
    )
    return (
        ranked.join(pick, on=["_broker", *key], how="left", maintain_order="left")
        .filter(pl.col("agent") == pl.col("_pick"))
        .drop("_broker", "_not_v2", "_pick")
    )


# Events of this severity or worse are alert-worthy: the rule QmfBrokerEvent's default.
ALERT_SEVERITY = AlertThresholds.event_severity
# The event arguments that name what an event is about, first found wins.
EVENT_OBJECT_ARGUMENTS = ("qName", "exName", "rhost")


def alert_events(
    events: pl.DataFrame, life: pl.DataFrame, least: str = ALERT_SEVERITY
) -> pl.DataFrame:
    """The events operators are alerted on (severity ``least`` or worse: the rule
    ``QmfBrokerEvent``, docs/alerts.md), newest first, each with its broker as the other
    views name it (``agent_labels``) and what it is about (``object``: its queue,
    exchange or remote host). ``events``: silver ``events``; ``life``: gold
    ``lifecycle_state``. Columns: event_time, broker, event_name, severity_name,
    object, arguments, agent, broker_name."""
    import polars as pl

    from pipeline.views.live import SEVERITIES, event_broker

    if least not in SEVERITIES:
        raise ValueError(f"severity {least!r}: one of {', '.join(SEVERITIES)}")
    labels = agent_labels(life)
    rows = events.filter(
        pl.col("severity").is_not_null() & (pl.col("severity") <= SEVERITIES.index(least))
    )
    # The broker's name per (landing broker, agent) pair, of which there are few: the
    # live view's rule (``event_broker``) once a pair, joined back to the rows.
    pairs = rows.select("broker_name", "agent").unique()
    pairs = pairs.with_columns(pl.Series("broker", [
        event_broker(name, agent, labels) for name, agent in pairs.iter_rows()
    ], dtype=pl.String))  # fmt: skip
    rows = rows.join(pairs, on=["broker_name", "agent"], how="left", nulls_equal=True,
                     maintain_order="left")  # fmt: skip
    about = pl.coalesce(
        *(pl.col("arguments").str.json_path_match(f"$.{k}") for k in EVENT_OBJECT_ARGUMENTS)
    )
    return rows.select(
        "event_time",
        "broker",
        "event_name",
        pl.col("severity").replace_strict(dict(enumerate(SEVERITIES)), return_dtype=pl.String)
        .alias("severity_name"),
        about.alias("object"),
        "arguments", "agent", "broker_name",
    ).sort("event_time", "broker", "event_name", descending=[True, False, False])  # fmt: skip


def heartbeat_agent() -> pl.Expr:
    """Polars expression: a silver heartbeat's agent as gold's liveness names it (a QMF v1
    heartbeat carries none: it stands for the broker's agent ``1.0``)."""
    import polars as pl

    from pipeline.gold.transforms import LivenessRules

    v1 = pl.when(pl.col("dialect") != "V2").then(pl.lit(LivenessRules().v1_agent))
    return pl.coalesce(pl.col("agent"), v1).alias("agent")


def _by_agent_latest(life: pl.DataFrame) -> pl.DataFrame:
    return life.sort("batch_id", "last_seen_ns").group_by("agent", maintain_order=True).last()


def _disambiguate(
    labels: dict[str, str], detail: Callable[[str], str], form: str
) -> dict[str, str]:
    """Add ``detail`` (in ``form``) to the labels several agents share, when it tells
    them apart (the dialect says nothing when all of them speak the same)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for agent, text in labels.items():
        groups[text].append(agent)
    out = dict(labels)
    for text, agents in groups.items():
        if len(agents) > 1 and len({detail(a) for a in agents}) > 1:
            out.update({a: f"{text} {form.format(detail(a))}" for a in agents})
    return out


def label(name: str, agent: str, agents: dict[str, str]) -> str:
    """A plot's label for an object: ``q00021 (amqp-broker@vm:25672)``."""
    return f"{name} ({agents.get(agent, agent)})"


def figure_labels(fig: Figure) -> dict[str, list[str]]:
    """What a figure names: its axes' titles, legend entries and categorical tick labels
    (ticks set with ``set_yticklabels``/``set_xticklabels``, not numbers or dates). A check
    reads these from the kernel instead of looking at pixels."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter

    out: dict[str, list[str]] = {"titles": [], "legend": [], "ticks": []}
    for ax in fig.axes:
        if ax.get_title():
            out["titles"].append(ax.get_title())
        legend = ax.get_legend()
        if legend is not None:
            out["legend"].extend(t.get_text() for t in legend.get_texts())
        for axis in (ax.xaxis, ax.yaxis):
            # set_ticklabels on fixed ticks installs a FixedFormatter (a FuncFormatter
            # over the labels in recent matplotlib); numbers and dates have neither.
            named = isinstance(axis.get_major_locator(), FixedLocator) and isinstance(
                axis.get_major_formatter(), FixedFormatter | FuncFormatter
            )
            if named:
                out["ticks"].extend(t.get_text() for t in axis.get_ticklabels() if t.get_text())
    return out


def spark_session(app_name: str = "qmf-notebook") -> SparkSession:
    """The running SparkSession if there is one (a test's, a pyspark shell's), else a new
    one with the project's settings (``pipeline.spark.get_spark``)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from pipeline.spark import get_spark

    return get_spark(app_name, quick_jit=False)  # its queries scan in the JVM


def read_spark(spark: SparkSession, layer: str, name: str | None = None) -> DataFrame:
    """The table as a Spark DataFrame (``pipeline.lake.delta.read_table``)."""
    from pipeline.lake import delta

    return delta.read_table(spark, table_path(layer, name))


def headless() -> bool:
    """No display and no notebook kernel: figures can only be saved."""
    in_kernel = "ipykernel" in sys.modules
    return not in_kernel and not os.environ.get("DISPLAY") and not os.environ.get("MPLBACKEND")


def use_headless_backend() -> None:
    """Switch matplotlib to Agg when nothing could show a window (CI, a test)."""
    if headless():
        import matplotlib

        matplotlib.use("Agg")


def out_dir() -> Path | None:
    """Where figures are saved (``QMF_NOTEBOOK_OUT``); None: not saved."""
    out = os.environ.get(OUT_ENV)
    return Path(out) if out else None


def save_figure(fig: Figure, name: str) -> Path | None:
    """Save ``fig`` as ``<QMF_NOTEBOOK_OUT>/<name>.png`` when that is set."""
    out = out_dir()
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
