"""docs/configuration.md is generated from the parsers and the sources: it must be current."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline import docs

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == docs.render(), (
        "docs/configuration.md is stale: python -m pipeline.docs > docs/configuration.md"
    )


def test_every_command_job_and_option_is_listed() -> None:
    """Discovered from the parsers themselves: a new subcommand or job shows up by itself."""
    from pipeline.cli import COMMAND_MODULES

    text = docs.render()
    commands = {name for name, _, _ in docs.qmf_parsers()}
    assert {f"qmf {name}" for name in COMMAND_MODULES} <= commands
    jobs = {name for name, _, _ in docs.job_parsers()}
    assert {"jobs/bronze.py", "jobs/silver.py", "jobs/gold.py"} <= jobs
    for name, _, parser in [*docs.qmf_parsers(), *docs.job_parsers()]:
        assert f"### `{name}`" in text
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:  # hidden on purpose (internal plumbing)
                continue
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in text, (name, flag)


def test_source_receiver_and_environment_are_listed() -> None:
    from pipeline.docs import DELTA_SOURCE_OPTIONS
    from pipeline.source import QmfOptions

    text = docs.render()
    for option in (*QmfOptions.KNOWN, *DELTA_SOURCE_OPTIONS):
        assert f"| `{option}` |" in text
    receiver = docs.receiver_option_names()
    assert {"url", "preset", "queue", "cafile", "sasl", "partition", "readytimeout"} <= set(
        receiver
    )
    for option in receiver:
        assert f"| `{option}` |" in text
    env = docs.environment()
    assert env["QMF_BROKER_URL"][-1] == "receivers/config.py"
    assert "tools/setup.sh" in env["QMF_SETUP_SKIP_APT"]
    assert "QMF_BROKER_SERVER_NODE" not in env  # a marker the code sets, not configuration
    for name in env:
        assert f"| `{name}` |" in text
