#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh Debian 12 machine (run as root, or
# with sudo available): system packages, the project virtualenv in .venv and
# the package with its test extras. A second run only checks and returns.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_pkgs=()
command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jre-headless)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
for p in libssl-dev libsasl2-dev rabbitmq-server pkg-config python3-venv openssl; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # policy-rc.d keeps Debian from starting a system-wide RabbitMQ: the
  # project runs its own node on its own ports.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ]; then
  echo "setup: installing the package and its test extras into .venv"
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e ".[test]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "setup: ready (.venv/bin/qmf)"
