"""Gold's object names: polars joins against the object-by-object resolver, same run.

Gold names every known object of an agent bucket on every batch
(``pipeline.gold.names.with_names``). A qpidd-shaped set per size: the broker, its
system and default vhost, an exchange, N queues (``[vhostRef, name]``, one level deep)
and N/2 bindings (``[exchangeRef, queueRef, key]``, two levels). For each size the
joins (``joins_from=0``) and the resolver (``joins_from`` above the size) name the same
frame, alternated, best and median of ``--repeat`` calls after one untimed call each
(which parses the keys into the joins' cache, as a gold batch after the first finds
them). Both must give the same names. ``with_names`` takes the joins from
``JOINS_FROM_ROWS`` rows: this benchmark is where that threshold comes from.

Usage (about 30 s on 2 quiet cores):

    .venv/bin/python benchmarks/bench_names.py [--sizes 3500,7000,14000,56000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.gold.names import JOINS_FROM_ROWS, with_names

PKG = "org.apache.qpid.broker"


def lifecycles(queues: int) -> pl.DataFrame:
    """An AM2 broker's lifecycle rows (the columns ``with_names`` reads)."""
    rows: list[tuple[str, str, list[object], dict[str, str]]] = [
        ("system", "0-0-1-0-1", ["4dd8"], {"nodeName": "vm"}),
        ("broker", "0-0-1-0-2", ["amqp-broker"], {"name": "amqp-broker", "port": "5672", "systemRef": "0-0-1-0-1"}),
        ("vhost", "0-0-1-0-3", ["0-0-1-0-2", "/"], {}),
        ("exchange", "0-0-1-0-5", ["0-0-1-0-3", "amq.direct"], {}),
    ]
    rows += [("queue", f"0-1-1-0-{100 + i}", ["0-0-1-0-3", f"q-{i}"], {}) for i in range(queues)]
    rows += [
        ("binding", f"0-1-2-0-{i}", ["0-0-1-0-5", f"0-1-1-0-{100 + i}", f"k{i}"], {})
        for i in range(queues // 2)
    ]
    return pl.DataFrame(
        {
            "agent": ["1.0"] * len(rows),
            "dialect": ["AM2"] * len(rows),
            "package": [PKG] * len(rows),
            "class_name": [r[0] for r in rows],
            "object_id": [r[1] for r in rows],
            "index_key": [json.dumps(r[2]) for r in rows],
            "last_seen_ns": list(range(len(rows))),
            "properties": [[{"key": k, "value": v} for k, v in sorted(r[3].items())] for r in rows],
        }
    ).with_columns(pl.col("properties").cast(pl.Map(pl.Utf8, pl.Utf8)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="3500,7000,14000,56000", help="queues per set (bindings: half)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    result = []
    print(f"with_names takes the joins from {JOINS_FROM_ROWS:,} rows")
    for q in (int(s) for s in args.sizes.split(",")):
        df = lifecycles(q)
        by_joins = with_names(df, joins_from=0)
        one_by_one = with_names(df, joins_from=df.height + 1)
        assert by_joins.equals(one_by_one), q
        joins: list[float] = []
        resolver: list[float] = []
        for _ in range(args.repeat):
            for out, frm in ((joins, 0), (resolver, df.height + 1)):
                t = time.perf_counter()
                with_names(df, joins_from=frm)
                out.append(time.perf_counter() - t)
        j, r = min(joins), min(resolver)
        print(
            f"{df.height:>8,} rows: joins {1e3 * j:7.1f} ms (median {1e3 * statistics.median(joins):7.1f}), "
            f"object by object {1e3 * r:7.1f} ms (median {1e3 * statistics.median(resolver):7.1f}): "
            f"joins take {j / r:.2f} of the time"
        )
        result.append({"rows": df.height, "joins_ms": round(1e3 * j, 1), "resolver_ms": round(1e3 * r, 1),
                       "ratio": round(j / r, 3)})  # fmt: skip
    print("RESULT " + json.dumps({"joins_from_rows": JOINS_FROM_ROWS, "sizes": result}))


if __name__ == "__main__":
    main()
