"""pipeline.runtime.jars: the locked JARs are checked before a session starts (no Spark here)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pipeline import SetupError
from pipeline.runtime import jars as pj


def _lock(tmp: Path, content: bytes) -> tuple[Path, Path]:
    folder = tmp / "jars"
    folder.mkdir()
    (folder / "demo-1.0.jar").write_bytes(content)
    (folder / pj.BUILT_JAR).write_bytes(b"our own, built by tools/setup.sh")
    lock = tmp / "jars.lock"
    sha = hashlib.sha256(b"the real jar").hexdigest()
    lock.write_text(f"# a comment\n\norg.example:demo:1.0 {sha}  # trailing\n")
    return folder, lock


# The object-storage JARs after Delta's: hadoop-aws at Spark's Hadoop, the SDK's modules.
S3_JARS = [
    ("org.apache.hadoop", "hadoop-aws", "3.5.0"), ("org.reactivestreams", "reactive-streams", "1.0.4"),
    *(("software.amazon.awssdk", a, "2.35.4") for a in (
        "annotations", "apache-client", "arns", "auth", "aws-core", "aws-query-protocol",
        "aws-xml-protocol", "checksums-spi", "checksums", "crt-core", "endpoints-spi",
        "http-auth-aws-eventstream", "http-auth-aws", "http-auth-spi", "http-auth",
        "http-client-spi", "identity-spi", "json-utils", "metrics-spi", "netty-nio-client",
        "profiles", "protocol-core", "regions", "retries-spi", "retries",
        "s3-transfer-manager", "s3", "sdk-core", "sts", "third-party-jackson-core",
        "utils-lite", "utils",
    )),
    ("software.amazon.eventstream", "eventstream", "1.0.1"),
    ("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1"),
]  # fmt: skip
JAR_NAMES = ["delta-spark_2.13-4.4.0.jar", "delta-storage-4.4.0.jar",
             *(f"{a}-{v}.jar" for _g, a, v in S3_JARS), "qmf-delta-logstore.jar"]  # fmt: skip
LOGSTORE = {"spark.delta.logStore.s3a.impl": "io.qmf.delta.ConditionalPutLogStore",
            "spark.delta.logStore.s3.impl": "io.qmf.delta.ConditionalPutLogStore",
            "spark.delta.logStore.file.impl": "io.qmf.delta.LinkingLogStore"}  # fmt: skip


def test_the_repo_lock_names_delta_spark_and_delta_storage() -> None:
    got = [(j.group, j.artifact, j.version) for j in pj.locked()]
    assert got == [
        ("io.delta", "delta-spark_2.13", "4.4.0"), ("io.delta", "delta-storage", "4.4.0"), *S3_JARS,
    ]  # fmt: skip
    assert pj.locked()[0].maven_path == "io/delta/delta-spark_2.13/4.4.0/delta-spark_2.13-4.4.0.jar"
    assert all(len(j.sha256) == 64 for j in pj.locked())


def test_installed_jars_match_the_lock() -> None:
    paths = pj.jar_paths()
    assert [p.name for p in paths] == JAR_NAMES


def test_a_good_jar_passes(tmp_path: Path) -> None:
    folder, lock = _lock(tmp_path, b"the real jar")
    assert pj.jar_paths(folder, lock) == [folder / "demo-1.0.jar", folder / pj.BUILT_JAR]


def test_a_damaged_jar_is_one_clear_setup_error(tmp_path: Path) -> None:
    folder, lock = _lock(tmp_path, b"the real jar, truncated?")
    with pytest.raises(
        SetupError, match=r"demo-1.0.jar is damaged .*delete it and run `bash tools/setup.sh`"
    ):
        pj.jar_paths(folder, lock)


def test_a_jar_damaged_after_a_good_check_is_caught(tmp_path: Path) -> None:
    folder, lock = _lock(tmp_path, b"the real jar")
    pj.jar_paths(folder, lock)
    (folder / "demo-1.0.jar").write_bytes(b"the real jax")  # same size, new mtime
    with pytest.raises(SetupError, match="is damaged"):
        pj.jar_paths(folder, lock)


def test_a_missing_jar_is_one_clear_setup_error(tmp_path: Path) -> None:
    folder, lock = _lock(tmp_path, b"the real jar")
    (folder / "demo-1.0.jar").unlink()
    with pytest.raises(
        SetupError, match=r"^demo-1.0.jar is missing from .*: run `bash tools/setup.sh`"
    ):
        pj.jar_paths(folder, lock)


def test_our_built_jar_missing_or_older_than_its_source_is_one_clear_setup_error(
    tmp_path: Path,
) -> None:
    folder, lock = _lock(tmp_path, b"the real jar")
    sources = tmp_path / "java"
    (sources / "io" / "qmf").mkdir(parents=True)
    source = sources / "io" / "qmf" / "Store.java"
    source.write_text("class Store {}")
    built = folder / pj.BUILT_JAR
    os.utime(source, ns=(built.stat().st_mtime_ns - 10**9,) * 2)
    assert pj.built_jar(folder, sources) == built
    os.utime(source, ns=(built.stat().st_mtime_ns + 10**9,) * 2)  # edited since the build
    fix = r"run `bash tools/setup.sh`, which builds it$"
    with pytest.raises(
        SetupError, match=rf"logstore.jar is older than its source io/qmf/Store.java: {fix}"
    ):
        pj.built_jar(folder, sources)
    built.unlink()
    with pytest.raises(SetupError, match=rf"^qmf-delta-logstore.jar is missing from .*: {fix}"):
        pj.jar_paths(folder, lock)


def test_a_bad_lock_line_names_its_line(tmp_path: Path) -> None:
    lock = tmp_path / "jars.lock"
    lock.write_text("io.delta:delta-spark 1234\n")
    with pytest.raises(SetupError, match=r"jars.lock:1: expected 'group:artifact:version sha256'"):
        pj.locked(lock)


def test_delta_conf_keeps_what_others_set() -> None:
    conf = pj.delta_conf(
        {"spark.jars": "/opt/x.jar", "spark.sql.extensions": "com.example.Ext",
         "spark.sql.catalog.spark_catalog": "com.example.Catalog"},
    )  # fmt: skip
    jars = conf["spark.jars"].split(",")
    assert jars[0] == "/opt/x.jar" and [Path(j).name for j in jars[1:]] == JAR_NAMES
    assert conf["spark.sql.extensions"] == f"com.example.Ext,{pj.DELTA_EXTENSION}"
    assert "spark.sql.catalog.spark_catalog" not in conf  # theirs is kept
    assert {k: conf[k] for k in LOGSTORE} == LOGSTORE  # our log stores: buckets, folders
    assert pj.configured(conf) and pj.delta_conf(conf) == {}  # nothing added twice
    # A log store someone chose is kept: per scheme, or one for all (which Delta refuses
    # beside a scheme's).
    theirs = pj.delta_conf({"spark.delta.logStore.s3a.impl": "com.example.Store"})
    assert theirs["spark.delta.logStore.s3.impl"] == pj.LOGSTORE_CLASS
    assert "spark.delta.logStore.s3a.impl" not in theirs
    one = pj.delta_conf({"spark.delta.logStore.class": "com.example.Store"})
    assert not any(k.startswith("spark.delta.logStore.") for k in one)


def test_spark_defaults_lists_the_settings() -> None:
    text = pj.spark_defaults().splitlines()
    assert text[1].startswith("spark.jars /")
    assert [Path(j).name for j in text[1].split(" ", 1)[1].split(",")] == JAR_NAMES
    assert text[2:] == [
        f"spark.sql.extensions {pj.DELTA_EXTENSION}",
        f"spark.sql.catalog.spark_catalog {pj.DELTA_CATALOG}",
        *(f"{k} {v}" for k, v in LOGSTORE.items()),
    ]


def test_a_session_configured_for_delta_elsewhere_is_kept() -> None:
    """spark-submit of a job installed from the wheel: the cluster's own Delta JARs
    and extension are kept, and nothing is asked of jars.lock."""
    theirs = {"spark.jars": "/opt/spark/extra/delta-spark_2.13-4.4.0.jar,/opt/x.jar",
              "spark.sql.extensions": f"com.example.Ext,{pj.DELTA_EXTENSION}"}  # fmt: skip
    assert pj.configured(theirs)
    assert pj.delta_conf(theirs) == {}
    assert not pj.configured({"spark.jars": theirs["spark.jars"]})  # no extension
    assert not pj.configured({"spark.sql.extensions": pj.DELTA_EXTENSION})  # no JAR
    ours = pj.delta_conf({})
    assert pj.configured(ours) and pj.delta_conf(ours) == {}
    # Our JARs given (an older spark-defaults.conf) without the log store: it is added.
    older = {k: v for k, v in ours.items() if k not in LOGSTORE}
    assert pj.delta_conf(older) == LOGSTORE
