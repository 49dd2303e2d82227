"""``qmf capture -o FILE``: a second capture no longer doubles FILE without a word."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main


def test_an_existing_capture_file_is_refused_without_append(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before connecting (no broker needed): exit 2, the file untouched."""
    out = tmp_path / "cap.jsonl"
    out.write_bytes(b'{"body_base64": ""}\n')
    rc = main(["capture", "--url", "amqp://127.0.0.1:1", "--max-connect-attempts", "1",
               "-o", str(out), "--count", "1"])  # fmt: skip
    assert rc == 2
    assert capsys.readouterr().err == (
        f"qmf capture: {out} already exists (20 bytes) and is left as it is: --append to add "
        "to it, or choose another file\n"
    )
    assert out.read_bytes() == b'{"body_base64": ""}\n'


def test_an_empty_file_or_a_device_loses_nothing() -> None:
    """What is refused: a regular file with something in it; not /dev/null, not nothing."""
    from pipeline.outputs import holds_data, refusal

    assert holds_data("/dev/null") == 0 and refusal("/dev/null", "--append", False, "x") is None
    assert refusal("/nonexistent/dir/file", "--append", False, "x") is None
    assert refusal(__file__, "--append", True, "x") is None
    assert refusal(__file__, "--append", False, "add to it") is not None


@pytest.mark.broker
def test_append_adds_to_an_existing_capture(broker: Any, tmp_path: Path) -> None:
    """With --append the earlier lines stay as they were and the new messages follow."""
    from receivers.publisher import OutMessage, Publisher

    tag = f"t{uuid.uuid4().hex[:10]}"
    out = tmp_path / "cap.jsonl"
    earlier = '{"body_base64": "AA==", "routing_key": "earlier"}\n'
    out.write_text(earlier)
    cmd = [sys.executable, "-m", "pipeline.cli", "capture", "--url", broker.url,
           "--bind", f"qpid.management:mgmt.{tag}.#", "-o", str(out), "--append",
           "--count", "3", "--duration", "60"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # wait until subscribed: what is published after lands
        lines.append(line)
        if line.startswith("ready:"):
            break
    with Publisher(broker.url) as pub:
        pub.publish_many([OutMessage(routing_key=f"mgmt.{tag}.x{i}", body=bytes([i]))
                          for i in range(3)])  # fmt: skip
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, "".join(lines) + rest
    assert lines[0].endswith(f"into {out} (appending)\n")
    assert rest.splitlines()[-1] == "captured 3 messages"
    text = out.read_text()
    assert text.startswith(earlier)
    new = [json.loads(line) for line in text.splitlines()[1:]]
    assert [m["routing_key"] for m in new] == [f"mgmt.{tag}.x{i}" for i in range(3)]
