"""The retention policy (pipeline/lake/retention.py): keeps, overrides, errors, statistics.

What a maintenance pass deletes with it, with exact row counts on the
simulated lake and under running streams, is tests/spark/test_maintain.py's.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.commands.maintain import run as maintain_command
from pipeline.lake.retention import (
    DEFAULTS,
    RetentionError,
    RetentionPolicy,
    may_hold_rows_before,
    parse_keep,
)
from pipeline.lake.retention import Rule as RetentionRule
from schemas import gold, silver
from schemas.tables import TABLES

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_durations_and_forever() -> None:
    assert parse_keep("7d") == timedelta(days=7)
    assert parse_keep("36h") == timedelta(hours=36)
    assert parse_keep("2w") == timedelta(days=14)
    assert parse_keep("1.5d") == timedelta(hours=36)
    assert parse_keep("forever") is None
    for bad in ("7", "d", "7 days", "-1d", "7m", "", "7D"):
        with pytest.raises(RetentionError, match=r"retention of bronze: .* is not a duration"):
            parse_keep(bad, "bronze")
    with pytest.raises(RetentionError, match="keeps nothing"):
        parse_keep("0d", "events")


def test_the_defaults_name_each_tables_event_time_column() -> None:
    policy = RetentionPolicy()
    assert list(policy.lines()) == [
        "bronze: 7d by received_at",
        "object_samples: 30d by update_time",
        "heartbeats: 30d by heartbeat_time",
        "method_responses: 30d by received_at",
        "events: 365d by event_time",
        "statistic_rates: 400d by end_time",
        "agent_liveness: 400d by last_heartbeat",
    ]
    schemas = {**TABLES, **silver.SILVER_TABLES, **gold.GOLD_TABLES}
    for name, (column, _keep) in DEFAULTS.items():
        assert str(schemas[name].field(column).type) == "timestamp[us, tz=UTC]", name
    # by the table folder's name, wherever the lake is
    rule = policy.rule("/lake/silver/object_samples/")
    assert rule == RetentionRule("object_samples", "update_time", timedelta(days=30))
    assert rule.cutoff(T0) == T0 - timedelta(days=30)
    for kept in ("/lake/silver/quarantine", "/lake/gold/object_lifecycles", "/x/rate_state"):
        assert policy.rule(kept) is None
    assert RetentionPolicy(policy.rules, enabled=False).rule("/lake/bronze") is None


def test_a_file_overrides_some_keeps(tmp_path: Path) -> None:
    f = tmp_path / "keeps.toml"
    f.write_text('[retention]\nbronze = "3d"\nstatistic_rates = "forever"\n')
    policy = RetentionPolicy.load(f)
    assert policy.rules["bronze"].keep == timedelta(days=3)
    assert policy.rule("/lake/gold/statistic_rates") is None  # forever: no rule applied
    assert policy.rules["events"].keep == timedelta(days=365)  # the default
    assert RetentionPolicy.load(None) == RetentionPolicy()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[retention]\nquarantine = "1d"\n', r"retention of quarantine: no such table with an event time"),
        ('[retention]\nbronze = 7\n', r"retention of bronze: 7 is not a string"),
        ('[retention]\nevents = "a week"\n', r"retention of events: 'a week' is not a duration"),
        ('retention = "7d"\n', r"\[retention\] must be a table"),
        ("[retention\n", r"retention file .*keeps.toml: "),
    ],
)
def test_a_bad_file_is_one_clear_error(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "keeps.toml"
    f.write_text(text)
    with pytest.raises(RetentionError, match=error):
        RetentionPolicy.load(f)


def test_the_command_refuses_a_bad_file_before_touching_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    f = tmp_path / "keeps.toml"
    f.write_text('[retention]\nbronze = "soon"\n')
    args = argparse.Namespace(table_retention=str(f), no_row_retention=False)
    assert maintain_command(args) == 2
    assert capsys.readouterr().out == (
        "qmf maintain: retention of bronze: 'soon' is not a duration such as \"7d\", "
        "\"36h\", \"2w\" or 'forever'\n"
    )


def _stats(low: str | None, nulls: int = 0, rows: int = 10) -> str:
    mins = {} if low is None else {"received_at": low}
    return json.dumps({"numRecords": rows, "minValues": mins, "nullCount": {"received_at": nulls}})


def test_statistics_spare_a_delete_only_when_every_file_is_newer() -> None:
    cut = T0
    newer, older = "2026-12-06T12:00:00.000Z", "2026-12-06T11:59:59.999Z"
    assert not may_hold_rows_before([_stats(newer)], "received_at", cut)
    assert may_hold_rows_before([_stats(newer), _stats(older)], "received_at", cut)
    assert may_hold_rows_before([None], "received_at", cut)  # no statistics: may hold
    assert may_hold_rows_before([_stats(None)], "received_at", cut)  # no minimum
    assert not may_hold_rows_before([_stats(None, nulls=10)], "received_at", cut)  # all null
    assert may_hold_rows_before(['{"numRecords": 3}'], "received_at", cut)
    assert may_hold_rows_before([_stats("not a time")], "received_at", cut)
    assert not may_hold_rows_before([], "received_at", cut)
