"""Long fuzz run of the codec over mutated real messages (default 100,000 cases).

    .venv/bin/python tools/fuzz_codec.py [--cases N] [--seed S] [--capture FILE] [--doc docs/codec.md]

Prints the statistics as JSON; with --doc, rewrites the fuzz section of the
doc between its markers. Exit status 1 if any case broke the contract.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pipeline.codec.capture import read_capture
from pipeline.codec.fuzzing import fuzz

BEGIN, END = "<!-- fuzz-result:begin -->", "<!-- fuzz-result:end -->"
DEFAULT_CAPTURE = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "samples", "qpidd-capture-20s.jsonl"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--capture", default=os.environ.get("QMF_FUZZ_CAPTURE", DEFAULT_CAPTURE))
    ap.add_argument("--doc", help="markdown file whose fuzz-result section is rewritten")
    args = ap.parse_args()
    messages = list(read_capture(args.capture))
    t0 = time.perf_counter()
    stats = fuzz(messages, args.cases, seed=args.seed)
    secs = time.perf_counter() - t0
    result = stats.as_dict()
    result["seed"] = args.seed
    result["seconds"] = round(secs, 1)
    print(json.dumps(result, indent=1))
    for f in stats.failures:
        print("FAIL", f, file=sys.stderr)
    if args.doc:
        with open(args.doc, encoding="utf-8") as fh:
            text = fh.read()
        if BEGIN not in text or END not in text:
            print(f"{args.doc} has no {BEGIN} ... {END} section", file=sys.stderr)
            return 2
        block = (
            f"{BEGIN}\n`python tools/fuzz_codec.py --cases {args.cases} --seed {args.seed}` "
            f"over `{os.path.basename(args.capture)}` ({len(messages)} messages), "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, {secs:.0f} s:\n\n```json\n"
            f"{json.dumps(result, indent=1)}\n```\n{END}"
        )
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
        with open(args.doc, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
