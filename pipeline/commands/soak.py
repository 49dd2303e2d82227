"""``qmf soak``: run ``qmf run`` for a long time and watch that it stays bounded.

It starts ``qmf run`` (broker, simulated agents, the bronze query with its
embedded receiver and landing-log retention) with ``--queues`` simulated
queues for ``--duration`` seconds and samples, every ``--sample`` seconds:
the lag (landed but not in bronze, from ``qmf run``'s progress lines), the
duration of each bronze micro-batch (from the checkpoint: offset-log entry
written -> commit-log entry written), the landing log's size on disk and the
resident memory of ``qmf run`` and its children (the Spark JVM, Python
workers). At the end it prints a summary (first/last/max, and the memory
growth over the second half) and writes the samples as JSON lines and a small
SVG plot (no plotting library needed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# qmf run's progress line (pipeline.views.progress.progress_line): "(N landed) | bronze N (lag N)".
PROGRESS = re.compile(r"\(([\d,]+) landed\) \| bronze ([\d,]+) \(lag ([\d,]+)\)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "soak", help="run `qmf run` for a long time and sample lag, disk and memory",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("--data", default="data-soak", help="qmf run's data folder (./data-soak)")
    p.add_argument("--duration", type=float, default=1800.0, help="seconds (default 30 min)")
    p.add_argument("--queues", type=int, default=10_000, help="simulated queues in all")
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--out", default=None, help="report prefix (default: <data>/soak)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier report under the same prefix (else refused)")
    p.add_argument("run_args", nargs=argparse.REMAINDER,
                   help="after --: more options for qmf run (e.g. -- --retention-slack 0)")
    p.set_defaults(func=soak)  # fmt: skip


@dataclass
class Sample:
    """One observation of the running pipeline."""

    t: float  # seconds since start
    landed: int
    in_bronze: int
    lag: int
    landing_bytes: int
    rss_bytes: int
    batches: int  # micro-batches committed so far


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/statm", encoding="utf-8") as fh:
                total += int(fh.read().split()[1]) * page
        except OSError:
            pass
    return total


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(dirpath, n))
            except OSError:
                pass
    return total


class BatchClock:
    """Micro-batch durations from the checkpoint, remembered before Spark purges them."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.durations: dict[int, tuple[float, float]] = {}  # batch -> (end time, seconds)

    def poll(self) -> None:
        commits = self.checkpoint / "commits"
        if not commits.is_dir():
            return
        for name in os.listdir(commits):
            if not name.isdigit() or int(name) in self.durations:
                continue
            try:
                done = os.path.getmtime(commits / name)
                begun = os.path.getmtime(self.checkpoint / "offsets" / name)
            except OSError:
                continue
            self.durations[int(name)] = (done, done - begun)


def svg_plot(samples: list[Sample], batches: list[tuple[float, float]], path: Path) -> None:
    """Four small line charts (lag, batch seconds, landing MB, RSS MB) as one SVG."""
    series = [
        ("lag (messages)", [(s.t, float(s.lag)) for s in samples]),
        ("batch duration (s)", batches),
        ("landing log (MB)", [(s.t, s.landing_bytes / 1e6) for s in samples]),
        ("RSS of qmf run (MB)", [(s.t, s.rss_bytes / 1e6) for s in samples]),
    ]
    w, h, pad = 420, 180, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{2 * h}" '
             'font-family="sans-serif" font-size="11">']  # fmt: skip
    for i, (title, pts) in enumerate(series):
        ox, oy = (i % 2) * w, (i // 2) * h
        parts.append(f'<text x="{ox + pad}" y="{oy + 14}">{title}</text>')
        parts.append(
            f'<rect x="{ox + pad}" y="{oy + 20}" width="{w - pad - 10}" height="{h - 50}" '
            'fill="none" stroke="#999"/>'
        )
        if not pts:
            continue
        xmax = max(max(x for x, _ in pts), 1e-9)
        ymax = max(max(y for _, y in pts), 1e-9)
        coords = " ".join(
            f"{ox + pad + x / xmax * (w - pad - 10):.1f},{oy + 20 + (h - 50) * (1 - y / ymax):.1f}"
            for x, y in pts
        )
        parts.append(f'<polyline points="{coords}" fill="none" stroke="#1f77b4"/>')
        parts.append(f'<text x="{ox + 2}" y="{oy + 26}">{ymax:.4g}</text>')
        parts.append(f'<text x="{ox + 2}" y="{oy + h - 30}">0</text>')
        parts.append(f'<text x="{ox + w - 60}" y="{oy + h - 16}">{xmax:.0f} s</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts), encoding="utf-8")


def summarize(samples: list[Sample], batches: list[tuple[float, float]]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        ordered = sorted(values)
        return {
            "first": round(values[0], 2),
            "last": round(values[-1], 2),
            "median": round(ordered[len(ordered) // 2], 2),
            "p95": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
            "max": round(ordered[-1], 2),
        }

    half = [s for s in samples if s.t >= samples[-1].t / 2] if samples else []
    growth = 0.0
    if len(half) >= 2 and half[-1].t > half[0].t:
        growth = (half[-1].rss_bytes - half[0].rss_bytes) / 1e6 / ((half[-1].t - half[0].t) / 60)
    duration = samples[-1].t if samples else 0.0
    return {
        "seconds": round(duration, 1),
        "landed": samples[-1].landed if samples else 0,
        "in_bronze": samples[-1].in_bronze if samples else 0,
        "landed_per_s": round(samples[-1].landed / duration, 1) if duration else 0.0,
        "micro_batches": len(batches),
        "lag_messages": stats([float(s.lag) for s in samples]),
        "batch_seconds": stats([d for _, d in batches]),
        "landing_mb": stats([s.landing_bytes / 1e6 for s in samples]),
        "rss_mb": stats([s.rss_bytes / 1e6 for s in samples]),
        "rss_growth_mb_per_min_second_half": round(growth, 2),
        "load_average_1min_end": round(os.getloadavg()[0], 1),
    }


def soak(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    out = Path(args.out) if args.out else data / "soak"
    from pipeline.outputs import refusal

    for path in (f"{out}-samples.jsonl", f"{out}-summary.json", f"{out}.svg"):
        refused = refusal(path, "--overwrite", args.overwrite, "replace it")
        if refused:
            print(f"qmf soak: {refused} (or --out PREFIX)", file=sys.stderr)
            return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    extra = [a for a in args.run_args if a != "--"]
    per_agent = max(1, args.queues // args.agents)
    cmd = [
        sys.executable, "-m", "pipeline.cli", "run", "--data", str(data),
        "--duration", str(args.duration), "--agents", str(args.agents),
        "--queues", str(per_agent), "--progress", str(min(args.sample, 5.0)), *extra,
    ]  # fmt: skip
    print(f"qmf soak: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout is not None
    last = {"landed": 0, "in_bronze": 0, "lag": 0}
    tail: list[str] = []

    def read_lines() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            del tail[:-50]
            m = PROGRESS.search(line)
            if m:
                landed, in_bronze, lag = (int(g.replace(",", "")) for g in m.groups())
                last.update(landed=landed, in_bronze=in_bronze, lag=lag)

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    clock = BatchClock(data / "checkpoints" / "bronze")
    samples: list[Sample] = []
    t0 = time.monotonic()
    wall0 = time.time()
    stopped = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopped
        stopped = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open(f"{out}-samples.jsonl", "w", encoding="utf-8") as fh:
            while proc.poll() is None and not stopped:
                now = time.monotonic() - t0
                if now > args.duration:
                    break
                clock.poll()
                s = Sample(
                    t=round(now, 1), landing_bytes=dir_bytes(data / "landing"),
                    rss_bytes=tree_rss(proc.pid), batches=len(clock.durations), **last,
                )  # fmt: skip
                samples.append(s)
                fh.write(json.dumps(asdict(s)) + "\n")
                fh.flush()
                print(f"qmf soak: {s.t:7.1f}s lag {s.lag:>8} landing {s.landing_bytes / 1e6:8.1f} MB "
                      f"rss {s.rss_bytes / 1e6:7.0f} MB batches {s.batches}", flush=True)  # fmt: skip
                time.sleep(args.sample)
        clock.poll()
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        if proc.poll() is None:
            # qmf run drains and prints its own summary; bound the wait.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(timeout=60)
    batches = sorted(
        (round(end - wall0, 1), dur) for end, dur in clock.durations.values() if end >= wall0
    )
    summary = summarize(samples, batches)
    summary["qmf_run_exit"] = proc.returncode
    svg_plot(samples, batches, Path(f"{out}.svg"))
    Path(f"{out}-summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print("".join(tail[-15:]), end="")
    print(json.dumps(summary, indent=1))
    print(f"qmf soak: samples {out}-samples.jsonl, plot {out}.svg")
    return 0 if proc.returncode == 0 else 1
