"""What this machine's cores give any work: the same kernel in 1 process and in 2 at once.

``bench_scale`` judges Spark's scaling against two ratios (issue 22): ``efficiency``
(records/s at 2 cores over twice 1 core) and ``vs_ceiling`` (per core against one
process without Spark). Both assume that two processes on two cores do twice the work
of one. On a VM whose two vCPUs share a host core's execution units, its last-level
cache or its memory bandwidth they do not, for the no-Spark ceiling as for the job, and
how far they fall short depends on the work and on the hour. This shows it for three
kinds of work, with kernels that need no project code:

* ``python``: a pure-Python integer loop (the interpreter's own work; no memory traffic);
* ``sort``: ``numpy.sort`` of 4M random int64 (32 MB: caches and memory, as a hash join);
* ``stream``: sums and scaled copies over a 256 MB float64 array (memory bandwidth, as
  gathering and writing large columns).

For each: one process runs the unit twice in turn (time T1), then two processes, each
pinned to its own CPU, run it once at the same time (T2: the later end). The kernel's
efficiency is T1 / (2 x T2): 1.0 when two processes do twice the work in the same time.
Rounds alternate and the median counts. It ends with ``RESULT {json}``.

    flock /tmp/qmf-heavy.lock .venv/bin/python benchmarks/bench_machine.py [--rounds 5]

About 25 s on 2 idle cores (5 rounds). ``bench_scale`` runs it before and after its Spark runs
(``machine_scaling``) and prints the figures beside its own ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _python(n: int = 6_000_000) -> int:
    total = 0
    for i in range(n):
        total += (i * i) & 0xFF
    return total


def _sort(n: int = 4_000_000) -> int:
    a = np.random.default_rng(7).integers(0, 1 << 62, n, dtype=np.int64)
    return int(np.sort(a)[n // 2])


def _stream(n: int = 32_000_000, reps: int = 12) -> float:
    a = np.ones(n, np.float64)
    b = np.empty_like(a)
    s = 0.0
    for _ in range(reps):
        np.multiply(a, 1.0001, out=b)
        s += float(b.sum())
    return s


KERNELS: dict[str, Callable[[], Any]] = {"python": _python, "sort": _sort, "stream": _stream}


def _run(kernel: str, cpu: int, units: int, start: Any, out: Any) -> None:
    """One process: pinned to ``cpu``, waits for the common start, runs ``units`` units."""
    os.sched_setaffinity(0, {cpu})
    KERNELS[kernel]()  # warm: imports, page faults of the first allocation
    start.wait()
    t0 = time.perf_counter()
    for _ in range(units):
        KERNELS[kernel]()
    out.put(time.perf_counter() - t0)


def _timed(kernel: str, cpus: list[int], units: int) -> float:
    """Seconds until the last of ``len(cpus)`` processes ran ``units`` units each."""
    ctx = mp.get_context("fork")
    start = ctx.Barrier(len(cpus))
    out = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(kernel, c, units, start, out)) for c in cpus]
    for p in procs:
        p.start()
    times = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return max(times)


def machine_scaling(rounds: int = 3) -> dict[str, Any]:
    """Each kernel's efficiency in two processes (median over ``rounds``), and its 1-
    and 2-process times; no kernels on a machine with fewer than two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"cpus": len(cpus), "kernels": {}}
    kernels: dict[str, Any] = {}
    for name in KERNELS:
        effs, t1s, t2s = [], [], []
        for _ in range(rounds):
            t1 = _timed(name, cpus[:1], 2)
            t2 = _timed(name, cpus[:2], 1)
            effs.append(t1 / (2 * t2))
            t1s.append(t1)
            t2s.append(t2)
        kernels[name] = {
            "efficiency": round(statistics.median(effs), 3),
            "range": [round(min(effs), 3), round(max(effs), 3)],
            "one_process_s": round(statistics.median(t1s), 3),
            "two_processes_s": round(statistics.median(t2s), 3),
        }
    return {"cpus": len(cpus), "kernels": kernels}


def describe(m: dict[str, Any]) -> str:
    """One line: each kernel's efficiency in two processes."""
    ks = m.get("kernels") or {}
    if not ks:
        return "fewer than 2 CPUs"
    return "; ".join(
        f"{k} {v['efficiency']:.2f} ({v['range'][0]:.2f}-{v['range'][1]:.2f})" for k, v in ks.items()
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"bench_machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    m = machine_scaling(args.rounds)
    for k, v in m["kernels"].items():
        print(
            f"  {k:7s} 1 process (2 units in turn) {v['one_process_s']:.3f} s, 2 processes "
            f"(1 unit each) {v['two_processes_s']:.3f} s: efficiency {v['efficiency']:.3f} "
            f"(rounds {v['range'][0]:.3f}-{v['range'][1]:.3f})"
        )
    print("RESULT " + json.dumps(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
