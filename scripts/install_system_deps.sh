#!/usr/bin/env bash
# Install the real services the tests start from Debian packages: Slurm, munge and sshd (isolation
# lab), Chromium (the approval form in a real browser), PostgreSQL (Prefect server as in production)
# and Prometheus Alertmanager (real alert delivery). Idempotent and quick when everything is there.
# Needs root (CI and dev machines are root).
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v scontrol >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_system_deps: need root to apt-get install ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
