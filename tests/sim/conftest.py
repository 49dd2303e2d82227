"""Helpers for simulator tests: run ``qmf sim`` as a child process, bounded, always stopped."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
START_NS = 1_795_338_000_000_000_000  # a fixed simulated clock: same seed, same bytes


@contextmanager
def sim_process(
    args: list[str], ready_timeout_s: float = 60.0
) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """Start ``qmf sim`` and wait for its ready line; stop it (TERM, then KILL) on exit."""
    cmd = [sys.executable, "-m", "pipeline.cli", "sim", *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + ready_timeout_s
        line = ""
        while time.monotonic() < deadline and not line:
            if sel.select(timeout=0.5):
                line = proc.stdout.readline()
                if not line:
                    break
        sel.close()
        if not line:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise RuntimeError(f"qmf sim did not get ready: {err[-2000:]}")
        yield proc, json.loads(line)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def finish(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> dict[str, Any]:
    """Wait for a run to end by itself; its summary (last stdout line)."""
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-2000:]
    return dict(json.loads(out.strip().splitlines()[-1]))
