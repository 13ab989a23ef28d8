#!/usr/bin/env bash
# Installs the Debian packages the test suite runs for real (a Prometheus server and promtool).
# As root it installs what is missing; otherwise it only says what is missing, and the tests that
# need those parts fail in CI (CI=true) rather than skip.
set -euo pipefail

packages=()
command -v prometheus >/dev/null 2>&1 || packages+=(prometheus)

if [ ${#packages[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: missing ${packages[*]}; run 'make test' as root or install them (apt-get install ${packages[*]})" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# An update only when the package lists are empty or stale (older than a day).
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n 1)" ]; then
  apt-get update -q
fi
apt-get install -y -q --no-install-recommends "${packages[@]}"
# Debian's package may start a system Prometheus on :9090; the tests start their own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
fi
