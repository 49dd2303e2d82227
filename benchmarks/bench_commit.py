"""What one delta-spark commit costs the jobs' drivers, with Delta's own log store for
local folders (``HDFSLogStore``, the baseline) and with ours (``LinkingLogStore``).

Each store runs in a process of its own (Delta picks a scheme's store when the JVM
starts): a table of 1,000 rows, then ``--commits`` replace commits one after another
(``delta.replace_arrow``: a Parquet file written and committed, the old one removed,
as gold's state tables are each batch), then as many rounds of four such commits on
four tables at once (``transaction.concurrently``, as gold commits its tables).

    .venv/bin/python benchmarks/bench_commit.py [--commits 30]

Prints ms per commit and per round for each store and ours against the baseline;
the last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STORES = {
    "HDFSLogStore (Delta's default)": "io.delta.storage.HDFSLogStore",
    "LinkingLogStore (ours)": "io.qmf.delta.LinkingLogStore",
}


def child(store: str, commits: int, folder: Path) -> dict[str, float]:
    import pyarrow as pa

    from pipeline.lake import delta, transaction
    from pipeline.spark import get_spark

    get_spark("qmf-bench-commit", master="local[2]", conf={"spark.delta.logStore.file.impl": store})
    schema = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    rows = pa.table({"k": list(range(1000)), "v": [1.0] * 1000}, schema=schema)
    tables = [str(folder / f"t{i}") for i in range(4)]
    for t in tables:
        delta.create_table(t, schema)

    def replace(table: str, batch: int) -> None:
        delta.replace_arrow(rows, table, app_id="bench", batch_id=batch)

    for batch in range(3):  # warm: the JIT, the tables' first versions
        for t in tables:
            replace(t, batch)
    t0 = time.perf_counter()
    for batch in range(3, 3 + commits):
        replace(tables[0], batch)
    one = (time.perf_counter() - t0) / commits
    t0 = time.perf_counter()
    for batch in range(3 + commits, 3 + 2 * commits):
        transaction.concurrently({t: (lambda t=t, b=batch: replace(t, b)) for t in tables})
    four = (time.perf_counter() - t0) / commits
    return {"one_ms": one * 1000, "four_at_once_ms": four * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=30)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        folder = Path(tempfile.mkdtemp(prefix="qmf-bench-commit-"))
        try:
            print("CHILD " + json.dumps(child(args.child, args.commits, folder)), flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    results: dict[str, dict[str, float]] = {}
    for label, store in STORES.items():
        out = subprocess.run(
            [sys.executable, __file__, "--child", store, "--commits", str(args.commits)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("CHILD "))
        results[label] = json.loads(line[len("CHILD ") :])
        r = results[label]
        print(f"{label:32s} one commit {r['one_ms']:6.1f} ms; four tables at once {r['four_at_once_ms']:6.1f} ms")
    base, ours = (results[k] for k in STORES)
    ratios = {k: base[k] / ours[k] for k in base}
    print(f"ours against Delta's default: one commit {ratios['one_ms']:.2f}x as fast, "
          f"four at once {ratios['four_at_once_ms']:.2f}x")  # fmt: skip
    print("RESULT " + json.dumps({"stores": results, "speedup": ratios}))


if __name__ == "__main__":
    main()
