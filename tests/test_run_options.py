"""`qmf run --url ...`: TLS, SASL and credentials reach the embedded receiver's config."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.commands.run import _receiver_options, register
from receivers.receiver import config_from_options


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_tls_and_sasl_options_configure_the_receiver(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.write_text("user=monitor\npassword=s3cret\n", encoding="utf-8")
    args = _args("--url", "amqps://qpidd.example:5671", "--preset", "qpidd", "--no-sim",
                 "--ca-file", "/etc/ssl/ca.pem", "--cert-file", "/etc/ssl/me.pem",
                 "--key-file", "/etc/ssl/me.key", "--no-verify-hostname",
                 "--credentials-file", str(creds), "--sasl", "PLAIN")  # fmt: skip
    opts = _receiver_options(args, args.url, tmp_path / "wants")
    assert "queue" not in opts  # a broker of yours: no queue is declared for you
    cfg = config_from_options(opts)
    assert cfg.preset == "qpidd"
    assert cfg.broker.urls == ("amqps://qpidd.example:5671",)
    assert cfg.broker.tls is not None
    assert (cfg.broker.tls.ca_file, cfg.broker.tls.cert_file, cfg.broker.tls.key_file) == (
        "/etc/ssl/ca.pem", "/etc/ssl/me.pem", "/etc/ssl/me.key")  # fmt: skip
    assert cfg.broker.tls.verify_hostname is False
    assert cfg.broker.sasl_mechanisms == ("PLAIN",)
    assert (cfg.broker.user, cfg.broker.password) == ("monitor", "s3cret")


def test_local_defaults_pass_no_tls() -> None:
    args = _args()
    opts = _receiver_options(args, "amqp://127.0.0.1:35672", Path("w"))
    assert opts == {"url": "amqp://127.0.0.1:35672", "preset": "rabbitmq", "queue": "qmf.pipeline"}
    assert config_from_options(opts).broker.tls is None


def test_closing_summary_decodes_bronze_up_to_a_bound(tmp_path: Path, shared_dir: str) -> None:
    """The real sample in bronze (two commits): the summary counts every record by
    opcode, as the capture's summary file does; over ``--summary-rows`` it only
    gives the row count from the log instead of decoding bronze again."""
    import json
    import os

    from pipeline.codec.capture import read_capture
    from pipeline.commands.run import SUMMARY_ROWS, _bronze_summary
    from pipeline.silver import bronze_rows, write_bronze

    msgs = list(read_capture(os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")))
    bronze = tmp_path / "bronze"
    write_bronze(str(bronze), [bronze_rows(msgs[:400]), bronze_rows(msgs[400:], first_offset=400)])
    with open(os.path.join(shared_dir, "samples", "qpidd-capture-20s.summary.json")) as fh:
        want = json.load(fh)
    assert _args().summary_rows == SUMMARY_ROWS == 100_000
    got = _bronze_summary(bronze, max_rows=863)
    assert got["bronze_rows"] == 863 == want["messages"]
    # Twins: six identical messages the broker sent three times each, every one a row.
    assert got["twin_rows"] == 12
    assert got["decode_problems"] == 0
    ops = got["records_by_opcode"]
    assert {k: v for k, v in ops.items() if k in want["v1_records_by_opcode"]} == want[
        "v1_records_by_opcode"
    ]
    assert ops["_data_indication"] == 746
    skipped = _bronze_summary(bronze, max_rows=862)
    assert skipped["bronze_rows"] == 863
    assert skipped["records_by_opcode"] is None
    assert "over --summary-rows 862" in skipped["summary_skipped"]


def test_bind_reaches_the_embedded_receiver(tmp_path: Path) -> None:
    """`qmf run --bind` subscribes like `qmf receive --bind`: with a broker of yours
    instead of the preset's defaults, on the local node instead of the durable queue."""
    args = _args("--url", "amqp://qpidd.example:5672", "--preset", "qpidd", "--no-sim",
                 "--bind", "qpid.management:#", "--bind", "qmf.default.topic:agent.ind.#,"
                 "qmf.default.topic:agent.ind.heartbeat.#")  # fmt: skip
    opts = _receiver_options(args, args.url, tmp_path / "wants")
    cfg = config_from_options(opts)
    assert cfg.queue is None
    assert cfg.bindings == (
        ("qpid.management", "#"),
        ("qmf.default.topic", "agent.ind.#"),
        ("qmf.default.topic", "agent.ind.heartbeat.#"),
    )
    assert [(s.address, s.binding_key) for s in cfg.subscriptions()] == [
        ("qpid.management", "#"),
        ("qmf.default.topic", "agent.ind.#"),
        ("qmf.default.topic", "agent.ind.heartbeat.#"),
    ]
    local = _args("--bind", "qpid.management:mgmt.#")
    opts = _receiver_options(local, "amqp://127.0.0.1:35672", tmp_path / "wants")
    assert opts == {"url": "amqp://127.0.0.1:35672", "preset": "rabbitmq",
                    "bind": "qpid.management:mgmt.#"}  # fmt: skip
    assert [s.address for s in config_from_options(opts).subscriptions()] == [
        "/exchange/qpid.management/mgmt.#"
    ]


def test_a_bad_bind_stops_qmf_run_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.commands.run import run

    args = _args("--data", str(tmp_path / "data"), "--bind", "qpid.management:", "--no-sim")
    assert run(args) == 2
    assert "binding 'qpid.management:' must be EXCHANGE:KEY" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_dialect_and_load_intervals_reach_the_simulator(tmp_path: Path) -> None:
    from pipeline.commands.run import _sim_command

    args = _args("--dialect", "v2-amqp10", "--load-intervals", "30", "--duration", "60")
    cmd = _sim_command(args, "amqp://h:1", tmp_path / "m.jsonl")
    assert cmd[cmd.index("--dialect") + 1] == "v2-amqp10"
    assert cmd[cmd.index("--load-intervals") + 1] == "30"
    assert "--load-intervals" not in _sim_command(_args(), "amqp://h:1", tmp_path / "m.jsonl")


def test_short_lived_queues_and_restarts_reach_the_simulator(tmp_path: Path) -> None:
    """Issue 47's cases in a `qmf run` of simulated agents: deletes with qpidd's stale update
    time, restarts."""
    from pipeline.commands.run import _sim_command

    args = _args("--short-lived", "2", "--restart", "0:5", "--restart", "1:9")
    cmd = _sim_command(args, "amqp://h:1", tmp_path / "m.jsonl")
    assert cmd[cmd.index("--short-lived") + 1] == "2"
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--restart"] == ["0:5", "1:9"]
    plain = _sim_command(_args(), "amqp://h:1", tmp_path / "m.jsonl")
    assert "--short-lived" not in plain and "--restart" not in plain


def test_v1_interval_reaches_gold_liveness() -> None:
    """A real broker's v1 heartbeat interval is given; simulated agents' is known."""
    from pipeline.commands.run import liveness_rules

    assert liveness_rules(_args("--no-sim", "--url", "amqp://h", "--v1-interval", "2")).v1_interval_s == 2.0
    assert liveness_rules(_args("--no-sim", "--url", "amqp://h")).v1_interval_s == 10.0
    assert liveness_rules(_args("--interval", "3")).v1_interval_s == 3.0


def test_warm_up_compiles_the_v2_kernels_where_v2_traffic_comes() -> None:
    """A v2-only broker (qpidd's defaults) must not compile them in silver's first batch;
    the default (AM1) simulation does not wait for them."""
    from pipeline.codec import vectorized
    from pipeline.commands.run import warm_decoder, warm_dialects

    assert warm_dialects(_args()) == ("am1",)
    assert warm_dialects(_args("--dialect", "v2")) == ("am1", "v2-amqp10")
    assert warm_dialects(_args("--no-sim", "--url", "amqp://h")) == ("am1", "v2-amqp10")

    seen: list[int] = []
    real = vectorized.decode_content

    def counting(*a: object, **k: object) -> vectorized.ContentResult:
        out = real(*a, **k)  # type: ignore[arg-type]
        seen.append(out.v2_messages)
        return out

    vectorized.decode_content = counting  # type: ignore[assignment]
    try:
        warm_decoder(("am1", "v2-amqp10"))
    finally:
        vectorized.decode_content = real  # type: ignore[assignment]
    assert seen == [0, 16]  # am1, then v2 over AMQP 1.0: all 16 data messages by the kernel


def test_a_fleet_file_reaches_the_embedded_receiver_and_gold_liveness(tmp_path: Path) -> None:
    from pipeline.commands.run import liveness_rules

    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[broker]]\nname = "east"\nurl = "amqp://e:5672"\nheartbeat_interval = 2\n'
                     '[[broker]]\nname = "west"\nurl = "amqp://w:5672"\n', encoding="utf-8")  # fmt: skip
    args = _args("--config", str(fleet))
    assert _receiver_options(args, "unused", tmp_path / "wants") == {
        "config": str(fleet), "consoleWants": str(tmp_path / "wants"),
    }  # fmt: skip
    rules = liveness_rules(_args("--config", str(fleet), "--no-sim"))
    assert (rules.v1_interval_s, rules.v1_intervals) == (10.0, (("east", 2.0),))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--url", "amqp://h"), "--config names the brokers: no --url"),
        ((), "broker 1: name must be letters"),
    ],
)
def test_a_bad_fleet_stops_qmf_run_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], message: str
) -> None:
    from pipeline.commands.run import run

    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[broker]]\nname = "a b"\nurl = "amqp://e:5672"\n', encoding="utf-8")
    assert run(_args("--data", str(tmp_path / "data"), "--config", str(fleet), *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
