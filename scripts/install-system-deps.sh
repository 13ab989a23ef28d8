#!/usr/bin/env bash
# Installs the Debian packages the test suite runs for real: a Prometheus server and promtool, openssl, and a
# Slurm controller, node daemon and client tools with MUNGE (the Slurm actuator's tests start a private
# throw-away cluster). As root it installs what is missing; otherwise it only says what is missing, and
# the tests that need those parts fail in CI (CI=true) rather than skip.
set -euo pipefail

packages=()
command -v prometheus >/dev/null 2>&1 || packages+=(prometheus)
# slurm-wlm pulls in slurmctld, slurmd and slurm-client (scontrol, sbatch, squeue, sinfo).
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
  || ! command -v scontrol >/dev/null 2>&1 || ! command -v sbatch >/dev/null 2>&1; then
  packages+=(slurm-wlm)
fi
command -v munged >/dev/null 2>&1 || packages+=(munge)
# The security tests make their own CA and certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || packages+=(openssl)

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

# Debian's packages may start system services: a Prometheus on :9090, a munged on the default socket,
# and slurmctld/slurmd. The tests start their own private ones, so stop the system copies. Under systemd
# ask systemctl; in a container without systemd the packages' init scripts are what started them.
stop_service() {
  local service=$1
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-active --quiet "$service" 2>/dev/null; then
      systemctl stop "$service" || true
    fi
  elif [ -x "/etc/init.d/$service" ]; then
    if "/etc/init.d/$service" status >/dev/null 2>&1; then
      "/etc/init.d/$service" stop >/dev/null 2>&1 || true
    fi
  fi
}
for service in prometheus slurmctld slurmd munge; do
  stop_service "$service"
done
