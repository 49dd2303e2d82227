"""What each layer costs per million object samples, its tables on local disk and on a store.

    .venv/bin/python benchmarks/bench_storage.py [--agents 4] [--queues 500] [--intervals 40]

One simulated run (``qmf sim``, AM2, offline) is landed once as a landing log; then
for each place, local disk and the real S3 server of the tests (versitygw on
loopback, ``tests/s3server.py``), the three jobs run one after another as an
operator runs them (``spark-submit``, ``availableNow``, ``local[2]``): bronze,
silver, gold (gold's scratch folder local). Printed per layer:

* CPU-seconds of the job (its JVM and Python workers: the children's rusage), and,
  on the store, the S3 server's own CPU-seconds meanwhile (``/proc``);
* bytes stored: the table folders' files (on the store, the objects the server keeps
  in its folder), Delta logs included; checkpoints apart;
* both per million silver object samples of the run (the unit of the issue).

Each job's figure includes one JVM start-up (about 10-20 CPU-seconds on this machine,
paid once per job run, not per row): the ``startup`` line measures it with an empty
bronze run. The baseline is the same run on local disk, in the same process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.s3server import S3Server  # noqa: E402
from tests.submit import SPARK_SUBMIT, spark_submit_env  # noqa: E402

LAYERS = ("bronze", "silver", "gold")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float:
    """CPU-seconds of a running process (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def land(work: Path, args: argparse.Namespace) -> tuple[Path, int]:
    """The simulated run as a landing log (one partition); its message count."""
    from pipeline.cli import main
    from pipeline.codec.capture import read_capture
    from receivers.landing import LandedMessage, LandingWriter

    capture = work / "sim.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["sim", "-o", str(capture), "--dialect", "am2", "--agents", str(args.agents),
                   "--queues", str(args.queues), "--intervals", str(args.intervals),
                   "--interval", "1", "--seed", "5"])  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"qmf sim exited {rc}")
    landing = work / "landing"
    writer = LandingWriter(landing, "r0", fsync=False)
    batch: list[LandedMessage] = []
    n = 0
    for m in read_capture(str(capture)):
        at = m.received_at_dt
        batch.append(LandedMessage(
            body=m.body, routing_key=m.routing_key, subject=m.subject, app_id=m.app_id,
            content_type=m.content_type,
            application_properties={k: str(v) for k, v in m.application_properties.items()},
            received_at_us=0 if at is None else int(at.timestamp() * 1_000_000),
        ))  # fmt: skip
        if len(batch) == 2000:
            writer.append(batch)
            n += len(batch)
            batch = []
    if batch:
        writer.append(batch)
        n += len(batch)
    return landing, n


def job(script: str, env: dict[str, str], *args: str) -> float:
    """Run one job to its end; its CPU-seconds (JVM and Python workers)."""
    before = children_cpu()
    cmd = [SPARK_SUBMIT, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--driver-memory", "2g", str(REPO / "jobs" / script), *args]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return children_cpu() - before


def run_place(
    place: str, landing: Path, work: Path, s3: S3Server | None
) -> dict[str, dict[str, float]]:
    env = spark_submit_env()
    if s3 is not None:
        bucket = s3.make_bucket(f"cost-{int(time.time())}")
        env.update(s3.env())
        os.environ.update(s3.env())  # this process reads the object samples' count
        base = f"s3a://{bucket}/qmf"
        folders = {layer: s3.folder / bucket / "qmf" / layer for layer in LAYERS}
    else:
        base = str(work / "lake")
        folders = {layer: work / "lake" / layer for layer in LAYERS}
    ck = f"{base}/checkpoints"
    steps = {
        "bronze": ("bronze.py", "--landing", str(landing), "--table", f"{base}/bronze",
                   "--checkpoint", f"{ck}/bronze", "--trigger", "availableNow"),
        "silver": ("silver.py", "--bronze", f"{base}/bronze", "--root", f"{base}/silver",
                   "--checkpoint", f"{ck}/silver", "--trigger", "availableNow"),
        "gold": ("gold.py", "--silver", f"{base}/silver", "--root", f"{base}/gold",
                 "--checkpoint", f"{ck}/gold", "--trigger", "availableNow",
                 "--scratch", str(work / f"scratch-{place}")),
    }  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    for layer, (script, *args) in steps.items():
        server0 = proc_cpu(s3.proc.pid) if s3 is not None and s3.proc is not None else 0.0
        t0 = time.perf_counter()
        cpu = job(script, env, *args)
        server = proc_cpu(s3.proc.pid) - server0 if s3 is not None and s3.proc is not None else 0.0
        out[layer] = {"cpu_s": cpu, "server_cpu_s": server, "wall_s": time.perf_counter() - t0,
                      "bytes": float(folder_bytes(folders[layer]))}  # fmt: skip
    out["_samples"] = {"object_samples": float(object_samples(f"{base}/silver/object_samples"))}
    return out


def object_samples(table: str) -> int:
    from pipeline.lake import storage

    actions = storage.rs_table(table).get_add_actions(flatten=True)
    import pyarrow as pa
    import pyarrow.compute as pc

    return int(pc.sum(pa.table(actions).column("num_records")).as_py() or 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--queues", type=int, default=500)
    ap.add_argument("--intervals", type=int, default=40)
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="qmf-bench-storage-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"bench_storage: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, work {work}")
    t0 = time.perf_counter()
    landing, messages = land(work, args)
    print(f"  landed {messages:,} messages ({folder_bytes(landing):,} bytes) in {time.perf_counter() - t0:.0f} s")
    empty = work / "empty-landing"
    empty.mkdir(exist_ok=True)
    startup = job("bronze.py", spark_submit_env(), "--landing", str(empty), "--table",
                  str(work / "empty-bronze"), "--checkpoint", str(work / "empty-ck"),
                  "--trigger", "availableNow")  # fmt: skip
    print(f"  startup: an empty bronze run takes {startup:.1f} CPU-s (in every job's figure below)")
    results: dict[str, Any] = {"messages": messages, "startup_cpu_s": round(startup, 1)}
    s3 = S3Server(work / "store").start()
    try:
        for place, server in (("local", None), ("store", s3)):
            got = run_place(place, landing, work, server)
            n = got.pop("_samples")["object_samples"]
            per = 1e6 / n
            results[place] = {"object_samples": int(n), **got}
            print(f"\n  {place}: {int(n):,} object samples")
            for layer in LAYERS:
                g = got[layer]
                srv = f" + server {g['server_cpu_s']:.1f}" if server is not None else ""
                cpu = g["cpu_s"] + g["server_cpu_s"]
                print(f"    {layer:6s} {g['cpu_s']:6.1f} CPU-s{srv} ({cpu * per:7.1f} per million samples,"
                      f" {max(cpu - startup, 0.0) * per:7.1f} past the start-up), {g['bytes'] / 1e6:7.2f} MB stored "
                      f"({g['bytes'] * per / 1e6:7.1f} MB per million), wall {g['wall_s']:.0f} s")
    finally:
        s3.stop()
    print()
    for layer in LAYERS:
        lo, st = results["local"][layer], results["store"][layer]
        print(f"  [{layer}] store / local: CPU {(st['cpu_s'] + st['server_cpu_s']) / lo['cpu_s']:.2f}x"
              f" (the job alone {st['cpu_s'] / lo['cpu_s']:.2f}x), bytes {st['bytes'] / lo['bytes']:.2f}x,"
              f" wall {st['wall_s'] / lo['wall_s']:.2f}x")
    print("RESULT " + json.dumps(results, default=float))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
