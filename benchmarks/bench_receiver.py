"""Receiver throughput (landed + settled messages/s) against a bare proton consumer.

Both drain the same kind of pre-filled durable queue on the same broker in the
same run, so the ratio isolates what landing costs (mapping, Arrow segment,
fsync, settle after landing). Rounds alternate bare / receiver to spread
broker warm-up and noise evenly; the best round of each is compared.

    .venv/bin/python benchmarks/bench_receiver.py [--n 20000] [--rounds 2] [--body 300]

Prints figures and the ratio (target >= 0.9); no pass/fail.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from proton import Event
from proton.handlers import MessagingHandler
from proton.reactor import Container

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import broker as qmf_broker
from receivers.config import BrokerConfig
from receivers.landing import LandingLog
from receivers.publisher import OutMessage, Publisher
from receivers.receiver import LandingSink, QmfReceiver, ReceiverConfig


class BareConsumer(MessagingHandler):
    """The baseline: proton's own flow control and auto-accept, nothing else."""

    def __init__(self, cfg: BrokerConfig, address: str, n: int, prefetch: int) -> None:
        super().__init__(prefetch=prefetch, auto_accept=True)
        self.cfg = cfg
        self.address = address
        self.n = n
        self.count = 0
        self.done_at = 0.0

    def on_start(self, event: Event) -> None:
        conn = event.container.connect(**self.cfg.connect_kwargs())
        event.container.create_receiver(conn, self.address)

    def on_message(self, event: Event) -> None:
        self.count += 1
        if self.count == self.n:
            self.done_at = time.perf_counter()
            if event.connection is not None:
                event.connection.close()


def fill(cfg: BrokerConfig, tag: str, n: int, body_size: int) -> None:
    body = os.urandom(body_size)
    with Publisher(cfg, window=2000) as pub:
        pub.publish_many(
            OutMessage(f"mgmt.{tag}.prop.org.apache.qpid.broker.queue", body, message_id=str(i))
            for i in range(n)
        )


def run_bare(cfg: BrokerConfig, queue: str, n: int, credit: int) -> tuple[float, float]:
    """(msg/s, CPU us per message in this process)."""
    h = BareConsumer(cfg, f"/amq/queue/{queue}", n, credit)
    c = Container(h)
    t = threading.Thread(target=c.run, daemon=True)
    cpu = time.process_time()
    start = time.perf_counter()
    t.start()
    t.join(600)
    cpu = time.process_time() - cpu
    if h.count < n:
        raise RuntimeError(f"bare consumer got {h.count} of {n}")
    return n / (h.done_at - start), cpu / n * 1e6


def run_receiver(
    cfg: BrokerConfig, queue: str, n: int, credit: int, flush: int
) -> tuple[float, float]:
    """(msg/s landed + settled, CPU us per message in this process, writer thread included)."""
    with tempfile.TemporaryDirectory() as d:
        done = threading.Event()
        rcfg = ReceiverConfig(broker=cfg, queue=queue, credit_window=credit, flush_count=flush)
        r = QmfReceiver(rcfg, LandingSink(d, "bench"))
        done_at = [0.0]

        def on_group(_: object) -> None:
            if r.stats.landed >= n and not done.is_set():
                done_at[0] = time.perf_counter()
                done.set()

        r.on_group = on_group
        cpu = time.process_time()
        start = time.perf_counter()
        r.start_thread()
        deadline = time.monotonic() + 600
        while not done.wait(1.0):
            if r.error is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"receiver landed {r.stats.landed} of {n}: {r.error!r} {r.stats}"
                )
        r.stop()
        cpu = time.process_time() - cpu
        rows = sum(LandingLog(d).end_offsets().values())
        if rows != n or r.stats.settled != n:
            raise RuntimeError(f"landed {rows}, settled {r.stats.settled}, expected {n}")
        return n / (done_at[0] - start), cpu / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="messages per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--body", type=int, default=300, help="body bytes")
    ap.add_argument("--credit", type=int, default=2000, help="credit window for both")
    ap.add_argument("--flush", type=int, default=500, help="receiver group size")
    args = ap.parse_args()

    info = qmf_broker.ensure_broker()
    cfg = BrokerConfig(urls=(info.url,))
    bare: list[tuple[float, float]] = []
    recv: list[tuple[float, float]] = []
    for rnd in range(args.rounds):
        for name, results in (("bare proton", bare), ("receiver", recv)):
            # a fresh queue per run: nothing left over from the previous consumer
            tag = f"bench{uuid.uuid4().hex[:8]}"
            queue = f"qmf-bench-{tag}"
            qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{tag}.#")], durable=False)
            try:
                t0 = time.perf_counter()
                fill(cfg, tag, args.n, args.body)
                fill_rate = args.n / (time.perf_counter() - t0)
                if name == "bare proton":
                    rate = run_bare(cfg, queue, args.n, args.credit)
                else:
                    rate = run_receiver(cfg, queue, args.n, args.credit, args.flush)
            finally:
                qmf_broker.delete_queue(queue)
            results.append(rate)
            print(
                f"round {rnd + 1} {name:12s} {rate[0]:10,.0f} msg/s  {rate[1]:6.1f} CPU us/msg "
                f"(queue filled at {fill_rate:,.0f} msg/s)",
                flush=True,
            )
    b, r = max(x[0] for x in bare), max(x[0] for x in recv)
    bc, rc = min(x[1] for x in bare), min(x[1] for x in recv)
    print(f"\nbare proton consumer (auto-accept)  : {b:10,.0f} msg/s  {bc:6.1f} CPU us/msg")
    print(f"receiver (landed + fsync + settled) : {r:10,.0f} msg/s  {rc:6.1f} CPU us/msg")
    print(f"ratio receiver / bare (throughput)  : {r / b:10.2f}   (target >= 0.9)")
    print(f"ratio bare / receiver (CPU per msg) : {bc / rc:10.2f}   (best of {args.rounds} each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
