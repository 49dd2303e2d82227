"""Every command that writes a file the user names refuses to lose or double what is
there (capture: tests/test_capture_command.py; sim: tests/sim/test_capture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main


def test_decode_output_is_not_replaced_without_overwrite(
    shared_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = f"{shared_dir}/samples/qpidd-capture-20s.jsonl"
    out = tmp_path / "records.jsonl"
    out.write_text("earlier records\n")
    assert main(["decode", "--input", capture, "--output", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"qmf decode: {out} already exists (16 bytes) and is left as it is: --overwrite to "
        "replace it, or choose another file\n"
    )
    assert out.read_text() == "earlier records\n"
    # Not even the input itself: `--output CAPTURE` would have truncated the capture.
    copy = tmp_path / "capture.jsonl"
    copy.write_bytes(Path(capture).read_bytes())
    assert main(["decode", "--input", str(copy), "--output", str(copy)]) == 2
    capsys.readouterr()
    assert copy.read_bytes() == Path(capture).read_bytes()
    assert main(["decode", "--input", capture, "--output", str(out), "--overwrite"]) == 0
    assert "wrote " in capsys.readouterr().err
    assert json.loads(out.read_text().splitlines()[0])["message"] == 0


def test_soak_refuses_an_earlier_report_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before qmf run starts (nothing is launched): exit 2, the report kept."""
    prefix = tmp_path / "soak"
    (tmp_path / "soak-summary.json").write_text("{}\n")
    assert main(["soak", "--data", str(tmp_path / "d"), "--out", str(prefix)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qmf soak: {prefix}-summary.json already exists (3 bytes)")
    assert err.endswith("--overwrite to replace it, or choose another file (or --out PREFIX)\n")
    assert (tmp_path / "soak-summary.json").read_text() == "{}\n"
    assert not (tmp_path / "d").exists()


def test_broker_tls_refuses_a_folder_with_part_of_a_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """generate_tls keeps a complete set and regenerates an incomplete one over the files
    there: a user's own CA in --tls-dir would be replaced. Refused, files kept."""
    from pipeline.commands.broker import partial_tls

    (tmp_path / "ca.pem").write_text("my own CA\n")
    (tmp_path / "notes.txt").write_text("not ours\n")
    assert main(["broker", "tls", "--tls-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qmf broker tls: {tmp_path} holds ca.pem but not the whole set")
    assert (tmp_path / "ca.pem").read_text() == "my own CA\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.pem", "notes.txt"]
    for name in ("server.pem", "server.key", "client.pem", "client.key"):
        (tmp_path / name).write_text("x\n")
    assert partial_tls(tmp_path) == []  # a complete set is used as it is
    assert partial_tls(tmp_path / "empty") == []
