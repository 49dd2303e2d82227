"""How long each table keeps its rows: the one place that says it.

Each table that grows with time has an event-time column; a maintenance pass
(``pipeline.lake.maintain``) deletes the rows whose time is older than the
table's keep (Delta's ``DELETE``), then Delta's ``VACUUM`` deletes the files
once they are older than the vacuum retention. Bronze and silver samples go
first (they can be re-derived only while bronze still holds them), gold's rates
and liveness stay longer, and the tables that hold state or evidence are never
cut: the schema registry, agents, rate and lifecycle state, object lifecycles
(rewritten whole from their state), method calls (a request may wait for its
answer), parked messages and the quarantine (its raw bytes wait for an operator).

A row whose time is null is kept. Users change any keep with a TOML file::

    [retention]
    bronze = "3d"
    statistic_rates = "forever"

(``qmf maintain --retention FILE``, ``qmf run --retention FILE``); a table or a
duration this module does not know is an error naming it, when the file is read.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType

FOREVER = "forever"
# The commit info's userMetadata of a retention DELETE (``maintain.retain_table``): what
# readers of the log that follow a table (``pipeline.views.tails``) skip.
MARK = "qmf.operation=retention"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([hdw])$")
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}

# table name (its folder in a ``qmf run --data`` lake) -> (event-time column, default keep)
DEFAULTS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "bronze": ("received_at", "7d"),
    "object_samples": ("update_time", "30d"),
    "heartbeats": ("heartbeat_time", "30d"),
    "method_responses": ("received_at", "30d"),
    "events": ("event_time", "365d"),
    "statistic_rates": ("end_time", "400d"),
    "agent_liveness": ("last_heartbeat", "400d"),
})  # fmt: skip


class RetentionError(ValueError):
    """A retention setting that cannot be used (the message names the table and value)."""


def parse_keep(text: str, table: str = "?") -> timedelta | None:
    """``"7d"``, ``"36h"``, ``"2w"`` (a number and h, d or w), or ``"forever"`` (None)."""
    if text == FOREVER:
        return None
    m = _DURATION.match(text) if isinstance(text, str) else None
    if m is None:
        raise RetentionError(
            f"retention of {table}: {text!r} is not a duration such as \"7d\", \"36h\", "
            f"\"2w\" or {FOREVER!r}"
        )
    keep = float(m.group(1)) * _UNITS[m.group(2)]
    if keep <= timedelta(0):
        raise RetentionError(f"retention of {table}: {text!r} keeps nothing; use a positive duration")
    return keep


@dataclass(frozen=True)
class Rule:
    """One table's rule: rows whose ``column`` is older than ``keep`` go."""

    table: str
    column: str
    keep: timedelta | None  # None: forever

    def cutoff(self, now: datetime) -> datetime | None:
        """Rows strictly before this time are deleted (None: none are)."""
        return None if self.keep is None else now - self.keep

    def text(self) -> str:
        if self.keep is None:
            return FOREVER
        hours = self.keep.total_seconds() / 3600
        return f"{hours / 24:g}d" if hours % 24 == 0 else f"{hours:g}h"


@dataclass(frozen=True)
class RetentionPolicy:
    """The rule of every table that has one; ``enabled=False`` deletes no row."""

    rules: Mapping[str, Rule] = field(default_factory=lambda: _rules({}))
    enabled: bool = True

    @classmethod
    def load(cls, path: str | Path | None) -> RetentionPolicy:
        """The defaults, with the ``[retention]`` table of the TOML file at ``path`` over them."""
        if path is None:
            return cls()
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise RetentionError(f"retention file {path}: {exc}") from exc
        section = data.get("retention", {})
        if not isinstance(section, dict):
            raise RetentionError(f"retention file {path}: [retention] must be a table")
        return cls.of(section)

    @classmethod
    def of(cls, keeps: Mapping[str, object]) -> RetentionPolicy:
        """The defaults with these keeps (table name -> "7d" | "forever") over them."""
        return cls(_rules(keeps))

    def rule(self, table_path: str) -> Rule | None:
        """The rule of a table, by its folder's name (None: the table keeps every row)."""
        if not self.enabled:
            return None
        rule = self.rules.get(Path(table_path.rstrip("/")).name)
        return None if rule is None or rule.keep is None else rule

    def lines(self) -> Iterable[str]:
        """One line per table, as the README states the defaults."""
        for name, rule in self.rules.items():
            yield f"{name}: {rule.text()} by {rule.column}"


def _rules(overrides: Mapping[str, object]) -> Mapping[str, Rule]:
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise RetentionError(
            f"retention of {', '.join(unknown)}: no such table with an event time "
            f"(tables: {', '.join(DEFAULTS)})"
        )
    out: dict[str, Rule] = {}
    for name, (column, default) in DEFAULTS.items():
        text = overrides.get(name, default)
        if not isinstance(text, str):
            raise RetentionError(f"retention of {name}: {text!r} is not a string such as \"7d\"")
        out[name] = Rule(name, column, parse_keep(text, name))
    return MappingProxyType(out)


def may_hold_rows_before(stats: Iterable[str | None], column: str, cutoff: datetime) -> bool:
    """Whether any file may hold a row older than ``cutoff``, from the files' Delta
    statistics (the JSON of their add actions). Statistics are optional: a file
    without a minimum for ``column`` may hold one, unless its every value is null
    (``nullCount`` = ``numRecords``). Only saves a DELETE that would find nothing; the
    DELETE itself decides which rows go."""
    for raw in stats:
        try:
            parsed = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return True
        low = (parsed.get("minValues") or {}).get(column)
        if low is None:
            nulls = (parsed.get("nullCount") or {}).get(column)
            if nulls is not None and nulls == parsed.get("numRecords"):
                continue
            return True
        try:
            when = datetime.fromisoformat(str(low).replace("Z", "+00:00"))
        except ValueError:
            return True
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        if when < cutoff:
            return True
    return False


def is_retention_commit(actions: Iterable[Mapping[str, object]]) -> bool:
    """Whether a commit's actions (its log JSON lines) are a retention DELETE."""
    for action in actions:
        info = action.get("commitInfo")
        if isinstance(info, dict):
            return MARK in str(info.get("userMetadata") or "").split(";")
    return False
