#!/usr/bin/env bash
# Start a local munged for the QRMI tests (docs/qrmi.md), idempotently: a munged that already
# answers (e.g. started by scripts/slurm-local.sh) is left alone. Installs the Debian package when
# it is missing under CI=true (or MUNGE_INSTALL=1), never silently on a developer's machine.
# Usage: scripts/munge-local.sh start|status
set -euo pipefail

answers() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if command -v munge >/dev/null && command -v unmunge >/dev/null && answers; then
      exit 0
    fi
    if [ "$(id -u)" != 0 ]; then
      echo "munged is not answering and starting it needs root" >&2
      exit 1
    fi
    if ! command -v munged >/dev/null && [ ! -x /usr/sbin/munged ]; then
      if [ "${CI:-}" != true ] && [ "${MUNGE_INSTALL:-}" != 1 ]; then
        echo "munge is not installed (apt-get install munge, or MUNGE_INSTALL=1 $0 start)" >&2
        exit 1
      fi
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends munge >/dev/null
    fi
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    chown munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
    [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    # --force: a stale socket or pid file from a killed munged must not stop the start.
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 40); do
      answers && exit 0
      sleep 0.25
    done
    echo "munged does not answer (see /var/log/munge)" >&2
    exit 1
    ;;
  status)
    answers && echo "munged answering" || { echo "munged not answering"; exit 1; }
    ;;
  *)
    echo "usage: $0 start|status" >&2
    exit 2
    ;;
esac
