#!/usr/bin/env bash
# A real single-node Slurm 22.05 cluster on this machine, with accounting, for testing
# sweeps that go through `hydra/launcher=slurm` (submitit).
#
#   launchers/slurm-cluster.sh start    # install packages if missing, start all daemons, wait
#   eval "$(launchers/slurm-cluster.sh env)"   # export SLURM_CONF for sbatch/sacct/submitit
#   launchers/slurm-cluster.sh status
#   launchers/slurm-cluster.sh stop     # cancel jobs, stop every daemon this script started
#   launchers/slurm-cluster.sh purge    # stop, then delete the state dir
#
# Accounting (slurmdbd + MariaDB) is required: submitit learns from sacct that a job died.
# Everything lives in RANKEXP_SLURM_DIR; the daemons stay on loopback (bind-loopback.c
# preloaded); the database password never appears in argv.  See launchers/README.md.
#
# Environment knobs:
#   RANKEXP_SLURM_DIR        state dir                       (/tmp/rankexp-slurm)
#   RANKEXP_SLURM_PORT       first of 4 loopback ports: slurmctld, slurmd, slurmdbd, mariadb
#                                                             (6817 -> 6817..6820)
#   RANKEXP_SLURM_CPUS       CPUs the node advertises         (the machine's, whatever
#                            OMP_NUM_THREADS says); more oversubscribes the machine
#                            (slurmd told to trust the config)
#   RANKEXP_SLURM_FAKE_GPUS  if > 0: declare that many count-only `gpu` GRES and a `gpu`
#                            partition, so GPU launcher configs can be exercised (0). No
#                            device is bound; jobs see no CUDA device.
#   RANKEXP_SLURM_TIMEOUT    seconds to wait for the cluster to become ready (120)
set -euo pipefail

DIR=${RANKEXP_SLURM_DIR:-/tmp/rankexp-slurm}
PORT=${RANKEXP_SLURM_PORT:-6817}
REAL_CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc alone obeys OMP_NUM_THREADS
CPUS=${RANKEXP_SLURM_CPUS:-$REAL_CPUS}
FAKE_GPUS=${RANKEXP_SLURM_FAKE_GPUS:-0}
TIMEOUT=${RANKEXP_SLURM_TIMEOUT:-120}
CLUSTER=rankexp
NODE=localhost

CTLD_PORT=$PORT
SLURMD_PORT=$((PORT + 1))
DBD_PORT=$((PORT + 2))
DB_PORT=$((PORT + 3))

ETC=$DIR/etc LOG=$DIR/log RUN=$DIR/run MUNGE=$DIR/munge DB=$DIR/mariadb
SLURM_CONF_FILE=$ETC/slurm.conf
MUNGE_SOCKET=$MUNGE/munge.socket
DB_SOCKET=$DB/mysqld.sock
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server gcc libc6-dev)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHIM=$DIR/lib/bind-loopback.so

log() { printf '[slurm-cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- process bookkeeping -----------------------------------------------------------------

# pid_alive PIDFILE EXE: true if the pid in PIDFILE is running the executable EXE
# (checked through /proc/PID/exe, so a recycled pid is not mistaken for our daemon).
pid_alive() {
  local pidfile=$1 exe=$2 pid
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  local real
  real=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  # Debian installs slurmctld/slurmd as alternatives of slurmctld-wlm/slurmd-wlm.
  [[ ${real##*/} == "$exe" || ${real##*/} == "$exe-wlm" ]]
}

stop_pid() {  # stop_pid PIDFILE EXE NAME
  local pidfile=$1 exe=$2 name=$3 pid i
  if ! pid_alive "$pidfile" "$exe"; then rm -f "$pidfile"; return 0; fi
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    pid_alive "$pidfile" "$exe" || break
    sleep 0.1
  done
  if pid_alive "$pidfile" "$exe"; then
    log "$name ($pid) ignored SIGTERM for 10 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$pidfile"
  log "stopped $name"
}

# spawn CMD...: run a daemon's launcher with no terminal, its early output in startup.log, and
# without fd 9 (the start lock), so a daemon neither holds the lock nor a caller's pipe open.
spawn() { "$@" </dev/null >>"$LOG/startup.log" 2>&1 9>&-; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2 end
  shift 2
  end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || { log "gave up waiting for $what after ${secs}s"; return 1; }
    sleep 0.2
  done
}

# --- installation ------------------------------------------------------------------------

ensure_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ $EUID -eq 0 ]] || die "packages missing (${missing[*]}); run as root to install them"
  log "installing ${missing[*]}"
  # Debian's maintainer scripts try to start the services; without systemd/init they
  # only print warnings, and this script starts its own private daemons anyway.
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends "${missing[@]}" >"$DIR/apt.log" 2>&1; then
    apt-get update >>"$DIR/apt.log" 2>&1
    apt-get install -y --no-install-recommends "${missing[@]}" >>"$DIR/apt.log" 2>&1 \
      || die "apt-get install failed; see $DIR/apt.log"
  fi
}

# --- configuration -----------------------------------------------------------------------

write_slurm_conf() {
  local mem gres_line="" node_gres="" gpu_part="" slurmd_params=""
  # Advertise 90% of physical memory so `--mem` requests are checked against something real.
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  ((CPUS > REAL_CPUS)) && slurmd_params="SlurmdParameters=config_overrides"
  if ((FAKE_GPUS > 0)); then
    gres_line="GresTypes=gpu
AccountingStorageTRES=gres/gpu"
    node_gres="Gres=gpu:$FAKE_GPUS"
    gpu_part="PartitionName=gpu Nodes=$NODE Default=NO MaxTime=INFINITE State=UP"
    # slurmd drops file-less GPUs, so each fake GPU is an empty file standing in for a device.
    mkdir -p "$DIR/fake-gpus"
    local i
    for ((i = 0; i < FAKE_GPUS; i++)); do : >"$DIR/fake-gpus/nvidia$i"; done
    printf 'NodeName=%s Name=gpu File=%s/fake-gpus/nvidia[0-%s]\n' "$NODE" "$DIR" "$((FAKE_GPUS - 1))" >"$ETC/gres.conf"
  else
    rm -f "$ETC/gres.conf"
  fi
  cat >"$SLURM_CONF_FILE" <<EOF
# Generated by launchers/slurm-cluster.sh; rewritten on every start.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
$slurmd_params
$gres_line
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
# Accounting: sacct is what submitit uses to notice jobs that died without a result.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# With slurmdbd this "password" is the munge socket used to talk to it (AuthInfo is not).
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# Finished jobs leave squeue quickly; sacct keeps them.
MinJobAge=60
KillWait=5
InactiveLimit=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem $node_gres State=UNKNOWN
PartitionName=cpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
$gpu_part
EOF

  # slurmdbd finds slurmdbd.conf next to $SLURM_CONF; it holds a password, so mode 600.
  (
    umask 077
    cat >"$ETC/slurmdbd.conf" <<EOF
# Generated by launchers/slurm-cluster.sh; rewritten on every start.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(<"$ETC/dbpass")
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$ETC/slurmdbd.conf"
}

# --- daemons -----------------------------------------------------------------------------

start_munge() {
  pid_alive "$RUN/munged.pid" munged && return 0
  install -d -o munge -g munge -m 0755 "$MUNGE"
  if [[ ! -s $MUNGE/munge.key ]]; then
    mungekey --create --keyfile="$MUNGE/munge.key"
    chown munge:munge "$MUNGE/munge.key"
    chmod 0400 "$MUNGE/munge.key"
  fi
  # munged runs as munge: it needs its own dir for socket/pid/seed and its log file made for it.
  touch "$LOG/munged.log" && chown munge:munge "$LOG/munged.log"
  spawn setpriv --reuid=munge --regid=munge --init-groups \
    munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE/munge.key" \
    --pid-file="$MUNGE/munged.pid" --log-file="$LOG/munged.log" \
    --seed-file="$MUNGE/munged.seed" \
    || die "munged failed to start; see $LOG/munged.log and $LOG/startup.log"
  wait_for 10 munged test -s "$MUNGE/munged.pid" || die "munged wrote no pid file"
  cp "$MUNGE/munged.pid" "$RUN/munged.pid"
  log "started munged"
}

# SQL on stdin, never -e: a password in argv is visible to every user (ps, /proc/PID/cmdline)
db_sql() { mariadb --no-defaults --socket="$DB_SOCKET" -u root <<<"$1"; }

# The preload that keeps the Slurm daemons on loopback (see the header), rebuilt when its
# source changes.
build_shim() {
  local src=$HERE/bind-loopback.c
  if [[ ! -s $SHIM || $src -nt $SHIM ]]; then
    mkdir -p "$DIR/lib"
    cc -shared -fPIC -O2 -o "$SHIM" "$src" -ldl 2>"$LOG/shim.log" \
      || die "could not build $SHIM (needs gcc and libc6-dev); see $LOG/shim.log"
  fi
}

# Every listening socket on the cluster's four ports must be a loopback one.
check_loopback() {
  local bad
  bad=$(ss -Hltn 2>/dev/null | awk -v lo="$PORT" -v hi="$((PORT + 3))" '{
      n = split($4, a, ":"); port = a[n]; addr = substr($4, 1, length($4) - length(port) - 1)
      if (port >= lo && port <= hi && addr != "127.0.0.1" && addr != "[::1]") print $4 }')
  [[ -z $bad ]] || die "cluster ports listen beyond loopback: $bad"
}

start_mariadb() {
  pid_alive "$RUN/mariadbd.pid" mariadbd && return 0
  local fresh=0
  if [[ ! -d $DB/data/mysql ]]; then
    fresh=1
    rm -rf "$DB"
    install -d -o mysql -g mysql -m 0755 "$DB" "$DB/data"
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB/data" \
      --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve \
      >"$LOG/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $LOG/mariadb-install.log"
  fi
  touch "$LOG/mariadb.log" && chown mysql:mysql "$LOG/mariadb.log"
  # Sizes are slurmdbd's minimum recommendations (it logs an error below them); the
  # buffer pool is allocated lazily, so this costs little memory.
  # Not via spawn: a backgrounded function would leave a bash (holding the lock) as parent.
  # setsid: its own session, so a Ctrl-C or `timeout` aimed at this script spares it (the
  # other daemons detach by themselves).
  setsid mariadbd --no-defaults --user=mysql --datadir="$DB/data" --socket="$DB_SOCKET" \
    --pid-file="$DB/mariadbd.pid" --log-error="$LOG/mariadb.log" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    --innodb-log-file-size=64M --performance-schema=OFF \
    </dev/null >>"$LOG/startup.log" 2>&1 9>&- &
  disown
  wait_for 60 mariadb db_sql 'SELECT 1' || die "mariadbd did not answer; see $LOG/mariadb.log"
  # mariadbd runs as mysql and cannot write into the root-owned run dir: copy its pid file.
  cp "$DB/mariadbd.pid" "$RUN/mariadbd.pid"
  if ((fresh)) || ! db_sql "SELECT 1 FROM mysql.user WHERE user='slurm'" | grep -q 1; then
    db_sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$(<"$ETC/dbpass")';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
            FLUSH PRIVILEGES;"
  fi
  log "started mariadbd"
}

start_slurmdbd() {
  pid_alive "$RUN/slurmdbd.pid" slurmdbd && return 0
  LD_PRELOAD=$SHIM SLURM_CONF=$SLURM_CONF_FILE spawn slurmdbd || die "slurmdbd failed; see $LOG/slurmdbd.log"
  # Ready when it answers a query; creating the tables on first start takes a few seconds.
  wait_for 60 slurmdbd env SLURM_CONF="$SLURM_CONF_FILE" sacctmgr -n list cluster \
    || die "slurmdbd did not answer; see $LOG/slurmdbd.log"
  if ! SLURM_CONF=$SLURM_CONF_FILE sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    SLURM_CONF=$SLURM_CONF_FILE sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
  log "started slurmdbd"
}

start_slurmctld() {
  pid_alive "$RUN/slurmctld.pid" slurmctld && return 0
  LD_PRELOAD=$SHIM SLURM_CONF=$SLURM_CONF_FILE spawn slurmctld || die "slurmctld failed; see $LOG/slurmctld.log"
  log "started slurmctld"
}

start_slurmd() {
  pid_alive "$RUN/slurmd.pid" slurmd && return 0
  LD_PRELOAD=$SHIM SLURM_CONF=$SLURM_CONF_FILE spawn slurmd -N "$NODE" || die "slurmd failed; see $LOG/slurmd.log"
  log "started slurmd"
}

node_ready() {
  local state
  state=$(SLURM_CONF=$SLURM_CONF_FILE sinfo -h -N -n "$NODE" -o %T 2>/dev/null | head -n 1)
  [[ $state == idle || $state == mixed || $state == allocated ]]
}

# The controller remembers a drain (e.g. from a start with a different config) across
# restarts, and ReturnToService does not undo it. This is a private test node: once slurmd
# has registered, undrain it, saying why it was drained.
resume_if_drained() {
  local state reason
  wait_for 15 registration bash -c "SLURM_CONF=$SLURM_CONF_FILE sinfo -h -N -n $NODE -o %T | grep -qv -e unknown -e '^\$'" || true
  state=$(SLURM_CONF=$SLURM_CONF_FILE sinfo -h -N -n "$NODE" -o %T | head -n 1)
  if [[ $state == drain* || $state == down* ]]; then
    reason=$(SLURM_CONF=$SLURM_CONF_FILE sinfo -h -N -n "$NODE" -o %E | head -n 1)
    log "node was $state ($reason); resuming it"
    SLURM_CONF=$SLURM_CONF_FILE scontrol update nodename="$NODE" state=resume || true
  fi
}

sacct_answers() { SLURM_CONF=$SLURM_CONF_FILE sacct -n -X -S now-1minutes >/dev/null 2>&1; }

all_alive() {
  pid_alive "$RUN/munged.pid" munged && pid_alive "$RUN/mariadbd.pid" mariadbd \
    && pid_alive "$RUN/slurmdbd.pid" slurmdbd && pid_alive "$RUN/slurmctld.pid" slurmctld \
    && pid_alive "$RUN/slurmd.pid" slurmd
}

# --- commands ----------------------------------------------------------------------------

cmd_start() {
  [[ $EUID -eq 0 ]] || die "start needs root (daemons run as root, munge and mysql)"
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock 9  # concurrent `start`s queue here instead of racing (see spawn)
  if all_alive && node_ready && sacct_answers; then
    check_loopback
    log "already running (state dir $DIR)"
    return 0
  fi
  ensure_packages
  install -d -m 0755 "$ETC" "$LOG" "$RUN" "$DIR/state" "$DIR/spool" "$DIR/spool/slurmd"
  if [[ ! -s $ETC/dbpass ]]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$ETC/dbpass")
  fi
  # Config is only rewritten while the Slurm daemons are down, so they never disagree.
  if ! pid_alive "$RUN/slurmctld.pid" slurmctld && ! pid_alive "$RUN/slurmd.pid" slurmd \
    && ! pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
    write_slurm_conf
  fi
  build_shim
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurmctld
  start_slurmd
  resume_if_drained
  wait_for "$TIMEOUT" node node_ready \
    || die "node not idle after ${TIMEOUT}s: $(SLURM_CONF=$SLURM_CONF_FILE sinfo -N 2>&1 | tail -n +2); see $LOG/"
  wait_for "$TIMEOUT" sacct sacct_answers || die "sacct does not answer; see $LOG/slurmdbd.log"
  check_loopback
  log "ready: $(SLURM_CONF=$SLURM_CONF_FILE sinfo -h -o '%P %a %D %T %c CPUs' | tr '\n' ';')"
  log "now run: eval \"\$($0 env)\""
}

cmd_stop() {
  [[ -d $DIR ]] || { log "nothing to stop ($DIR absent)"; return 0; }
  exec 9>"$DIR/.lock"
  flock 9
  if pid_alive "$RUN/slurmctld.pid" slurmctld; then
    # Cancel what is left so no slurmstepd outlives the cluster.
    local jobs
    jobs=$(SLURM_CONF=$SLURM_CONF_FILE squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
    if [[ -n ${jobs// /} ]]; then
      log "cancelling jobs: $jobs"
      # shellcheck disable=SC2086
      SLURM_CONF=$SLURM_CONF_FILE scancel $jobs || true
      wait_for 20 "jobs gone" bash -c "[[ -z \$(SLURM_CONF=$SLURM_CONF_FILE squeue -h -t R,CG -o %A) ]]" || true
    fi
  fi
  stop_pid "$RUN/slurmd.pid" slurmd slurmd
  stop_pid "$RUN/slurmctld.pid" slurmctld slurmctld
  stop_pid "$RUN/slurmdbd.pid" slurmdbd slurmdbd
  stop_pid "$RUN/mariadbd.pid" mariadbd mariadbd
  stop_pid "$RUN/munged.pid" munged munged
  rm -f "$MUNGE/munged.pid"
}

cmd_status() {
  local name exe rc=0
  for name in munged mariadbd slurmdbd slurmctld slurmd; do
    exe=$name
    if pid_alive "$RUN/$name.pid" "$exe"; then
      printf '%-10s running (pid %s)\n' "$name" "$(<"$RUN/$name.pid")"
    else
      printf '%-10s stopped\n' "$name"
      rc=1
    fi
  done
  if ((rc == 0)); then
    SLURM_CONF=$SLURM_CONF_FILE sinfo
    if sacct_answers; then echo "sacct: answers"; else echo "sacct: NOT answering"; rc=1; fi
  fi
  return $rc
}

cmd_env() {
  echo "export SLURM_CONF=$SLURM_CONF_FILE"
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  purge)
    cmd_stop
    rm -rf "$DIR"
    log "removed $DIR"
    ;;
  *)
    echo "usage: $0 {start|stop|status|env|purge}" >&2
    exit 2
    ;;
esac
