#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh Debian 12 machine (run as root, or
# with sudo available): system packages, the project virtualenv in .venv and
# the package with its test extras. A second run only checks and returns
# (dpkg queries and one stamp file: well under a second).
#
# Usage: bash tools/setup.sh             # as above, from requirements.lock
#        bash tools/setup.sh --jupyter   # and JupyterLab, from requirements-jupyter.lock
#                                        # (kept in step by later runs once installed)
#        bash tools/setup.sh --s3-server # and the S3 server the tests start (versitygw,
#                                        # built from its public sources with Go; tools/test.sh)
#
# Environment:
#   PYTHON=/path/to/python3.11+   interpreter for .venv (default: python3)
#   QMF_SETUP_SKIP_APT=1          never touch system packages (CI images, no root)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

log() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

jupyter=""
s3_server=""
for arg in "$@"; do
  case "$arg" in
    --jupyter) jupyter=1 ;;
    --s3-server) s3_server=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (see bash tools/setup.sh --help)" ;;
  esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  . /etc/os-release
  if [ "${ID:-}" != "debian" ] || [ "${VERSION_ID:-}" != "12" ]; then
    log "note: written for Debian 12, this is ${PRETTY_NAME:-unknown}; continuing"
  fi
fi

PY="${PYTHON:-python3}"

# --- system packages ---------------------------------------------------------
java_ok() {
  # pyspark 4 needs Java 17+; `java -version` prints e.g. 'openjdk version "17.0.13"'.
  command -v java >/dev/null 2>&1 || return 1
  local v
  v="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
  [ -n "$v" ] && [ "$v" -ge 17 ]
}

# Our own JVM classes (jvm/: Delta's log store for S3 buckets) are compiled into
# jars/qmf-delta-logstore.jar here, whenever a source is newer than the JAR: javac then.
logstore_jar="jars/qmf-delta-logstore.jar"
logstore_stale() {
  [ ! -f "$logstore_jar" ] \
    || [ -n "$(find jvm/src/main/java -name '*.java' -newer "$logstore_jar" -print -quit)" ] \
    || [ jars.lock -nt "$logstore_jar" ]
}

need_pkgs=()
java_ok || need_pkgs+=(openjdk-17-jre-headless)
if logstore_stale && ! command -v javac >/dev/null 2>&1; then
  need_pkgs+=(openjdk-17-jdk-headless)
fi
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
# libssl-dev/libsasl2-dev/pkg-config: python-qpid-proton builds from source here.
# libsasl2-modules: proton links Cyrus SASL, which needs it for PLAIN.
# openssl: the broker's TLS certificates. rabbitmq-server: the local node.
# prometheus: the tests' real Prometheus and promtool (the alert rules, docs/alerts.md).
pkgs=(libssl-dev libsasl2-dev libsasl2-modules pkg-config openssl ca-certificates
      rabbitmq-server prometheus)
if [ -z "${PYTHON:-}" ]; then
  # Debian's python3 needs venv support and headers (proton's C extension).
  pkgs+=(python3 python3-venv python3-dev)
fi
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || need_pkgs+=("$p")
done

if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ -n "${QMF_SETUP_SKIP_APT:-}" ]; then
    die "missing system packages (${need_pkgs[*]}) and QMF_SETUP_SKIP_APT is set"
  fi
  if [ -n "$SUDO" ] && ! command -v sudo >/dev/null 2>&1; then
    die "need root or sudo to install: ${need_pkgs[*]}"
  fi
  log "installing system packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_opts=(-o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
  # policy-rc.d keeps Debian from starting a system-wide RabbitMQ (or Prometheus)
  # during the install: the project runs its own on its own ports (qmf broker start,
  # the tests' Prometheus).
  # Only a file we create is removed again.
  made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    made_policy=1
    trap '[ -n "$made_policy" ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get "${apt_opts[@]}" update -qq
  $SUDO apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${need_pkgs[@]}" \
    >/dev/null
  java_ok || die "Java 17+ is still not the default java; check update-alternatives"
fi
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1 \
  || die "rabbitmq-server is not installed"

# --- virtualenv ----------------------------------------------------------------
command -v "$PY" >/dev/null 2>&1 || die "python interpreter '$PY' not found"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || die "$PY is $("$PY" -V 2>&1); Python >= 3.11 is required (set PYTHON=...)"

# Concurrent runs (parallel test sessions) must not pip-install at once.
mkdir -p .qmf
exec 9>.qmf/setup.lock
flock -w 900 9 || die "timed out waiting for another tools/setup.sh run"

# A venv whose interpreter vanished (Python upgraded) or that lacks pip (its
# creation was interrupted) is rebuilt.
if [ -e .venv ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  log "existing .venv is broken; recreating it"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $("$PY" -V 2>&1)"
  "$PY" -m venv .venv
fi

# Installed for this pyproject.toml, and the editable install points at this
# checkout (checked from / so the cwd does not shadow it)?
installed_here() {
  (cd / && "$here/.venv/bin/python" -c '
import sys, pathlib, pipeline, proton
sys.exit(0 if pathlib.Path(pipeline.__file__).resolve().is_relative_to(sys.argv[1]) else 1)
' "$here") >/dev/null 2>&1
}
# Every Python dependency comes from requirements.lock: exact versions, sha256
# hashes (bash tools/lock.sh regenerates it; docs/install.md). The stamp is a
# hash of the lock and pyproject.toml, so a changed lock reinstalls.
lock="requirements.lock"
jlock="requirements-jupyter.lock"
[ -f "$lock" ] || die "$lock is missing (bash tools/lock.sh makes it)"
stamp=".venv/.installed-$(cat pyproject.toml "$lock" | sha1sum | cut -c1-12)"
# JupyterLab, once installed (--jupyter), stays in step with the locks on later runs.
if compgen -G ".venv/.jupyter-installed-*" >/dev/null; then jupyter=1; fi
pip_install=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if [ ! -f "$stamp" ] || ! installed_here; then
  log "installing the locked dependencies ($lock) and the package into .venv"
  # 1. pip/setuptools/wheel at their locked versions first: a new venv's bundled
  #    pip is older than --build-constraint (pip 25.3) needs.
  awk '/^[A-Za-z0-9]/ { keep = ($0 ~ /^(pip|setuptools|wheel)==/) } keep' "$lock" \
    >.qmf/setup-tools.lock
  "${pip_install[@]}" --require-hashes --no-deps -r .qmf/setup-tools.lock
  # 2. Everything else, hash-checked. Packages that come as sources only
  #    (pyspark, python-qpid-proton) build with the locked setuptools and cffi.
  grep -oE '^[A-Za-z0-9._-]+==[^ ]+' "$lock" >.qmf/build-constraints.txt
  "${pip_install[@]}" --require-hashes --build-constraint .qmf/build-constraints.txt -r "$lock"
  # 3. The project itself, editable, with no dependency resolution of its own
  #    and built with the setuptools/wheel just installed (without setuptools'
  #    generic "Editable installation" warning).
  PYTHONWARNINGS="ignore::UserWarning" "${pip_install[@]}" --no-deps --no-build-isolation -e .
  installed_here || die "the package does not import from .venv; see pip's output above"
  # An older .venv may hold packages the lock no longer lists: say so, keep them
  # (JupyterLab's, from the jupyter lock, are expected).
  extra="$(comm -23 \
    <(.venv/bin/python -m pip freeze --exclude-editable | grep -v '^#' | sed 's/[=@ ].*//' \
      | tr 'A-Z_.' 'a-z--' | sort -u) \
    <(cat .qmf/build-constraints.txt "$jlock" 2>/dev/null | grep -oE '^[A-Za-z0-9._-]+==' \
      | sed 's/==$//' | tr 'A-Z_.' 'a-z--' | sort -u))"
  if [ -n "$extra" ]; then
    log "note: .venv also holds packages $lock does not list: $(echo $extra)"
  fi
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# JupyterLab: requirements-jupyter.lock holds requirements.lock's pins (as constraints)
# plus the `jupyter` extra, so this adds packages and changes none already installed.
if [ -n "$jupyter" ]; then
  [ -f "$jlock" ] || die "$jlock is missing (bash tools/lock.sh makes it)"
  jstamp=".venv/.jupyter-installed-$(cat pyproject.toml "$lock" "$jlock" | sha1sum | cut -c1-12)"
  if [ ! -f "$jstamp" ] || [ ! -x .venv/bin/jupyter-lab ]; then
    log "installing JupyterLab ($jlock) into .venv"
    grep -oE '^[A-Za-z0-9._-]+==[^ ]+' "$jlock" >.qmf/build-constraints-jupyter.txt
    "${pip_install[@]}" --require-hashes --build-constraint .qmf/build-constraints-jupyter.txt \
      -r "$jlock"
    .venv/bin/jupyter lab --version >/dev/null || die "jupyter lab does not run from .venv"
    rm -f .venv/.jupyter-installed-*
    touch "$jstamp"
  fi
  log "$(grep -oE '^jupyterlab==[^ ]+' "$jlock"): QMF_DATA=\$PWD/data .venv/bin/jupyter lab notebooks/"
fi
# Spark puts its own pyspark.zip and py4j zip first on its Python processes' path (its
# workers, data source planners, streaming source runners). A zip holds no bytecode, so
# each such process compiled pyspark from source: about 0.65 CPU-s per process, a
# dozen and more per query start. This .pth moves those two zips, which ship inside the
# installed pyspark (the same code), after site-packages, whose pyspark is compiled
# (docs/DESIGN.md, "Conventions"; docs/performance-log.md, 2026-12-01).
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cmp -s tools/qmf-pyspark-path.pth "$site/qmf-pyspark-path.pth" \
  || cp tools/qmf-pyspark-path.pth "$site/qmf-pyspark-path.pth"

# --- JARs (jars.lock) ------------------------------------------------------------
# delta-spark's JARs, fetched once from Maven Central into jars/ and checked against
# the sha256 in jars.lock (a run fetches nothing; pipeline/runtime/jars.py checks them again
# before each session). $QMF_MAVEN_REPO points at a mirror; without curl's access,
# Maven's own resolver (mvn dependency:copy) is tried.
maven_repo="${QMF_MAVEN_REPO:-https://repo.maven.apache.org/maven2}"
mkdir -p jars
while read -r coords sha; do
  case "$coords" in ''|'#'*) continue ;; esac
  IFS=: read -r group artifact version <<<"$coords"
  file="jars/$artifact-$version.jar"
  if [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$sha" ]; then continue; fi
  log "fetching $coords into jars/"
  rm -f "$file" "$file.part"
  url="$maven_repo/${group//.//}/$artifact/$version/$artifact-$version.jar"
  if ! curl -fsSL --retry 3 -o "$file.part" "$url" 2>.qmf/jar-fetch.log; then
    command -v mvn >/dev/null 2>&1 \
      || die "could not fetch $url ($(cat .qmf/jar-fetch.log)) and mvn is not installed"
    mvn -q dependency:copy -Dartifact="$coords" -DoutputDirectory=jars \
      -Dmdep.overWriteReleases=true >.qmf/jar-fetch.log 2>&1 \
      || die "could not fetch $coords from $url nor with mvn: $(tail -5 .qmf/jar-fetch.log)"
    mv "$file" "$file.part"
  fi
  got="$(sha256sum "$file.part" | cut -d' ' -f1)"
  [ "$got" = "$sha" ] || { rm -f "$file.part"; die "$coords: sha256 $got, jars.lock says $sha"; }
  mv "$file.part" "$file"
done < jars.lock
spark_home="$(.venv/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
# Our own JAR, built here from jvm/src/main/java (not fetched, not in jars.lock):
# Delta's log stores for s3a:// tables and local folders that several JVMs commit to
# (docs/DESIGN.md, "Delta commits"). Compiled against delta-storage and Spark's
# Hadoop client; rebuilt only when a source (or jars.lock) is newer than the JAR.
if logstore_stale; then
  log "building $logstore_jar from jvm/src/main/java"
  command -v javac >/dev/null 2>&1 || die "javac (JDK 17+) is needed to build $logstore_jar"
  storage_jar="jars/$(sed -n 's/^io\.delta:\(delta-storage\):\([^ ]*\) .*/\1-\2.jar/p' jars.lock)"
  [ -f "$storage_jar" ] || die "jars.lock names no delta-storage JAR to build $logstore_jar against"
  build=".qmf/jvm-build"
  rm -rf "$build"
  mkdir -p "$build/classes"
  find jvm/src/main/java -name '*.java' >"$build/sources.txt"
  javac --release 17 -Xlint:all,-path -Werror -d "$build/classes" \
    -cp "$storage_jar:$spark_home/jars/*" @"$build/sources.txt" >"$build/javac.log" 2>&1 \
    || die "compiling jvm/src/main/java failed: $(tail -20 "$build/javac.log")"
  jar --create --file "$build/out.jar" -C "$build/classes" . \
    || die "could not package $logstore_jar"
  mv "$build/out.jar" "$logstore_jar"
  rm -rf "$build"
fi
# This venv's spark-submit reads $SPARK_HOME/conf/spark-defaults.conf (SPARK_HOME: the
# installed pyspark): jobs submitted with it load Delta as get_spark's sessions do.
mkdir -p "$spark_home/conf"
.venv/bin/python -m pipeline.runtime.jars >.qmf/spark-defaults.conf || die "the JARs do not check out"
cmp -s .qmf/spark-defaults.conf "$spark_home/conf/spark-defaults.conf" \
  || cp .qmf/spark-defaults.conf "$spark_home/conf/spark-defaults.conf"

# --- the S3 server of the tests (--s3-server) -----------------------------------------
# versitygw (Apache-2.0), a real S3 server over a local folder, built once from its
# public sources through the Go module proxy at the version s3-server.lock pins, whose
# module checksum Go checks against that file (and sum.golang.org). The tests start it
# on loopback (tests/s3server.py); nothing in the pipeline needs it.
if [ -n "$s3_server" ]; then
  read -r s3_module s3_version s3_sum < <(grep -v '^#' s3-server.lock | grep .)
  s3_bin=".qmf/bin/versitygw-$s3_version"
  if [ ! -x "$s3_bin" ]; then
    go_bin="$(command -v go || echo /usr/local/go/bin/go)"
    [ -x "$go_bin" ] || die "--s3-server needs Go 1.25+ (https://go.dev/dl/) to build $s3_module"
    log "building $s3_module@$s3_version (the tests' S3 server; a few minutes the first time)"
    got="$("$go_bin" mod download -json "$s3_module@$s3_version" 2>.qmf/s3-build.log \
      | sed -n 's/.*"Sum": "\(.*\)".*/\1/p')"
    [ "$got" = "$s3_sum" ] || die "$s3_module@$s3_version: module sum '$got', s3-server.lock says $s3_sum ($(tail -3 .qmf/s3-build.log))"
    mkdir -p .qmf/bin
    GOBIN="$here/.qmf/bin/build" GOFLAGS=-buildvcs=false \
      "$go_bin" install "$s3_module/cmd/versitygw@$s3_version" >>.qmf/s3-build.log 2>&1 \
      || die "building versitygw failed: $(tail -5 .qmf/s3-build.log)"
    mv .qmf/bin/build/versitygw "$s3_bin"
    rmdir .qmf/bin/build 2>/dev/null || true
  fi
fi
log "ready (.venv/bin/qmf; local broker: .venv/bin/qmf broker start)"
