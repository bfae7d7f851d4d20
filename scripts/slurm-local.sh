#!/usr/bin/env bash
# slurm-local.sh start|stop|status — an idempotent single-node Slurm cluster for tests and CI.
#
# Debian 12 (Slurm 22.05), no systemd, run as root. `start` installs the packages with apt when
# they are missing, writes /etc/slurm/slurm.conf, starts munged, slurmctld and slurmd and waits
# until the node takes jobs. Safe to re-run: running daemons are kept unless the config changed.
#
# Tuned for tests, not production:
# - MinJobAge is short (SLURM_LOCAL_MIN_JOB_AGE, default 5 s) so a finished job leaves
#   slurmctld quickly and the backend's sacct path is exercised. slurmctld purges old jobs on a
#   fixed ~60 s cycle, so "aged out" still takes up to a minute after the job ends.
# - No accounting daemon: finished jobs are recorded by jobcomp/filetxt, which `sacct -c` reads.
# Env: SLURM_LOCAL_CPUS (default nproc; more than nproc oversubscribes via config_overrides),
#      SLURM_LOCAL_REST_PORT (default 0 = no slurmrestd; e.g. 6820 for REST-based backends),
#      SLURM_LOCAL_ACCOUNTING=1: a SECOND, independent cluster "gridgate-acct" as sites with
#      accounting run it: slurmdbd + MariaDB (local socket, root with an empty password creates
#      a socket-authenticated `slurm` database user), JobCompType=jobcomp/none (so `sacct -c`
#      is refused and finished jobs are only in plain `sacct`). It has its own configuration
#      (/etc/slurm-acct, select it with SLURM_CONF=/etc/slurm-acct/slurm.conf), ports
#      (6827 slurmctld, 6828 slurmd, 6829 slurmdbd), state, logs and node name, so it runs
#      beside the default cluster without touching it.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
NODE=$(hostname -s)
NPROC=$(nproc)
CPUS=${SLURM_LOCAL_CPUS:-$NPROC}
MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-5}
PORT=${SLURM_LOCAL_REST_PORT:-0}
ACCOUNTING=${SLURM_LOCAL_ACCOUNTING:-0}
if [ "$ACCOUNTING" = 1 ]; then
  PORT=0 # no slurmrestd on the accounting cluster
  CLUSTER=gridgate-acct
  NODENAME=acct-$NODE
  ETC=/etc/slurm-acct
  RUN=/run/slurm-acct
  LOG=/var/log/slurm-acct
  STATE=/var/spool/slurmctld-acct
  SPOOL=/var/spool/slurmd-acct
  DB=gridgate_slurm_acct
  NODEHOST=" NodeHostname=$NODE"
  ACCT=$'SlurmctldPort=6827\nSlurmdPort=6828\nAccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\nAccountingStoragePort=6829\nJobCompType=jobcomp/none'
else
  CLUSTER=gridgate-ci
  NODENAME=$NODE
  ETC=/etc/slurm
  RUN=/run/slurm
  LOG=/var/log/slurm
  STATE=/var/spool/slurmctld
  SPOOL=/var/spool/slurmd
  NODEHOST=""
  ACCT="AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log"
fi
KEY=$STATE/jwt_hs256.key
CONF=$ETC/slurm.conf
export SLURM_CONF=$CONF # every client and daemon below talks to this cluster

# In containers PID 1 may reap late: a dead daemon lingers as a zombie, so `kill -0` is not
# enough to call it alive. Check the state letter and the command name too.
alive() {
  local p
  p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] && [ -r "/proc/$p/stat" ] || return 1
  [ "$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$p/stat" 2>/dev/null)" != Z ] &&
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]
}

pidfile() { if [ "$1" = munged ]; then echo /run/munge/munged.pid; else echo "$RUN/$1.pid"; fi; }

stop_daemon() {
  local f p
  f=$(pidfile "$1")
  alive "$f" "$1" || { rm -f "$f"; return 0; }
  p=$(cat "$f")
  kill "$p" || true
  for _ in $(seq 60); do alive "$f" "$1" || break; sleep 0.25; done
  if alive "$f" "$1"; then kill -9 "$p" || true; fi
  rm -f "$f"
}

install_packages() {
  local need="" f pkgs="slurmctld slurmd slurm-client munge"
  for f in sbin/slurmctld sbin/slurmd bin/sbatch bin/sacct sbin/munged; do [ -x "/usr/$f" ] || need=1; done
  if [ "$PORT" != 0 ]; then
    pkgs="$pkgs slurmrestd slurm-wlm-jwt-plugin curl"
    dpkg -s slurm-wlm-jwt-plugin >/dev/null 2>&1 || need=1
  fi
  if [ "$ACCOUNTING" = 1 ]; then
    pkgs="$pkgs slurmdbd mariadb-server mariadb-client"
    [ -x /usr/sbin/slurmdbd ] && command -v mysql >/dev/null || need=1
  fi
  if [ -n "$need" ]; then
    echo "installing $pkgs"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  fi
  for u in slurm slurmrest; do id -u "$u" >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin "$u"; done
}

start_munge() {
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
  chown munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  alive /run/munge/munged.pid munged || runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 40); do
    munge -n </dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  echo "munged does not answer (see /var/log/munge)" >&2
  return 1
}

write_conf() { # exit status 0 when slurm.conf changed
  local mem overrides="" tmp
  mem=$(( $(awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo) - 1024 ))
  if [ "$CPUS" -gt "$NPROC" ]; then overrides="SlurmdParameters=config_overrides"; fi
  mkdir -p "$ETC" "$STATE" "$SPOOL" "$LOG" "$RUN"
  chown slurm:slurm "$STATE" "$LOG" "$RUN"
  tmp=$(mktemp)
  cat >"$tmp" <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
$( [ "$PORT" != 0 ] && printf 'AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=%s\n' "$KEY" )
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
EnforcePartLimits=ALL
JobAcctGatherType=jobacct_gather/none
$ACCT
MailProg=/bin/true
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
KillWait=2
SchedulerParameters=sched_interval=2
$overrides
NodeName=$NODENAME$NODEHOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=normal Nodes=ALL MaxTime=INFINITE State=UP
CONF
  if cmp -s "$tmp" "$CONF"; then rm -f "$tmp"; return 1; fi
  install -m 0644 "$tmp" "$CONF"
  rm -f "$tmp"
}

start_mariadb() {
  mysql -uroot -e 'SELECT 1' >/dev/null 2>&1 && return 0
  echo "MariaDB is not answering: starting it"
  service mariadb start >/dev/null 2>&1 || (setsid mysqld_safe </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 60); do mysql -uroot -e 'SELECT 1' >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "MariaDB does not answer on its socket" >&2
  return 1
}

start_slurmdbd() { # the accounting daemon, its database user (socket auth: no password anywhere)
  start_mariadb
  mysql -uroot -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket;
    GRANT ALL ON \`$DB\`.* TO 'slurm'@'localhost';"
  local tmp
  tmp=$(mktemp)
  cat >"$tmp" <<DBD
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6829
SlurmUser=slurm
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StorageLoc=$DB
DBD
  if ! cmp -s "$tmp" "$ETC/slurmdbd.conf"; then
    install -m 0600 -o slurm -g slurm "$tmp" "$ETC/slurmdbd.conf"
    stop_daemon slurmdbd
  fi
  rm -f "$tmp"
  alive "$RUN/slurmdbd.pid" slurmdbd || /usr/sbin/slurmdbd # daemonizes
  for _ in $(seq 80); do sacctmgr -n -P list cluster >/dev/null 2>&1 && break; sleep 0.25; done
  sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER" ||
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

start_slurm() {
  alive "$RUN/slurmctld.pid" slurmctld || /usr/sbin/slurmctld # daemonizes
  for _ in $(seq 80); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.25; done
  scontrol ping 2>/dev/null | grep -q 'is UP' || { echo "slurmctld is down, see $LOG/slurmctld.log" >&2; return 1; }
  alive "$RUN/slurmd.pid" slurmd || /usr/sbin/slurmd -N "$NODENAME"
  local st=""
  for _ in $(seq 120); do
    st=$(sinfo -h -n "$NODENAME" -o %T 2>/dev/null | head -1 || true)
    case "$st" in
      idle* | mixed* | alloc* | compl*) return 0 ;;
      down* | drain*) scontrol update NodeName="$NODENAME" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.25
  done
  echo "node $NODENAME is not ready (state '$st'), see $LOG/slurmd.log" >&2
  return 1
}

start_rest() {
  [ "$PORT" = 0 ] && return 0
  [ -s "$KEY" ] || dd if=/dev/urandom of="$KEY" bs=32 count=1 status=none
  chown slurm:slurm "$KEY"
  chmod 0600 "$KEY"
  if ! alive "$RUN/slurmrestd.pid" slurmrestd; then
    SLURM_JWT=daemon setsid /usr/sbin/slurmrestd -u slurmrest -a rest_auth/jwt \
      -s openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38 "127.0.0.1:$PORT" \
      </dev/null >>"$LOG/slurmrestd.log" 2>&1 &
    echo $! >"$RUN/slurmrestd.pid"
  fi
  local token
  token=$(scontrol token username=root lifespan=86400 | cut -d= -f2)
  # The token stays in a root-only file; it is never printed.
  (umask 077 && printf 'SLURM_JWT=%s\nSLURM_REST_URL=http://127.0.0.1:%s\n' "$token" "$PORT" >"$RUN/rest.env")
  for _ in $(seq 40); do
    curl -sf -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $token" \
      "http://127.0.0.1:$PORT/slurm/v0.0.38/ping" 2>/dev/null | grep -q '"UP"' && return 0
    sleep 0.25
  done
  echo "slurmrestd is not answering on port $PORT" >&2
  return 1
}

case "${1:-start}" in
  start)
    install_packages
    [ "$PORT" != 0 ] && [ ! -s "$KEY" ] && mkdir -p "$STATE" && dd if=/dev/urandom of="$KEY" bs=32 count=1 status=none
    start_munge
    if write_conf && alive "$RUN/slurmctld.pid" slurmctld; then # config changed: restart
      stop_daemon slurmrestd; stop_daemon slurmd; stop_daemon slurmctld
    fi
    [ "$ACCOUNTING" = 1 ] && start_slurmdbd
    start_slurm
    start_rest
    sinfo
    ;;
  stop)
    if alive "$RUN/slurmctld.pid" slurmctld; then
      # shellcheck disable=SC2046
      scancel $(squeue -h -o %i) 2>/dev/null || true
      sleep 1
    fi
    # munged is shared by both clusters (and the QRMI tests): only the default cluster stops it.
    if [ "$ACCOUNTING" = 1 ]; then daemons="slurmd slurmctld slurmdbd"; else daemons="slurmrestd slurmd slurmctld munged"; fi
    for d in $daemons; do stop_daemon "$d"; done
    rm -f "$RUN/rest.env"
    ;;
  status)
    rc=0
    if [ "$ACCOUNTING" = 1 ]; then daemons="munged slurmdbd slurmctld slurmd"; else daemons="munged slurmctld slurmd slurmrestd"; fi
    for d in $daemons; do
      if alive "$(pidfile "$d")" "$d"; then echo "$d running $(cat "$(pidfile "$d")")"
      else echo "$d stopped"; [ "$d" = slurmrestd ] || rc=1; fi
    done
    exit $rc
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
