"""The reference summary of the 20 s sample, as the pipeline reads it now (issue 47)."""

from __future__ import annotations

import copy
from typing import Any


def with_final_samples(reference: dict[str, Any]) -> dict[str, Any]:
    """The sample's ``qpidd-capture-20s.summary.json`` with a deleted queue's last record
    taken at its delete time: qpidd keeps the previous publish's update time on it, so
    the file (made by the first-sample-per-update-time rule) misses these final samples:
    tool-q1's fourth, and three queues whose only later sample was their delete record."""
    out = copy.deepcopy(reference)
    rates = out["queue_rates_first_to_last_v1_sample"]
    rates["tool-q1"] = {**rates["tool-q1"], "samples": 4}
    rates["v2-created-0b4aa0e2-1"] = {"deq_rate": 0.0, "enq_rate": 0.0, "samples": 2}
    rates["v1-created-0b4aa0e2"] = {"deq_rate": 0.0, "enq_rate": 0.0, "samples": 2}
    rates["act-q-1"] = {"deq_rate": 0.996, "enq_rate": 0.0, "samples": 2}
    out["queue_rates_first_to_last_v1_sample"] = {k: rates[k] for k in sorted(rates)}
    return out
