"""A receiver that dies (SIGKILL) right after landing its K-th group, before settling it.

    python -m tests.integration.killed_receiver URL QUEUE LANDING PARTITION K

Groups before the K-th are settled and, by the pause before the K-th, under
the settle marker; the K-th is durable but unsettled: the broker redelivers
it, together with whatever was in flight, flagged as redelivered.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence

from receivers.landing import LandedMessage
from receivers.receiver import LandingSink, QmfReceiver, config_from_options

PAUSE_S = 1.5  # > SETTLE_GRACE_S + MARKER_EVERY_S: earlier groups are marked settled


class DyingSink(LandingSink):
    def __init__(self, root: str, partition: str, kill_at: int) -> None:
        super().__init__(root, partition)
        self.kill_at = kill_at
        self.groups = 0

    def append(self, msgs: Sequence[LandedMessage]) -> None:
        self.groups += 1
        if self.groups == self.kill_at:
            time.sleep(PAUSE_S)
        super().append(msgs)
        if self.groups == self.kill_at:
            print(f"killed after landing group {self.groups} ({len(msgs)} messages), "
                  f"next offset {self.next_offset}", flush=True)  # fmt: skip
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str]) -> None:
    url, queue, landing, partition, k = argv
    cfg = config_from_options(
        {"url": url, "queue": queue, "preset": "rabbitmq", "credit": "100",
         "flushCount": "40", "flushMs": "2000"}
    )  # fmt: skip
    receiver = QmfReceiver(cfg, DyingSink(landing, partition, int(k)))
    receiver.run_for(120)


if __name__ == "__main__":
    main(sys.argv[1:])
