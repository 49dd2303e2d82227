"""A real Spark standalone cluster for the tests: one master and two workers, each its own
process started from the installed Spark's launch class (``bin/spark-class``), as an
operator starts them (``sbin/start-master.sh`` runs the same classes).

Each worker offers one core and 1 GiB and keeps its executors' folders and logs under
its own work folder. A worker's environment is what its executors get (with the
application's ``spark.executorEnv.*``): a store's credentials are given to the workers
here, as a cluster's nodes have their own (an instance role, their environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pipeline.broker import free_port
from pipeline.spark import QUICK_JIT

SPARK_CLASS = str(Path(sys.executable).parent / "spark-class")


class StandaloneCluster:
    """``url`` (spark://127.0.0.1:PORT) once ``start`` returned; ``stop`` kills all."""

    def __init__(self, folder: Path, workers: int = 2, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.workers = workers
        self.env = {**os.environ, **(env or {})}
        self.env.pop("PYSPARK_GATEWAY_PORT", None)
        self.env.pop("PYSPARK_GATEWAY_SECRET", None)
        # The daemons on C1 only and small heaps: two cores serve them and the jobs.
        self.env["SPARK_DAEMON_JAVA_OPTS"] = QUICK_JIT
        self.env["SPARK_DAEMON_MEMORY"] = "256m"
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str]) -> None:
        log = (self.folder / f"{name}.log").open("ab")
        self.procs.append(subprocess.Popen(
            [SPARK_CLASS, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env,
            cwd=self.folder, start_new_session=True,
        ))  # fmt: skip

    def start(self, timeout_s: float = 120.0) -> StandaloneCluster:
        self._start("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port),
        ])  # fmt: skip
        for i in range(self.workers):
            work = self.folder / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._start(f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                "--cores", "1", "--memory", "1g", "--work-dir", str(work),
                "--webui-port", str(free_port()),
            ])  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a cluster process exited {p.returncode}: {self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.alive_workers()} of {self.workers} workers registered: {self.logs()}")
            time.sleep(0.5)
        return self

    def alive_workers(self) -> int:
        """Workers the master counts alive (its JSON status page)."""
        import json

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                status = json.loads(r.read())
        except OSError:
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.folder.glob("*.log"))
        )

    def stop(self) -> None:
        import signal

        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait(30)
        self.procs = []
