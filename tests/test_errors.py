"""The errors a user meets first say what is wrong and what to do, on one line.

Each test runs the real command as a user would (a subprocess of the venv's
Python) and checks the exact message docs/troubleshooting.md quotes; none
prints a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.spark import java_problem

REPO = Path(__file__).resolve().parents[1]


def qmf(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def base_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QMF_BROKER_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(changes)
    return env


def test_receive_from_an_unreachable_broker_gives_up_with_the_url(tmp_path: Path) -> None:
    """Port 1 refuses: the receiver retries with backoff; with --max-connect-attempts it
    stops and says which URL failed and what to check (exit 1)."""
    out = qmf(
        "receive", "--url", "amqp://localhost:1", "--landing", str(tmp_path / "landing"),
        "--max-connect-attempts", "2", env=base_env(),
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        "qmf receive: gave up after 2 connection attempts: transport error "
        "(amqp://localhost:1): proton.pythonio: Connection refused to all addresses; "
        "is the broker running and the URL right (--url, QMF_BROKER_URL)?"
    )
    assert "Traceback" not in out.stderr


@pytest.mark.broker
def test_receive_with_a_wrong_password_names_the_user_and_where_credentials_come_from(
    broker: Any, tmp_path: Path
) -> None:
    url = f"amqp://{broker.extra_user}@127.0.0.1:{broker.port}"
    out = qmf(
        "receive", "--url", url, "--landing", str(tmp_path / "landing"), "--duration", "30",
        env=base_env(QMF_BROKER_PASSWORD="wrong-password-123"),
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        f"qmf receive: transport error (amqp://127.0.0.1:{broker.port}): "
        "amqp:unauthorized-access: Authentication failed [mech=PLAIN]: the broker refused "
        f"user {broker.extra_user!r}; check QMF_BROKER_USER/QMF_BROKER_PASSWORD, "
        "--credentials-file or the URL"
    )
    assert "wrong-password-123" not in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"JAVA_HOME": "/nonexistent"},
            "qmf run: Java not found: JAVA_HOME=/nonexistent has no bin/java; point JAVA_HOME "
            "at a Java 17+ installation or unset it (tools/setup.sh installs "
            "openjdk-17-jre-headless)",
        ),
        (
            {"PATH": "/nonexistent"},
            "qmf run: Java not found: no java on the PATH and JAVA_HOME is not set; Spark needs "
            "Java 17+ (tools/setup.sh installs openjdk-17-jre-headless)",
        ),
    ],
    ids=["JAVA_HOME", "PATH"],
)
def test_run_without_java_is_one_line_and_exit_2(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    """Checked before a JVM is launched (pyspark would only say "Java gateway process
    exited before sending its port number", under a traceback). --url: no local broker."""
    e = base_env(**env)
    if "PATH" in env:
        e.pop("JAVA_HOME", None)
    out = qmf(
        "run", "--url", "amqp://127.0.0.1:1", "--no-sim", "--duration", "1",
        "--data", str(tmp_path / "data"), env=e,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == message
    assert "Traceback" not in out.stderr


def test_java_problem_follows_spark_class(tmp_path: Path) -> None:
    """spark-class runs $JAVA_HOME/bin/java when JAVA_HOME is set, else java on the PATH."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    assert java_problem({"JAVA_HOME": str(tmp_path / "jdk"), "PATH": ""}) is None
    assert java_problem({"PATH": str(java.parent)}) is None
    assert java_problem({"JAVA_HOME": str(tmp_path), "PATH": str(java.parent)}) is not None
    assert java_problem({"PATH": str(tmp_path)}) is not None


def test_local_broker_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """qmf run starts the local node; a foreign process on its AMQP port is refused before
    anything is launched (a node of its own: QMF_HOME and ports under tmp_path's)."""
    import socket

    from pipeline.broker import free_port

    base = free_port(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base))
        taken.listen()
        env = base_env(
            QMF_HOME=str(tmp_path / "home"), QMF_BROKER_PORT=str(base),
            QMF_BROKER_TLS_PORT=str(base + 1), QMF_BROKER_DIST_PORT=str(base + 2),
            QMF_BROKER_EPMD_PORT=str(base + 3),
        )  # fmt: skip
        out = qmf("run", "--duration", "1", "--data", str(tmp_path / "data"), env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().startswith(
        f"qmf run: AMQP port 127.0.0.1:{base} is already in use by another process (not node "
    )
    assert out.stderr.strip().endswith(
        "stop it or choose other ports with QMF_BROKER_PORT / QMF_BROKER_TLS_PORT / "
        "QMF_BROKER_DIST_PORT"
    )
    assert "Traceback" not in out.stderr


def test_a_failed_query_is_reported_by_its_python_cause() -> None:
    """qmf run's last line for a failed query: the Python error inside Spark's wrapper
    (the message shape of a refused login in the embedded receiver, as Spark 4.3 gives it)."""
    from pipeline.runtime.streaming import query_error

    spark_text = (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data "
        "source perform initialOffset: Traceback (most recent call last):\n"
        '  File "/work/main/pipeline/source.py", line 369, in initialOffset\n'
        "    self._ensure_receiver()\n"
        "receivers.receiver.ReceiverError: transport error (amqp://h:5672): "
        "amqp:unauthorized-access: Authentication failed [mech=PLAIN]\n"
        " SQLSTATE: 38000\n"
        "=== Streaming Query ===\n"
        "Identifier: qmf_bronze [id = 1]\n"
    )
    assert query_error(spark_text) == (
        "ReceiverError: transport error (amqp://h:5672): amqp:unauthorized-access: "
        "Authentication failed [mech=PLAIN]"
    )
    assert query_error(RuntimeError("disk gone")) == "disk gone"
