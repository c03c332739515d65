#!/usr/bin/env bash
# .ci/services.sh - bring up the services the HPC tests need, as root, without systemd:
#
#   * a real single-node SLURM (slurmctld + slurmd + slurmdbd accounting, so sacct works),
#     with slurmdbd on the MariaDB that already runs at 127.0.0.1:3306;
#   * the PostgreSQL that already runs at 127.0.0.1:5432 (trust auth) is only checked.
#
#   bash .ci/services.sh [start]   install (idempotent) + start; a second call is a no-op
#   bash .ci/services.sh stop      stop the SLURM daemons this script started (PID files)
#   source /tmp/autotune-ci/env    SLURM_CONF, AUTOTUNE_TEST_PG_URL, AUTOTUNE_TEST_MYSQL_URL
#
# Facts this relies on (Debian 12, SLURM 22.05, measured on a 2-core VM):
#   - the daemons start as root without systemd in 5-40 s; apt's postinst cannot start
#     them (no init), which is fine: we start them ourselves;
#   - munged must run as user munge and needs /run/munge to exist first;
#   - slurmdbd refuses a slurmdbd.conf readable by group/others (mode 600);
#   - SlurmdParameters=config_overrides lets the node advertise more CPUs than it has,
#     so trials with 4 ranks and several array workers fit on 2 real cores; task/none
#     because task/affinity would bind ranks to CPUs that do not exist;
#   - `--time` limits round up to whole minutes and fire 60-90 s late; `sbatch --wait`
#     polls with a back-off: tests poll `squeue` instead.
# Knobs (env): SVC_DIR (/tmp/autotune-ci), SLURM_CPUS (8), MYSQL_HOST/PORT (127.0.0.1:3306),
#              PG_URL (postgresql+psycopg://postgres@127.0.0.1:5432/test).
set -euo pipefail

SVC_DIR=${SVC_DIR:-/tmp/autotune-ci}
SLURM_CPUS=${SLURM_CPUS:-8}
MYSQL_HOST=${MYSQL_HOST:-127.0.0.1}
MYSQL_PORT=${MYSQL_PORT:-3306}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_URL=${PG_URL:-postgresql+psycopg://postgres@$PG_HOST:$PG_PORT/test}
MYSQL_URL=${MYSQL_URL:-mysql+pymysql://root@$MYSQL_HOST:$MYSQL_PORT/test}
SLURMDB_PASS=${SLURMDB_PASS:-autotune-ci-slurmdb}   # local CI only; never a real secret
CONF=/etc/slurm/slurm.conf
LOG="$SVC_DIR/log"
export DEBIAN_FRONTEND=noninteractive

t0=$(date +%s%N)
say() { local ds=$(( ($(date +%s%N) - t0) / 100000000 )); printf '[services %3d.%ds] %s\n' $((ds / 10)) $((ds % 10)) "$*"; }
die() { say "ERROR: $*"; exit 1; }
wait_for() { # wait_for SECONDS CMD...: poll every 0.2 s
  local n=$(( $1 * 5 )); shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
alive() { [ -s "$1" ] && kill -0 "$(head -1 "$1")" 2>/dev/null; }
mysql_root() { mysql -uroot -h"$MYSQL_HOST" -P"$MYSQL_PORT" --batch --skip-column-names "$@"; }
slurm_ready() { sinfo -h -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; }

write_env() {
  cat >"$SVC_DIR/env.tmp" <<EOF
export SLURM_CONF=$CONF
export AUTOTUNE_TEST_PG_URL=$PG_URL
export AUTOTUNE_TEST_MYSQL_URL=$MYSQL_URL
EOF
  mv "$SVC_DIR/env.tmp" "$SVC_DIR/env"
}

install_packages() {
  local pkgs="slurmctld slurmd slurm-client munge slurmdbd"
  # shellcheck disable=SC2086
  if dpkg -s $pkgs >/dev/null 2>&1; then return 0; fi
  say "installing $pkgs (log: $LOG/apt.log)"
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs; } \
    >>"$LOG/apt.log" 2>&1 || { tail -30 "$LOG/apt.log"; die "apt-get install failed"; }
}

start_munge() {
  [ -s /etc/munge/munge.key ] || {
    /usr/sbin/mungekey -c -f -k /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  install -d -o munge -g munge -m 0755 /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    wait_for 10 bash -c 'munge -n | unmunge' || die "munged did not start"
    cp /run/munge/munged.pid "$SVC_DIR/run/munged.pid"
  fi
  say "munged up"
}

start_slurmdbd() {
  wait_for 20 mysql_root -e 'select 1' || die "MariaDB not reachable at $MYSQL_HOST:$MYSQL_PORT as root"
  mysql_root -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$SLURMDB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$SLURMDB_PASS';
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  local tmp
  tmp=$(mktemp /etc/slurm/.slurmdbd.XXXXXX)   # mktemp: mode 600 from the start
  cat >"$tmp" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$SVC_DIR/run/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=$MYSQL_HOST
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$SLURMDB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$tmp"; mv "$tmp" /etc/slurm/slurmdbd.conf
  alive "$SVC_DIR/run/slurmdbd.pid" || slurmdbd
  wait_for 30 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819' \
    || { tail -20 "$LOG/slurmdbd.log"; die "slurmdbd did not listen on 6819"; }
  say "slurmdbd up"
}

write_slurm_conf() {
  local host mem
  host=$(hostname -s)                     # slurmd finds its NodeName via the hostname
  getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >>/etc/hosts
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  printf 'CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=no\n' \
    >/etc/slurm/cgroup.conf
  cat >"$CONF.tmp" <<EOF
# Written by autotune .ci/services.sh - single-node CI cluster.
ClusterName=ci
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
StateSaveLocation=$SVC_DIR/slurm/ctld
SlurmdSpoolDir=$SVC_DIR/slurm/d
SlurmctldPidFile=$SVC_DIR/run/slurmctld.pid
SlurmdPidFile=$SVC_DIR/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
KillWait=5
MinJobAge=300
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
NodeName=$host CPUs=$SLURM_CPUS RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  if cmp -s "$CONF.tmp" "$CONF"; then rm -f "$CONF.tmp"; return 1; fi
  mv "$CONF.tmp" "$CONF"
  return 0
}

start_slurm() {
  local changed=0
  write_slurm_conf && changed=1
  sacctmgr -i -Q add cluster ci >/dev/null 2>&1 || true   # "already exists" is fine
  if [ "$changed" = 1 ]; then   # a new config: restart what runs with the old one
    for d in slurmd slurmctld; do
      if alive "$SVC_DIR/run/$d.pid"; then kill "$(head -1 "$SVC_DIR/run/$d.pid")"; fi
    done
    wait_for 20 bash -c "! kill -0 \$(head -1 $SVC_DIR/run/slurmctld.pid 2>/dev/null) 2>/dev/null" || true
    wait_for 20 bash -c "! kill -0 \$(head -1 $SVC_DIR/run/slurmd.pid 2>/dev/null) 2>/dev/null" || true
  fi
  alive "$SVC_DIR/run/slurmctld.pid" || slurmctld
  alive "$SVC_DIR/run/slurmd.pid" || slurmd
  if ! wait_for 60 slurm_ready; then
    # A node left DOWN/DRAIN by an earlier run: resume it once.
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    wait_for 30 slurm_ready || { tail -20 "$LOG/slurmctld.log"; die "slurm node not idle"; }
  fi
  say "slurm up: $(sinfo -h -o '%P %D %t %N %c cpus %m MB')"
}

check_postgres() {
  wait_for 20 psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d test -Atc 'select 1' \
    || die "PostgreSQL not reachable at $PG_HOST:$PG_PORT (user postgres, db test)"
  say "postgres reachable ($PG_HOST:$PG_PORT/test)"
}

smoke_test() {
  srun -n 2 -t 1 true || die "srun smoke test failed"
  sacct -n -X -o JobID >/dev/null || die "sacct does not work (accounting)"
  say "smoke test passed"
}

do_start() {
  mkdir -p "$SVC_DIR"/{run,log,slurm/ctld,slurm/d}
  if [ -s "$SVC_DIR/env" ] && slurm_ready && alive "$SVC_DIR/run/slurmdbd.pid" \
      && munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && ! write_slurm_conf_changed; then
    say "already running (env in $SVC_DIR/env)"
    return 0
  fi
  install_packages
  start_munge
  start_slurmdbd
  start_slurm
  check_postgres
  smoke_test
  write_env
  say "done; source $SVC_DIR/env"
}

write_slurm_conf_changed() { # true when slurm.conf would change (keeps the no-op path honest)
  [ -f "$CONF" ] || return 0
  grep -q "^NodeName=$(hostname -s) CPUs=$SLURM_CPUS " "$CONF" || return 0
  grep -q "^SlurmdPidFile=$SVC_DIR/run/slurmd.pid$" "$CONF" || return 0
  return 1
}

do_stop() {
  for d in slurmd slurmctld slurmdbd; do
    f="$SVC_DIR/run/$d.pid"
    if alive "$f"; then kill "$(head -1 "$f")"; say "stopped $d"; fi
  done
}

case "${1:-start}" in
  start) do_start ;;
  stop) do_stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
