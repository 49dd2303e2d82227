"""The alert rules (``qmf alert-rules``): one set of thresholds makes them; Prometheus's own
``promtool`` (Debian's prometheus package, installed by tools/setup.sh) checks them and
runs their unit tests (``deploy/prometheus/qmf-alerts.test.yml``: every rule fires
exactly when, and with the labels and texts, it should; the healthy series beside it
never)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main as qmf
from pipeline.views.alerts import AlertThresholds, ThresholdError, render

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "prometheus"
RULES = DEPLOY / "qmf-alerts.rules.yml"
TESTS = DEPLOY / "qmf-alerts.test.yml"
ALERTS = ["QmfAgentDown", "QmfQueueStalled", "QmfQueueDepthHigh", "QmfQueueGrowing",
          "QmfBrokerEvent", "QmfPipelineLag", "QmfQuarantineGrowing",
          "QmfReceiverDisconnected"]  # fmt: skip


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: bash tools/setup.sh installs Debian's prometheus package"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          check=False)  # fmt: skip


def test_the_shipped_rules_are_what_the_default_thresholds_make() -> None:
    assert RULES.read_text(encoding="utf-8") == render()
    group = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"][0]
    assert [r["alert"] for r in group["rules"]] == ALERTS
    # Every alert names the broker (or the landing broker) it concerns.
    for r in group["rules"]:
        assert "$labels.broker" in r["annotations"]["summary"], r["alert"]


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    check = promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout
    run = promtool("test", "rules", TESTS.name, cwd=DEPLOY)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_the_unit_tests_fail_for_rules_of_other_thresholds(tmp_path: Path) -> None:
    """The cases are exact: rules made with another threshold fail them where it matters
    (an agent down after 5 missed cycles is not down at 40 s of a 10 s cycle)."""
    shutil.copy(TESTS, tmp_path / TESTS.name)
    (tmp_path / RULES.name).write_text(render(AlertThresholds(agent_missed_cycles=5)))
    run = promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert run.returncode == 1
    out = run.stdout + run.stderr
    assert "alertname: QmfAgentDown" in out and "QmfQueueStalled" not in out


def test_thresholds_from_a_file_make_rules_promtool_accepts(tmp_path: Path) -> None:
    cfg = tmp_path / "alerts.toml"
    cfg.write_text('agent_missed_cycles = 5\nqueue_depth = 500\nevent_severity = "error"\n'
                   'queue_stall_window = "2m"\nevaluation_interval = "15s"\n')  # fmt: skip
    out = tmp_path / "rules.yml"
    assert qmf(["alert-rules", "--config", str(cfg), "-o", str(out)]) == 0
    assert out.read_text() == render(AlertThresholds.load(cfg))
    group = yaml.safe_load(out.read_text())["groups"][0]
    assert group["interval"] == "15s"
    exprs = {r["alert"]: r["expr"] for r in group["rules"]}
    assert exprs["QmfAgentDown"].endswith("> 5 * qmf_agent_publish_interval_seconds")
    assert exprs["QmfQueueDepthHigh"].endswith("> 500")
    assert 'event_severity=~"emerg|alert|crit|error"' in exprs["QmfBrokerEvent"]
    assert "[2m]" in exprs["QmfQueueStalled"]
    check = promtool("check", "rules", str(out))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("agent_missed_cycles = 0", r"agent_missed_cycles = 0\.0: must be a number above 0"),
        ("queue_depth = -5", r"queue_depth = -5\.0: must be a number above 0"),
        ('queue_depth = "many"', r"queue_depth = 'many': must be a number above 0"),
        ('queue_stall_window = "5 minutes"', r"queue_stall_window = '5 minutes': must be a "
         r"Prometheus duration"),
        ('event_severity = "warning"', r"event_severity = 'warning': one of emerg, alert"),
        ("agent_down_after = 3", r"unknown keys \['agent_down_after'\]"),
        ("queue_depth = ", r"alerts\.toml: .*line 1"),
    ],
)
def test_a_bad_threshold_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    cfg = tmp_path / "alerts.toml"
    cfg.write_text(text + "\n")
    with pytest.raises(ThresholdError, match=message):
        AlertThresholds.load(cfg)
    out = tmp_path / "rules.yml"
    assert qmf(["alert-rules", "--config", str(cfg), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qmf alert-rules: {cfg}: ") and not out.exists()
