"""The JARs every SparkSession loads (delta-spark), pinned in ``jars.lock``, and ours.

``tools/setup.sh`` fetches them once from Maven Central into ``jars/`` and checks
their sha256; ``get_spark`` asks :func:`delta_conf` for the settings that load them,
which checks them again, so a missing or damaged JAR is one clear set-up error at
the start, never a ``ClassNotFoundException`` in the middle of a job. Nothing here
fetches anything.

Beside them, one JAR of our own, compiled by ``tools/setup.sh`` from ``jvm/src/main/java``
(not fetched, not in ``jars.lock``): Delta's log stores that let several JVMs commit to
one table: ``ConditionalPutLogStore`` for ``s3a://`` tables (S3 conditional writes) and
``LinkingLogStore`` for local folders (a hard link per version, no process forked per
commit) (docs/DESIGN.md, "Delta commits").

``python -m pipeline.runtime.jars`` prints the same settings as a ``spark-defaults.conf``
(set-up writes it where this venv's ``spark-submit`` reads it).
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline import SetupError

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "jars.lock"
# Where the JARs live: ``jars/`` beside the lock, unless ``$QMF_JARS_DIR`` says else
# (an image that keeps them elsewhere).
JARS_ENV = "QMF_JARS_DIR"

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
_FIX = "run `bash tools/setup.sh`, which fetches and checks them"

# Our own JAR (tools/setup.sh builds it from SOURCES into the JARs' folder) and the log
# stores in it, which Delta uses for the schemes of an S3 bucket (s3a, what the pipeline
# names every bucket with, and s3) and for local folders (file).
BUILT_JAR = "qmf-delta-logstore.jar"
SOURCES = REPO / "jvm" / "src" / "main" / "java"
LOGSTORE_CLASS = "io.qmf.delta.ConditionalPutLogStore"
LOCAL_LOGSTORE_CLASS = "io.qmf.delta.LinkingLogStore"
LOGSTORE_CONF = {
    **{f"spark.delta.logStore.{s}.impl": LOGSTORE_CLASS for s in ("s3a", "s3")},
    "spark.delta.logStore.file.impl": LOCAL_LOGSTORE_CLASS,
}
_BUILD = "run `bash tools/setup.sh`, which builds it"


@dataclass(frozen=True)
class Jar:
    """One locked JAR: Maven coordinates and the sha256 of its file."""

    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    @property
    def maven_path(self) -> str:
        """Its path under a Maven repository's root."""
        group = self.group.replace(".", "/")
        return f"{group}/{self.artifact}/{self.version}/{self.file_name}"


def locked(lock: Path = LOCK) -> list[Jar]:
    """The JARs ``jars.lock`` names, in its order."""
    jars = []
    for n, line in enumerate(lock.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            coords, sha = line.split()
            group, artifact, version = coords.split(":")
        except ValueError:
            raise SetupError(
                f"{lock}:{n}: expected 'group:artifact:version sha256', got {line!r}"
            ) from None
        jars.append(Jar(group, artifact, version, sha.lower()))
    return jars


def jars_dir() -> Path:
    return Path(os.environ.get(JARS_ENV) or REPO / "jars")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_checked: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime_ns) that matched


def built_jar(folder: Path | None = None, sources: Path = SOURCES) -> Path:
    """Our own JAR, present and no older than its sources (when they are here), else
    SetupError."""
    folder = jars_dir() if folder is None else folder
    path = folder / BUILT_JAR
    try:
        built = path.stat().st_mtime_ns
    except FileNotFoundError:
        raise SetupError(f"{BUILT_JAR} is missing from {folder}: {_BUILD}") from None
    newer = [p for p in sources.rglob("*.java") if p.stat().st_mtime_ns > built]
    if newer:
        raise SetupError(
            f"{path} is older than its source {newer[0].relative_to(sources)}: {_BUILD}"
        )
    return path


def jar_paths(folder: Path | None = None, lock: Path = LOCK) -> list[Path]:
    """Every locked JAR's file, each present and matching its checksum, then our own
    (:func:`built_jar`); else SetupError.

    A file is hashed once per process while its size and mtime stay the same (10 MB:
    about 20 ms).
    """
    folder = jars_dir() if folder is None else folder
    paths = []
    for jar in locked(lock):
        path = folder / jar.file_name
        try:
            st = path.stat()
        except FileNotFoundError:
            raise SetupError(f"{jar.file_name} is missing from {folder}: {_FIX}") from None
        mark = (st.st_size, st.st_mtime_ns)
        if _checked.get(path) != mark:
            got = sha256(path)
            if got != jar.sha256:
                raise SetupError(
                    f"{path} is damaged (sha256 {got}, jars.lock says {jar.sha256}): "
                    f"delete it and {_FIX}"
                )
            _checked[path] = mark
        paths.append(path)
    paths.append(built_jar(folder))
    return paths


def _joined(existing: str | None, ours: list[str]) -> str:
    """``existing`` (a comma-separated list someone else set) with ours appended once."""
    items = [s for s in (existing or "").split(",") if s.strip()]
    return ",".join(items + [s for s in ours if s not in items])


def configured(conf: dict[str, str]) -> bool:
    """Whether ``conf`` already loads delta-spark: its extension, and a delta-spark JAR
    on ``spark.jars`` (a job installed from the wheel, submitted with the JARs of the
    cluster's own set-up, has no ``jars.lock`` to go by)."""
    extensions = conf.get("spark.sql.extensions", "").split(",")
    jars = [Path(j.strip()).name for j in conf.get("spark.jars", "").split(",")]
    return DELTA_EXTENSION in extensions and any(j.startswith("delta-spark_") for j in jars)


def _logstore_conf(existing: dict[str, str]) -> dict[str, str]:
    """Our log stores for the S3 schemes and local folders, where ``existing`` chose none
    (Delta refuses a scheme's store beside ``spark.delta.logStore.class``)."""
    if "spark.delta.logStore.class" in existing:
        return {}
    return {k: v for k, v in LOGSTORE_CONF.items() if k not in existing}


def delta_conf(
    existing: dict[str, str] | None = None, folder: Path | None = None
) -> dict[str, str]:
    """The settings that load delta-spark into a session: the JARs, Delta's SQL extension
    and its catalog, each kept beside what ``existing`` already lists; and our log stores
    for ``s3a://`` tables and local folders (Delta reads them from the session's conf
    when the JVM starts: ``spark.delta.logStore.<scheme>.impl``)."""
    existing = existing or {}
    if configured(existing):
        # spark-submit's own (this venv's spark-defaults.conf, a cluster's --jars): kept.
        # Ours are still checked when that is where they point, and our log store set
        # when its JAR is there.
        given = existing["spark.jars"].split(",")
        if LOCK.exists() and any(Path(j).parent == jars_dir() for j in given):
            jar_paths(folder)
        if any(Path(j.strip()).name == BUILT_JAR for j in given):
            return _logstore_conf(existing)
        return {}
    jars = [str(p) for p in jar_paths(folder)]
    conf = {
        "spark.jars": _joined(existing.get("spark.jars"), jars),
        "spark.sql.extensions": _joined(existing.get("spark.sql.extensions"), [DELTA_EXTENSION]),
    }
    catalog = existing.get("spark.sql.catalog.spark_catalog")
    if catalog is None:
        conf["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    conf.update(_logstore_conf(existing))
    return conf


def spark_defaults() -> str:
    """``delta_conf`` as a ``spark-defaults.conf``."""
    lines = [
        "# Written by tools/setup.sh from jars.lock (pipeline/runtime/jars.py): Delta for spark-submit."
    ]
    lines += [f"{k} {v}" for k, v in delta_conf().items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.stdout.write(spark_defaults())
    except SetupError as e:
        sys.exit(f"jars: ERROR: {e}")
