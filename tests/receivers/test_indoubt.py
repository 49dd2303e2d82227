"""Redelivery vs twin on the landing log alone: the settle marker, sealing, claims.

These drive ``LandingSink`` exactly as the receiver does (append, then
``mark_settled`` for what the broker has seen); the broker's part is played by
the test: after a "crash" it redelivers what was not settled, flagged.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pyarrow as pa

from receivers.indoubt import PENDING_PREFIX, InDoubtLedger, read_marker
from receivers.landing import LandedMessage, LandingLog
from receivers.receiver import LandingSink


def msg(i: int, body: bytes | None = None) -> LandedMessage:
    return LandedMessage(
        body=body if body is not None else f"body-{i}".encode(),
        routing_key=f"mgmt.agent.obj.q{i}",
        subject=f"mgmt.agent.obj.q{i}",
        received_at_us=1_700_000_000_000_000 + i,
    )


def again(m: LandedMessage) -> LandedMessage:
    """The broker's redelivery: same content, flagged, received later."""
    return dataclasses.replace(m, redelivered=True, received_at_us=m.received_at_us + 3_600 * 10**6)


def landed(root: Path) -> pa.Table:
    log = LandingLog(root)
    parts = [log.read(p, log.start_offsets()[p], e) for p, e in sorted(log.end_offsets().items())]
    return pa.concat_tables(parts)


def rows(root: Path) -> list[tuple[str, int, bytes, bool, str | None]]:
    t = landed(root)
    return list(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), t["body"].to_pylist(),
                    t["redelivered"].to_pylist(), t["duplicate_of"].to_pylist(), strict=True))  # fmt: skip


def test_crash_between_landing_and_settling_twins_in_flight(tmp_path: Path) -> None:
    twin = msg(2)
    first = [msg(0), msg(1), twin, twin]  # settled, and seen by the broker
    in_doubt = [msg(3), twin, twin, msg(4)]  # landed, settlement lost in the crash
    sink = LandingSink(tmp_path, "r0")
    sink.append(first)
    sink.mark_settled(4)
    sink.append(in_doubt)
    sink.close()  # SIGKILL: the marker stays at 4

    # The broker redelivers the unsettled group and what the dead receiver had
    # not landed yet (msg 5 and a third twin, whose first copies never landed).
    sink = LandingSink(tmp_path, "r0")  # restart: seals offsets 4..7
    assert read_marker(tmp_path / "r0") == 8
    sink.append([again(m) for m in [*in_doubt, msg(5), twin]])
    sink.append([twin])  # published again later: a twin, not a redelivery
    sink.close()

    got = rows(tmp_path)
    assert [r[1] for r in got] == list(range(15))
    assert [(r[3], r[4]) for r in got[8:]] == [
        (True, "r0:4"), (True, "r0:5"), (True, "r0:6"), (True, "r0:7"),
        (True, None), (True, None), (False, None),
    ]  # fmt: skip
    # What bronze keeps (duplicate_of is null): every delivery once, twins as often as sent.
    kept = sorted(r[2] for r in got if r[4] is None)
    assert kept == sorted(m.body for m in [*first, *in_doubt, msg(5), twin, twin])


def test_each_first_copy_is_claimed_once(tmp_path: Path) -> None:
    twin = msg(7)
    sink = LandingSink(tmp_path, "r0")
    sink.append([twin, twin])
    sink.close()  # nothing marked settled: both in doubt
    sink = LandingSink(tmp_path, "r0")
    # Three flagged copies: two match the two landed copies, the third is new.
    sink.append([again(twin)] * 3)
    sink.close()
    assert [r[4] for r in rows(tmp_path)[2:]] == ["r0:0", "r0:1", None]
    assert sorted(os.listdir(tmp_path / "r0" / "_indoubt" / "claimed")) == ["0", "1"]


def test_a_competing_receiver_seals_a_dead_partition(tmp_path: Path) -> None:
    """r0 dies; its redeliveries go to r1 at once, which finds r0 unlocked and seals it."""
    r0 = LandingSink(tmp_path, "r0")
    r0.append([msg(1), msg(2)])
    r0.mark_settled(1)
    r1 = LandingSink(tmp_path, "r1")  # started while r0 still lives: r0's tail is not its
    assert not (tmp_path / "r0" / "_indoubt").exists()
    r0.close()  # dies
    r1.append([again(msg(2)), again(msg(1))])  # msg 1 was settled: its copy is new
    r1.close()
    got = {(r[0], r[1]): r[4] for r in rows(tmp_path)}
    assert got == {("r0", 0): None, ("r0", 1): None, ("r1", 0): "r0:1", ("r1", 1): None}
    # r0's next session has nothing left in doubt (r1 sealed it and moved its marker).
    assert read_marker(tmp_path / "r0") == 2
    LandingSink(tmp_path, "r0").close()
    assert sorted(os.listdir(tmp_path / "r0" / "_indoubt")) == [
        "00000000000000000001-00000000000000000001.arrow", "claimed",
    ]  # fmt: skip


def test_clean_stop_leaves_nothing_in_doubt(tmp_path: Path) -> None:
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1), msg(2)])
    sink.mark_settled(2)
    sink.close()
    sink = LandingSink(tmp_path, "r0")
    assert len(sink.ledger) == 0
    sink.append([again(msg(1))])  # e.g. a publisher's own retry: no landed copy is in doubt
    sink.close()
    assert rows(tmp_path)[-1][3:] == (True, None)


def test_redelivery_days_later_is_still_caught(tmp_path: Path) -> None:
    """No time window: the ledger keeps in-doubt keys until they are claimed (or a TTL)."""
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1)])
    sink.close()
    ledger = InDoubtLedger(tmp_path, own="r9")
    ledger.refresh()  # seals r0 (unlocked), as a receiver started days later would
    late = dataclasses.replace(again(msg(1)), received_at_us=msg(1).received_at_us + 5 * 86400 * 10**6)
    assert ledger.match([late.key()]) == ["r0:0"]
    assert ledger.match([late.key()]) == [None]  # claimed: a second copy would be new
    expired = InDoubtLedger(tmp_path, own="r9", ttl_s=-1)
    expired.refresh()
    assert len(expired) == 0


def test_retention_keeps_what_may_still_be_sealed(tmp_path: Path) -> None:
    sink = LandingSink(tmp_path, "r0")
    for i in range(3):
        sink.append([msg(i)])
    sink.mark_settled(1)
    log = LandingLog(tmp_path)
    # Committed downstream up to 3, but offsets >= 1 may still be needed to seal.
    assert log.delete_before("r0", 3) == 1
    assert log.start_offsets() == {"r0": 1}
    sink.close()


def test_a_lost_connection_widens_the_seal_below_the_marker(tmp_path: Path) -> None:
    """A broker going away may drop dispositions the marker already counts."""
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1), msg(2)])
    sink.append([msg(3)])
    sink.mark_settled(3)  # all settled, as far as the receiver could tell
    sink.seal(start=1)  # the connection was lost soon after offsets 1.. were settled
    sink.append([again(msg(2)), again(msg(1))])
    sink.close()
    assert [r[4] for r in rows(tmp_path)[3:]] == ["r0:1", None]
    assert read_marker(tmp_path / "r0") == 3  # sealed up to the end at the time


def test_a_claim_whose_receiver_died_before_landing_is_taken_over(tmp_path: Path) -> None:
    """CI found it: a session claims first copies for redeliveries and is killed before it
    lands them; the broker redelivers once more, and the next session must still flag them."""
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1), msg(2)])
    sink.close()  # killed before settling: both in doubt
    dying = LandingSink(tmp_path, "r0")
    base = dying.next_offset
    assert dying.ledger.match([again(msg(1)).key(), again(msg(2)).key()], [base, base + 1]) == [
        "r0:0", "r0:1"
    ]
    dying.close()  # killed between its claims and its landing
    sink = LandingSink(tmp_path, "r0")
    sink.append([again(msg(1)), again(msg(2))])
    sink.close()
    assert [r[4] for r in rows(tmp_path)] == [None, None, "r0:0", "r0:1"]
    claims = tmp_path / "r0" / "_indoubt" / "claimed"
    assert sorted(n for n in os.listdir(claims) if "void" not in n) == ["0", "1"]
    assert (claims / "0").read_text().split()[0] == "r0:2"  # the flagged copy's position


def test_a_claim_whose_copy_landed_stands(tmp_path: Path) -> None:
    """The claimant landed its flagged copy, then died unsettled: a third copy is new."""
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1)])
    sink.close()
    sink = LandingSink(tmp_path, "r0")
    sink.append([again(msg(1))])  # claims r0:0, lands at r0:1 flagged
    sink.mark_settled(2)
    sink.close()
    other = LandingSink(tmp_path, "r1")
    other.append([again(msg(1))])
    other.close()
    assert [(r[0], r[1], r[4]) for r in rows(tmp_path)] == [
        ("r0", 0, None), ("r0", 1, "r0:0"), ("r1", 0, None)
    ]


def test_an_empty_claim_left_by_a_killed_claimant_is_taken_over(tmp_path: Path) -> None:
    """CI found it: receivers that created a claim, then wrote it, could be killed between
    the two, and the empty claim stood forever, so the next redelivery landed as new (a
    message twice in bronze). Claims are now linked into place whole; an empty one (left by
    such a receiver) is taken over once it is old enough to have no live writer."""
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1), msg(2)])
    sink.close()  # killed before settling: both in doubt
    claims = tmp_path / "r0" / "_indoubt" / "claimed"
    claims.mkdir(parents=True)
    (claims / "0").touch()
    old = time.time() - 60
    os.utime(claims / "0", (old, old))
    (claims / "1").touch()  # just created: its writer may be writing it now
    sink = LandingSink(tmp_path, "r0")
    sink.append([again(msg(1)), again(msg(2))])
    sink.close()
    assert [r[4] for r in rows(tmp_path)] == [None, None, "r0:0", None]
    assert (claims / "0").read_text().split()[0] == "r0:2"
    assert (claims / "1").read_text() == ""
    assert sorted(os.listdir(claims)) == ["0", "0.void-" + sink.ledger.session, "1"]


def test_a_claim_written_but_not_linked_leaves_the_first_copy_unclaimed(tmp_path: Path) -> None:
    """A claimant killed between writing its claim aside and linking it claimed nothing."""
    sink = LandingSink(tmp_path, "r0")
    sink.append([msg(1)])
    sink.close()
    claims = tmp_path / "r0" / "_indoubt" / "claimed"
    claims.mkdir(parents=True)
    (claims / f"{PENDING_PREFIX}deadbeef").write_text("r0:1 deadbeef")
    sink = LandingSink(tmp_path, "r0")
    sink.append([again(msg(1))])
    sink.close()
    assert [r[4] for r in rows(tmp_path)] == [None, "r0:0"]
    assert sorted(os.listdir(claims)) == [f"{PENDING_PREFIX}deadbeef", "0"]
