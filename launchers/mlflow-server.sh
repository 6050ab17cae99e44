#!/usr/bin/env bash
# A real `mlflow server` (SQLite or private PostgreSQL backend) for sweeps that log from many
# processes or nodes; loopback by default, another --host gets --auth unless --insecure; its state
# (database, artifacts, logs, secrets) is its owner's alone: 0700/0600. See launchers/README.md.
#
#   eval "$(launchers/mlflow-server.sh start [--backend sqlite|postgres] [--host ADDR] [--auth])"
#   launchers/mlflow-server.sh status | env | stop | purge
#
# `start` prints only `export` lines on stdout (the password is read by the eval'ing shell
# from its file, never printed); progress goes to stderr. Options or environment: --backend
# RANKEXP_MLFLOW_BACKEND, --host RANKEXP_MLFLOW_HOST, --port RANKEXP_MLFLOW_PORT, --workers
# RANKEXP_MLFLOW_WORKERS, --auth RANKEXP_MLFLOW_AUTH=1, --insecure RANKEXP_MLFLOW_INSECURE=1;
# RANKEXP_MLFLOW_DIR (state), RANKEXP_PG_PORT, RANKEXP_MLFLOW_ALLOWED_HOSTS, MLFLOW (executable).
set -euo pipefail
umask 077 # every file the script, PostgreSQL and the server create: owner-only

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${RANKEXP_MLFLOW_DIR:-/tmp/rankexp-mlflow}
BACKEND=${RANKEXP_MLFLOW_BACKEND:-sqlite}
HOST=${RANKEXP_MLFLOW_HOST:-127.0.0.1}
PORT=${RANKEXP_MLFLOW_PORT:-5000}
WORKERS=${RANKEXP_MLFLOW_WORKERS:-4}
AUTH=${RANKEXP_MLFLOW_AUTH:-0}
INSECURE=${RANKEXP_MLFLOW_INSECURE:-0}
PG_PORT=${RANKEXP_PG_PORT:-5433}
if [[ -z ${MLFLOW:-} ]]; then
  if [[ -x $HERE/../.venv/bin/mlflow ]]; then MLFLOW=$HERE/../.venv/bin/mlflow; else MLFLOW=mlflow; fi
fi

PG=$DIR/postgres
PIDFILE=$DIR/server.pid

log() { printf '[mlflow-server] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  echo "usage: $0 {start [--backend sqlite|postgres] [--host ADDR] [--port N] [--workers N] [--auth|--insecure]|stop|status|env|purge}" >&2
  exit 2
}

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
while (($#)); do
  case $1 in
    --backend) BACKEND=$2; shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --auth) AUTH=1; shift ;;
    --insecure) INSECURE=1; shift ;;
    *) usage ;;
  esac
done
[[ $BACKEND == sqlite || $BACKEND == postgres ]] || die "--backend must be sqlite or postgres, not '$BACKEND'"
AUTH_DIR=$DIR/auth

loopback() { [[ $1 == 127.* || $1 == localhost || $1 == ::1 ]]; }
loopback "$HOST" || ((INSECURE)) || AUTH=1 # serving the network: a password unless --insecure

client_host() {
  case $HOST in
    0.0.0.0 | :: | '') hostname -f 2>/dev/null || hostname ;;
    *) echo "$HOST" ;;
  esac
}

server_alive() {
  local pid
  [[ -s $PIDFILE ]] || return 1
  pid=$(<"$PIDFILE")
  [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'mlflow server'
}

health() { curl -fsS -o /dev/null --max-time 2 "http://$1:$2/health"; }

pg_bin() {
  local d
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '\*' | sort -V | tail -n 1)
  [[ -n $d ]] || die "PostgreSQL server binaries not found (apt-get install postgresql)"
  echo "$d"
}

# PostgreSQL's tools run as `postgres` under root; 9>&-: no daemon inherits the lock on fd 9.
as_pg() {
  if ((EUID == 0)); then (cd / && runuser -u postgres -- "$@" 9>&-); else "$@" 9>&-; fi
}

pg_running() { as_pg "$(pg_bin)/pg_ctl" -D "$PG/data" status >/dev/null 2>&1; }

start_postgres() {
  local bin owner
  bin=$(pg_bin)
  if ((EUID == 0)); then owner=postgres; else owner=$(id -un); fi
  if ((EUID == 0)) && ! runuser -u postgres -- test -x "$DIR"; then
    die "user postgres cannot enter $DIR (chmod o+x its parents, or pick another RANKEXP_MLFLOW_DIR)"
  fi
  if [[ ! -s $PG/data/PG_VERSION ]]; then
    log "creating a private PostgreSQL cluster in $PG/data"
    rm -rf "$PG"
    install -d -m 0700 -o "$owner" "$PG"
    install -d -m 0700 -o "$owner" "$PG/data"
    as_pg "$bin/initdb" -D "$PG/data" -U "$owner" --auth-local=peer --auth-host=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 || die "initdb failed; see $DIR/initdb.log"
    head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/pgpass.secret"
  fi
  if ! pg_running; then
    as_pg "$bin/pg_ctl" -D "$PG/data" -l "$PG/postgres.log" -w -t 60 \
      -o "-p $PG_PORT -k $PG -c listen_addresses=127.0.0.1" start >/dev/null \
      || die "PostgreSQL did not start; see $PG/postgres.log"
  fi
  local pw
  pw=$(<"$DIR/pgpass.secret")
  if ! as_pg "$bin/psql" -h "$PG" -p "$PG_PORT" -U "$owner" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='mlflow'" | grep -q 1; then
    # SQL on stdin, not -c: no password in argv
    as_pg "$bin/psql" -h "$PG" -p "$PG_PORT" -U "$owner" -d postgres -q -v ON_ERROR_STOP=1 <<SQL \
      || die "could not create the mlflow role/database"
CREATE ROLE mlflow LOGIN PASSWORD '$pw';
CREATE DATABASE mlflow OWNER mlflow;
SQL
  fi
  echo "127.0.0.1:$PG_PORT:mlflow:mlflow:$pw" >"$DIR/pgpass"
  log "PostgreSQL listening on 127.0.0.1:$PG_PORT"
}

stop_postgres() {
  [[ -s $PG/data/PG_VERSION ]] || return 0
  if pg_running; then
    as_pg "$(pg_bin)/pg_ctl" -D "$PG/data" -m fast -w stop >/dev/null
    log "stopped PostgreSQL"
  fi
}

cmd_env() {
  echo "export MLFLOW_TRACKING_URI=http://$(client_host):$PORT"
  if [[ -s $DIR/auth-mode && $(<"$DIR/auth-mode") == auth ]]; then
    echo "export MLFLOW_TRACKING_USERNAME=admin"
    echo "export MLFLOW_TRACKING_PASSWORD=\"\$(cat '$AUTH_DIR/admin-password')\""
  fi
}

python_of_mlflow() { "$(dirname "$(readlink -f "$(command -v "$MLFLOW")")")/python" "$@"; }

# MLflow's basic-auth app: admin password and Flask secret generated once (mode 600).
prepare_auth() {
  local why=
  loopback "$HOST" || why=" (the default for --host $HOST; --insecure serves without a password)"
  python_of_mlflow -c 'import flask_wtf' 2>/dev/null \
    || die "--auth$why needs Flask-WTF next to $MLFLOW (pip install 'Flask-WTF>=1.2,<2', or the project's [auth] extra)"
  mkdir -p "$AUTH_DIR"
  [[ -s $AUTH_DIR/admin-password ]] || head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$AUTH_DIR/admin-password"
  [[ -s $AUTH_DIR/secret-key ]] || head -c 32 /dev/urandom | base64 | tr -d '/+=' >"$AUTH_DIR/secret-key"
  cat >"$AUTH_DIR/basic_auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = sqlite:///$AUTH_DIR/basic_auth.db
admin_username = admin
admin_password = $(<"$AUTH_DIR/admin-password")
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
}

cmd_start() {
  mkdir -p "$DIR"
  [[ -O $DIR && ! -L $DIR ]] || die "$DIR is not a folder of yours; pick another RANKEXP_MLFLOW_DIR"
  exec 9>"$DIR/.lock"
  flock 9
  local mode=open
  ((AUTH)) && mode=auth
  if server_alive; then
    local running running_mode
    running=$(cat "$DIR/backend" 2>/dev/null || echo '?')
    running_mode=$(cat "$DIR/auth-mode" 2>/dev/null || echo open)
    [[ $running == "$BACKEND" ]] || die "a server with backend '$running' is running; stop it first"
    [[ $running_mode == "$mode" ]] || die "a server with auth '$running_mode' is running; stop it first"
    read -r HOST PORT <"$DIR/address"
    health "$(client_host)" "$PORT" || die "server process alive but /health does not answer; see $DIR/server.log"
    log "already running ($running, state dir $DIR)"
    cmd_env
    return 0
  fi
  if health "$(client_host)" "$PORT" 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    die "port $PORT is already in use by another process; pick another with --port"
  fi
  if ((!AUTH)) && loopback "$HOST"; then
    log "note: no --auth: every user of this machine can read, change and delete runs on port" \
      "$PORT; on a shared node add --auth"
  elif ((!AUTH)); then
    log "WARNING: --insecure: serving $HOST:$PORT WITHOUT authentication; anyone who can reach it can read, change and delete every run"
  fi
  "$MLFLOW" --version >/dev/null 2>&1 || die "cannot run '$MLFLOW' (set MLFLOW=/path/to/mlflow)"
  # the state dir (one made before, 0755, too) is its owner's; root's PostgreSQL runs as
  # postgres, which enters it (group postgres, 0710): its data dir is its own, 0700
  if ((EUID == 0)) && [[ $BACKEND == postgres ]]; then chgrp postgres "$DIR" && chmod 0710 "$DIR"
  else chmod 0700 "$DIR"; fi
  mkdir -p "$DIR/artifacts"
  local app=()
  if ((AUTH)); then
    prepare_auth
    app=(--app-name basic-auth)
  fi
  local uri
  case $BACKEND in
    sqlite)
      mkdir -p "$DIR/sqlite"
      uri="sqlite:///$DIR/sqlite/mlflow.db"
      ;;
    postgres)
      start_postgres
      export PGPASSFILE=$DIR/pgpass
      uri="postgresql://mlflow@127.0.0.1:$PG_PORT/mlflow"
      python_of_mlflow -c 'import psycopg' 2>/dev/null \
        || log "warning: psycopg not importable next to $MLFLOW; pip install 'psycopg[binary]'"
      ;;
  esac
  local allowed=()
  if [[ -n ${RANKEXP_MLFLOW_ALLOWED_HOSTS:-} ]]; then
    allowed=(--allowed-hosts "$RANKEXP_MLFLOW_ALLOWED_HOSTS")
  elif ! loopback "$HOST"; then
    local h f
    h=$(hostname)
    f=$(hostname -f 2>/dev/null || hostname)
    allowed=(--allowed-hosts "localhost,localhost:*,127.0.0.1,127.0.0.1:*,$h,$h:*,$f,$f:*,$HOST,$HOST:*,10.*,192.168.*,172.*")
  fi
  echo "$BACKEND" >"$DIR/backend"
  echo "$mode" >"$DIR/auth-mode"
  echo "$HOST $PORT" >"$DIR/address"
  log "starting mlflow server ($BACKEND, $mode) on $HOST:$PORT, $WORKERS workers"
  # Own session (setsid): stop reaches the workers through the process group. The store URI,
  # the auth config and the Flask secret come through the environment: no secret in `ps`.
  (
    export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
    export MLFLOW_BACKEND_STORE_URI=$uri
    if ((AUTH)); then
      export MLFLOW_AUTH_CONFIG_PATH=$AUTH_DIR/basic_auth.ini
      MLFLOW_FLASK_SERVER_SECRET_KEY=$(<"$AUTH_DIR/secret-key")
      export MLFLOW_FLASK_SERVER_SECRET_KEY
    fi
    exec setsid "$MLFLOW" server --host "$HOST" --port "$PORT" --workers "$WORKERS" "${app[@]}" \
      --artifacts-destination "$DIR/artifacts" "${allowed[@]}" </dev/null >"$DIR/server.log" 2>&1 9>&-
  ) &
  echo $! >"$PIDFILE"
  local end=$((SECONDS + 120))
  until health "$(client_host)" "$PORT" 2>/dev/null; do
    server_alive || die "mlflow server exited; see $DIR/server.log"
    ((SECONDS < end)) || die "/health did not answer in 120 s; see $DIR/server.log"
    sleep 0.3
  done
  log "ready: $BACKEND store, artifacts in $DIR/artifacts, log $DIR/server.log"
  cmd_env
}

cmd_stop() {
  [[ -d $DIR ]] || { log "nothing to stop ($DIR absent)"; return 0; }
  exec 9>"$DIR/.lock"
  flock 9
  if server_alive; then
    local pid i
    pid=$(<"$PIDFILE")
    kill -TERM "$pid"
    for ((i = 0; i < 150; i++)); do server_alive || break; sleep 0.1; done
    for (( ; i < 150; i++)); do pgrep -g "$pid" >/dev/null || break; sleep 0.1; done
    if pgrep -g "$pid" >/dev/null; then
      log "server ignored SIGTERM for 15 s; killing its process group"
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    log "stopped mlflow server"
  fi
  rm -f "$PIDFILE"
  stop_postgres
}

cmd_status() {
  if server_alive; then
    read -r HOST PORT <"$DIR/address"
    echo "mlflow server running (pid $(<"$PIDFILE"), backend $(<"$DIR/backend"), $(cat "$DIR/auth-mode" 2>/dev/null || echo open), http://$(client_host):$PORT)"
    if health "$(client_host)" "$PORT"; then echo "health: OK"; else echo "health: NOT answering"; return 1; fi
  else
    echo "mlflow server stopped"
    return 1
  fi
}

case $cmd in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env)
    [[ -s $DIR/address ]] && read -r HOST PORT <"$DIR/address"
    cmd_env
    ;;
  purge)
    cmd_stop
    rm -rf "$DIR"
    log "removed $DIR"
    ;;
  *) usage ;;
esac
