"""A real S3 server on loopback for the tests: versitygw over a temporary folder.

Built by ``tools/setup.sh --s3-server`` (``tools/test.sh`` asks for it) at the version
``s3-server.lock`` pins. Each server has its own port, folder and root credentials;
``stop()`` kills it (a store that goes down), ``start()`` brings it back on the same
port and folder (the store comes back with what it held).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pipeline.broker import free_port

REPO = Path(__file__).resolve().parents[1]


def server_binary() -> Path:
    """The built server: ``.qmf/bin/versitygw-<version>`` of ``s3-server.lock``."""
    lines = [ln for ln in (REPO / "s3-server.lock").read_text().splitlines() if ln and not ln.startswith("#")]
    version = lines[0].split()[1]
    path = REPO / ".qmf" / "bin" / f"versitygw-{version}"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `bash tools/setup.sh --s3-server`")
    return path



class S3Server:
    """One versitygw process: ``endpoint`` (http://127.0.0.1:PORT), root ``access_key``
    and ``secret_key``, objects kept under ``folder`` (a bucket is a folder in it)."""

    def __init__(self, folder: Path, region: str = "us-east-1") -> None:
        self.folder = folder
        self.region = region
        self.port = free_port()
        self.access_key = "qmf" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(24)
        self.log = folder.parent / f"{folder.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> S3Server:
        env = {**os.environ, "ROOT_ACCESS_KEY_ID": self.access_key,
               "ROOT_SECRET_ACCESS_KEY": self.secret_key}  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(server_binary()), "--port", f"127.0.0.1:{self.port}",
                 "--region", self.region, "posix", str(self.folder)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"versitygw exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"versitygw did not answer on {self.endpoint}")
            time.sleep(0.05)
        return self

    def answers(self) -> bool:
        """The server answers HTTP (an anonymous request is refused, with a status)."""
        try:
            urllib.request.urlopen(self.endpoint, timeout=1).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def make_bucket(self, name: str) -> str:
        """Create the bucket through the S3 API (pyarrow's S3 client); its name."""
        from pyarrow import fs

        self.filesystem(allow_bucket_creation=True).create_dir(name)
        assert self.filesystem().get_file_info(name).type == fs.FileType.Directory
        return name

    def filesystem(self, *, allow_bucket_creation: bool = False) -> object:
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key, secret_key=self.secret_key, region=self.region,
            endpoint_override=self.endpoint, allow_bucket_creation=allow_bucket_creation,
        )  # fmt: skip

    def configure(self, spark: Any, bucket: str, secret: str | None = None) -> None:
        """S3A's per-bucket settings in a running session (its JVM started before this
        server, so the variables cannot reach it): what ``S3Settings`` gives, and the
        bucket's keys (``secret``: a wrong one, to be refused)."""
        from pipeline.lake.storage import S3Settings

        conf = spark.sparkContext._jsc.hadoopConfiguration()
        prefix = "spark.hadoop.fs.s3a."
        for key, value in S3Settings.from_env(self.env()).spark_conf().items():
            conf.set(f"fs.s3a.bucket.{bucket}.{key[len(prefix):]}", value)
        conf.set(f"fs.s3a.bucket.{bucket}.access.key", self.access_key)
        conf.set(f"fs.s3a.bucket.{bucket}.secret.key", self.secret_key if secret is None else secret)

    def env(self) -> dict[str, str]:
        """The standard variables a process of the pipeline finds the store by."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
        }
