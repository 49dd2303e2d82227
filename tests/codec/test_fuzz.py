"""Fuzzing with mutated/truncated real messages: only codec errors, good records kept, lossless decode."""

from __future__ import annotations

import os

import pytest

from pipeline.codec.capture import CapturedMessage, read_capture
from pipeline.codec.fuzzing import CODEC_ERRORS, MUTATIONS, fuzz, prepare
from pipeline.codec.message import decode_message


@pytest.fixture(scope="module")
def sample(shared_dir: str) -> list[CapturedMessage]:
    return list(read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")))


def test_fuzz_3000_mutations(sample: list[CapturedMessage]) -> None:
    stats = fuzz(sample, 3000, seed=20261122)
    assert stats.failures == []
    assert stats.cases == 3000
    assert set(stats.by_mutation) == set(MUTATIONS)
    assert set(stats.problems_by_error) <= CODEC_ERRORS
    assert {"Truncated", "Malformed", "BadMagic", "MissingSchema"} <= set(stats.problems_by_error)
    assert stats.clean == stats.reencoded_exact + stats.nan_exempt
    assert stats.clean > 0 and stats.records_before_problem > 0 and stats.prefix_checked > 0


def test_truncated_batch_keeps_every_whole_record(sample: list[CapturedMessage]) -> None:
    bases, registry = prepare(sample)
    big = max(bases, key=lambda b: len(b.records))
    assert len(big.records) == 78
    for k in (0, 1, 39, 77):
        start = big.ends[k - 1] if k else 0
        for cut in (start, start + 3, start + 8, big.ends[k] - 1):
            res = decode_message(big.msg.body[:cut], registry=registry.copy())
            assert res.records == big.records[:k], (k, cut)
            whole = cut == start and k > 0  # cut exactly after record k: nothing is wrong
            assert len(res.problems) == (0 if whole else 1)
            if not whole:
                assert res.problems[0].error == "Truncated"
                assert res.problems[0].offset >= start
    res = decode_message(big.msg.body + b"AM2", registry=registry.copy())
    assert res.records == big.records
    assert [p.message for p in res.problems] == [
        f"truncated record header at offset {len(big.msg.body)}: expected 8 bytes, found 3"
    ]
