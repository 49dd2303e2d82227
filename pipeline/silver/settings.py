"""What a silver run needs (``SilverSettings``) and its tables (``ensure_tables``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.lake import delta, storage
from pipeline.runtime.streaming import trigger_kwargs
from pipeline.silver.registry import DEFAULT_KINDS_FILE, RegistryTable, StatisticKinds
from schemas.silver import SILVER_TABLES

if TYPE_CHECKING:
    from pipeline.lake.maintain import JobMaintenance

# Where a micro-batch's row work runs (docs/DESIGN.md, Silver: where it runs).
DECODE_MODES = ("auto", "tasks", "driver")
# ``auto``: a micro-batch whose bronze files hold at most this many bytes is decoded
# on the driver (no Spark job: less fixed cost for the small, frequent batches of a
# live run); a larger one, or one whose files are not known, goes to Spark tasks.
# 4 MiB is Spark's own file open cost, and about one publish interval of a
# 1,000-queue broker's AM2 traffic.
DRIVER_MAX_BYTES = 4 << 20
# Task path: v1 method calls are paired on the driver when a batch's call halves and
# the stored requests still waiting number at most this many rows, in one Spark task
# per bucket of (dialect, seq) above. ``benchmarks/bench_calls.py`` (local[2]): two tasks
# take 0.93 of the driver's time at 5,000 halves, 3.28 at 1,000, 0.54 at 80,000.
CALLS_DRIVER_MAX_ROWS = 5_000


@dataclass(frozen=True)
class SilverSettings:
    """What a silver run needs. Tables live under ``root/<name>`` (``path``)."""

    bronze: str
    root: str
    checkpoint: str = ""
    registry: str | None = None
    kinds_file: str | None = DEFAULT_KINDS_FILE
    trigger: str = "availableNow"
    max_files_per_trigger: int | None = None
    # Delta's ``startingVersion`` of a new checkpoint's stream: the first bronze version
    # it reads (None: bronze as of the start, then every later commit).
    starting_version: int | None = None
    parked_max_age_s: float = 3600.0
    registry_touch_s: float = 60.0
    agents_touch_s: float = 60.0
    # Where a micro-batch is decoded and written: "tasks" (Spark tasks decode and
    # write the Parquet files, the driver commits them), "driver" (the batch's bronze
    # files are read and decoded on the driver, no Spark job), or "auto" (the driver
    # up to ``driver_max_bytes`` of bronze files, tasks above). "spark" is the old
    # name of "tasks".
    decode_on: str = "auto"
    driver_max_bytes: int = DRIVER_MAX_BYTES
    # Task path: units of a batch per core (Spark's default parallelism). Above 1, a
    # core that finishes its unit early takes another instead of waiting for the
    # slowest; each unit writes its own file per table.
    tasks_per_core: int = 1
    calls_driver_max_rows: int = CALLS_DRIVER_MAX_ROWS
    query_name: str = "qmf_silver"
    # Folder shared with the receiver's console (receivers.schema_wants): the
    # schema keys of parked messages are listed there so the console asks for them.
    schema_wants: str | None = None
    # ``--maintain-every``: the job maintains its tables between its micro-batches.
    maintenance: JobMaintenance | None = None

    def __post_init__(self) -> None:
        trigger_kwargs(self.trigger)
        if self.decode_on == "spark":
            object.__setattr__(self, "decode_on", "tasks")
        if self.decode_on not in DECODE_MODES:
            raise ValueError(
                f"decode_on {self.decode_on!r}: expected one of {', '.join(DECODE_MODES)}"
            )
        if self.tasks_per_core < 1:
            raise ValueError(f"tasks_per_core {self.tasks_per_core}: must be >= 1")
        if self.calls_driver_max_rows < 0:
            raise ValueError(f"calls_driver_max_rows {self.calls_driver_max_rows}: must be >= 0")
        if self.driver_max_bytes < 0:
            raise ValueError(f"driver_max_bytes {self.driver_max_bytes}: must be >= 0")

    def path(self, name: str) -> str:
        if name == "schema_registry" and self.registry is not None:
            return self.registry
        return storage.join(self.root, name)

    def source_options(self) -> dict[str, str]:
        """Options of Delta's streaming read of bronze: its admission control, and
        ``skipChangeCommits``: commits that delete or rewrite rows (retention, a
        backfill's replace) are not read again."""
        out: dict[str, str] = {"skipChangeCommits": "true"}
        if self.max_files_per_trigger is not None:
            out["maxFilesPerTrigger"] = str(self.max_files_per_trigger)
        if self.starting_version is not None:
            out["startingVersion"] = str(self.starting_version)
        return out


def ensure_tables(settings: SilverSettings) -> RegistryTable:
    """Create every silver table (idempotent) and seed the registry; returns the registry."""
    for name, schema in SILVER_TABLES.items():
        if name != "schema_registry":
            delta.create_table(settings.path(name), schema, name=name)
    reg = RegistryTable(settings.path("schema_registry"), StatisticKinds.load(settings.kinds_file))
    reg.ensure()
    return reg
