"""The `qmf` console command: a thin dispatcher over ``pipeline.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> module; each module defines register(subparsers).
COMMAND_MODULES: dict[str, str] = {
    "broker": "pipeline.commands.broker",
    "decode": "pipeline.commands.decode",
    "sim": "pipeline.commands.sim",
    "receive": "pipeline.commands.receive",
    "capture": "pipeline.commands.capture",
    "replay": "pipeline.commands.replay",
    "run": "pipeline.commands.run",
    "soak": "pipeline.commands.soak",
    "maintain": "pipeline.commands.maintain",
    "top": "pipeline.commands.top",
    "serve-metrics": "pipeline.commands.metrics",
    "alert-rules": "pipeline.commands.alerts",
    "backfill": "pipeline.commands.backfill",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qmf", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMAND_MODULES.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # command not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from pipeline import SetupError

    try:
        code: int = args.func(args)
    except SetupError as exc:
        print(f"qmf {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
