"""spark-submit entry point: silver Delta tables -> gold Delta tables (rates, lifecycles, liveness).

    spark-submit jobs/gold.py --silver S --root G --checkpoint C [--trigger availableNow]
    spark-submit jobs/gold.py --silver S --root G --batch-id N [--from T0 --to T1]

The first form streams silver's samples and heartbeats (source ``qmf-delta``),
restartable from its checkpoint, exactly once; the second (backfill) runs
the same writer once over the silver tables, or a sample-time range, as gold
batch N of ``--app-id``. Only argument wiring lives here; the logic is in
``pipeline.gold``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from types import FrameType

from pipeline.bronze import trigger_kwargs, tune_shuffles
from pipeline.gold import GoldSettings, run_gold, run_gold_batch
from pipeline.transforms.gold import LivenessRules, RateRules


def _trigger(text: str) -> str:
    try:
        trigger_kwargs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gold", description=__doc__.splitlines()[0])
    p.add_argument("--silver", required=True, help="folder of the silver tables")
    p.add_argument("--root", required=True, help="folder of the gold tables")
    p.add_argument("--registry", default=None, help="schema registry table (default SILVER/schema_registry)")
    p.add_argument("--checkpoint", default="", help="streaming checkpoint folder (stream mode)")
    p.add_argument("--trigger", type=_trigger, default="availableNow",
                   help="availableNow (default) or processingTime=<interval>")
    p.add_argument("--max-files-per-trigger", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds: run time for processingTime, upper bound for availableNow")
    p.add_argument("--min-interval", type=float, default=1.0, metavar="SECONDS",
                   help="shorter intervals are skipped (the baseline stays)")
    p.add_argument("--max-gap", type=float, default=300.0, metavar="SECONDS",
                   help="longer intervals are resets (reason gap)")
    p.add_argument("--state-ttl", type=float, default=86400.0, metavar="SECONDS",
                   help="series idle this long (sample time) leave the rate state")
    p.add_argument("--missed-heartbeats", type=int, default=3)
    p.add_argument("--v1-agent", default="1.0", help="agent that v1 heartbeats stand for")
    p.add_argument("--v1-interval", type=float, default=10.0, metavar="SECONDS",
                   help="v1 heartbeat interval (the broker's mgmt-pub-interval)")
    p.add_argument("--batch-id", type=int, default=None,
                   help="batch mode: run over silver as this gold batch id")
    p.add_argument("--app-id", default="qmf-gold-batch", help="batch mode: the writer's app id")
    p.add_argument("--from", dest="t_from", type=datetime.fromisoformat, default=None)
    p.add_argument("--to", dest="t_to", type=datetime.fromisoformat, default=None)
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.batch_id is None and not args.checkpoint:
        print("gold: stream mode needs --checkpoint (or give --batch-id)", file=sys.stderr)
        return 2
    settings = GoldSettings(
        silver=args.silver,
        root=args.root,
        checkpoint=args.checkpoint,
        registry=args.registry,
        trigger=args.trigger,
        max_files_per_trigger=args.max_files_per_trigger,
        rates=RateRules(args.min_interval, args.max_gap, args.state_ttl),
        liveness=LivenessRules(args.missed_heartbeats, args.v1_agent, args.v1_interval),
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    from pipeline.spark import get_spark

    spark = get_spark("qmf-gold")
    tune_shuffles(spark)
    try:
        if args.batch_id is not None:
            span = None
            if args.t_from is not None or args.t_to is not None:
                span = (args.t_from or datetime.min, args.t_to or datetime.max)
            report = run_gold_batch(
                spark, settings, args.batch_id, app_id=args.app_id, sample_time=span
            )
            print(report)
            return 0
        return run_gold(spark, settings, args.timeout, stop)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
