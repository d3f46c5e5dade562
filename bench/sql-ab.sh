#!/usr/bin/env bash
# A/B of leasegate's hot-path SQL on scratch databases: the database CPU
# one gated call costs (register-claim, then settle with its commit and WAL
# sample: bench/leasegate/register_claim_settle.sql), for two versions of
# the schema and functions side by side, in alternating rounds.
#
#   bench/sql-ab.sh A_DIR B_DIR [ROUNDS] [CLIENTS] [SECONDS]
#
# A_DIR and B_DIR are trees holding migrations/ and sql/ (a checkout, or
# `git worktree add /tmp/base <rev>`). Each round builds nothing: the two
# databases (sql_ab_a, sql_ab_b) are made once from the trees' files with
# psql, in the order src/ledger/schema.rs applies them, with 64 runs leased
# by bench-<n> at epoch 1 (pgbench client n works on run n). Then, ROUNDS
# times (default 5), A then B (B then A on odd rounds): pgbench -M prepared
# with CLIENTS clients (default 32) for SECONDS (default 10), and the CPU
# every PostgreSQL process spent in that window read from /proc (utime +
# stime of each backend and auxiliary process, plus the postmaster's
# cutime + cstime for backends that exited), divided by the transactions
# pgbench reports. CPU per call is steadier than calls per second on a
# shared machine; still, compare medians, and run nothing else meanwhile.
#
# Needs: psql and pgbench, a local PostgreSQL reachable as PGHOST/PGPORT/
# PGUSER (default 127.0.0.1:5432, postgres) whose processes this user can
# read in /proc (same host). Drops and recreates sql_ab_a and sql_ab_b (SQL_AB_DB_PREFIX=x: x_a and x_b,
# so that two runs on one server do not clobber each other).
# SCRIPT=<pgbench script> measures another statement than register-claim +
# settle (e.g. bench/leasegate/renew.sql, the single lease renew);
# SCRIPT_B=<pgbench script> runs B with its own script (the same tree twice
# with two scripts: a variant of the statements, e.g. bench/leasegate/settle/).
# PGBENCH_ARGS adds arguments to every pgbench, e.g.
# SCRIPT=bench/leasegate/register_claim_settle_batch.sql PGBENCH_ARGS='-D k=8'
# (k calls per batch, so CLIENTS × k callers); CEILING_CLIENTS runs the
# ceiling with that many clients instead of CLIENTS.
# ONLY_BACKENDS=1 counts only the benchmark's own backends (see
# measure_backends): for a server other work shares. Calls are then the
# operations written, so it measures scripts that write one per call.
# With CEILING=1 each round also measures the minimal ceiling
# (bench/ceiling: schema.sql, fn.sql, hotpath_fn.sql) in sql_ab_ceiling (x_ceiling).
set -euo pipefail

a_dir=${1:?usage: bench/sql-ab.sh A_DIR B_DIR [ROUNDS] [CLIENTS] [SECONDS]}
b_dir=${2:?usage: bench/sql-ab.sh A_DIR B_DIR [ROUNDS] [CLIENTS] [SECONDS]}
rounds=${3:-5}
clients=${4:-32}
seconds=${5:-10}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
here=$(cd "$(dirname "$0")" && pwd)
prefix=${SQL_AB_DB_PREFIX:-sql_ab}
script=${SCRIPT:-"$here/leasegate/register_claim_settle.sql"}
functions=(common process lease run members operation durability secrets access_token retention)

build() { # build <dir> <database>
  local dir=$1 db=$2 f
  PGOPTIONS='-c client_min_messages=warning' psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  {
    echo "SET client_min_messages = warning;"
    # Each migration in its own transaction, the functions in one, as
    # sqlx and src/ledger/schema.rs apply them (0013 needs it).
    for f in "$dir"/migrations/*.sql; do echo "BEGIN;"; cat "$f"; echo; echo "COMMIT;"; done
    echo "BEGIN;"
    for f in "${functions[@]}"; do cat "$dir/sql/$f.sql"; echo; done
    echo "COMMIT;"
    # 64 runs, each leased at epoch 1 by bench-<n>, for ten hours.
    echo "SELECT run_create('bench', 'task-' || n,
            ('00000000-0000-7000-8000-' || lpad(n::text, 12, '0'))::uuid,
            'bench-' || n, 36000000, sha256(convert_to('token-' || n, 'UTF8')))
          FROM generate_series(0, 63) n;"
    echo "ANALYZE;"
  } | psql -qX -v ON_ERROR_STOP=1 -d "$db" >/dev/null
}

# CPU ticks of every PostgreSQL process, reaped children of the postmaster included.
pg_ticks() {
  local total=0 pid f
  for pid in $(pgrep -P "$postmaster") "$postmaster"; do
    [ -r "/proc/$pid/stat" ] || continue
    # Fields after the command's closing parenthesis: utime is 14th, stime 15th,
    # cutime 16th, cstime 17th of the whole line.
    f=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $f
    total=$((total + ${12} + ${13}))
    if [ "$pid" = "$postmaster" ]; then total=$((total + ${14} + ${15})); fi
  done
  echo "$total"
}

# CPU ticks of the given processes.
pid_ticks() {
  local total=0 pid f
  for pid in "$@"; do
    [ -r "/proc/$pid/stat" ] || continue
    f=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $f
    total=$((total + ${12} + ${13}))
  done
  echo "$total"
}

rows() { psql -qtAX -d "$1" -c "SELECT count(*) FROM tool_operations"; }

# ONLY_BACKENDS=1: the CPU of the benchmark's own backends only, over a
# window inside the pgbench run, divided by the operations written in it
# (one per call). For a PostgreSQL server that other work shares (other
# databases' backends would count in pg_ticks); it leaves out the shared
# background processes (WAL writer, checkpointer, autovacuum).
measure_backends() { # measure_backends <database> [script] -> "tps cpu_ms_per_call"
  local db=$1 script=${2:-$script} hz pids t0 t1 n0 n1 pg
  hz=$(getconf CLK_TCK)
  local out
  out=$(mktemp)
  pgbench -n -M prepared -c "$clients" -j 2 -T $((seconds + 3)) ${PGBENCH_ARGS:-} -f "$script" "$db" >"$out" 2>&1 &
  pg=$!
  sleep 1
  pids=$(psql -qtAX -d postgres -c "SELECT pid FROM pg_stat_activity
                                     WHERE datname = '$db' AND application_name = 'pgbench'")
  n0=$(rows "$db"); t0=$(pid_ticks $pids)
  sleep "$seconds"
  t1=$(pid_ticks $pids); n1=$(rows "$db")
  # Every client connected at the start and none ended early: otherwise a
  # backend's CPU would be missing from one of the two samples.
  if ! wait "$pg" || grep -q "aborted\|error" "$out" || [ "$(wc -w <<<"$pids")" -ne "$clients" ]; then
    echo "pgbench failed on $db ($(wc -w <<<"$pids") of $clients backends):" >&2; cat "$out" >&2; exit 1
  fi
  rm -f "$out"
  [ $((n1 - n0)) -gt 0 ] || { echo "no calls on $db" >&2; exit 1; }
  awk -v n=$((n1 - n0)) -v s="$seconds" -v t=$((t1 - t0)) -v hz="$hz" \
    'BEGIN { printf "%.0f %.3f\n", n / s, t * 1000 / hz / n }'
}

measure() { # measure <database> [script] -> "tps cpu_ms_per_call"
  if [ "${ONLY_BACKENDS:-0}" = 1 ]; then measure_backends "$@"; return; fi
  local db=$1 script=${2:-$script} before after out tx hz
  hz=$(getconf CLK_TCK)
  before=$(pg_ticks)
  out=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$seconds" ${PGBENCH_ARGS:-} -f "$script" "$db" 2>&1)
  after=$(pg_ticks)
  tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  [ -n "$tx" ] && [ "$tx" -gt 0 ] || { echo "pgbench failed on $db:" >&2; echo "$out" >&2; exit 1; }
  awk -v tx="$tx" -v s="$seconds" -v t=$((after - before)) -v hz="$hz" \
    'BEGIN { printf "%.0f %.3f\n", tx / s, t * 1000 / hz / tx }'
}

# The postmaster: the oldest process named postgres.
postmaster=$(pgrep -o -x postgres) || { echo "no postgres process on this host" >&2; exit 1; }
build "$a_dir" ${prefix}_a
build "$b_dir" ${prefix}_b
# AFTER_BUILD: a command run once both databases are built, e.g. to set a
# database-level setting on one of them for a variant of the same tree.
if [ -n "${AFTER_BUILD:-}" ]; then eval "$AFTER_BUILD"; fi
if [ "${CEILING:-0}" = 1 ]; then
  PGOPTIONS='-c client_min_messages=warning' psql -qX -d postgres \
    -c "DROP DATABASE IF EXISTS ${prefix}_ceiling" -c "CREATE DATABASE ${prefix}_ceiling" >/dev/null
  PGOPTIONS='-c client_min_messages=warning' psql -qX -v ON_ERROR_STOP=1 -d ${prefix}_ceiling \
    -f "$here/ceiling/schema.sql" -f "$here/ceiling/fn.sql" >/dev/null
fi
echo "A = $a_dir, B = $b_dir${SCRIPT_B:+ with $SCRIPT_B}; $clients clients, ${seconds} s per cell, $rounds rounds"
echo "round  A calls/s  A PG CPU ms/call  B calls/s  B PG CPU ms/call  B/A CPU${CEILING:+  ceiling calls/s  ceiling ms/call}"
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then a=$(measure ${prefix}_a); b=$(measure ${prefix}_b "${SCRIPT_B:-$script}")
  else b=$(measure ${prefix}_b "${SCRIPT_B:-$script}"); a=$(measure ${prefix}_a); fi
  read -r a_tps a_cpu <<<"$a"; read -r b_tps b_cpu <<<"$b"
  printf "%5d  %9s  %16s  %9s  %16s  %7.3f" "$r" "$a_tps" "$a_cpu" "$b_tps" "$b_cpu" \
    "$(awk -v a="$a_cpu" -v b="$b_cpu" 'BEGIN { print b / a }')"
  if [ "${CEILING:-0}" = 1 ]; then
    read -r c_tps c_cpu <<<"$(clients=${CEILING_CLIENTS:-$clients}; measure ${prefix}_ceiling "$here/ceiling/hotpath_fn.sql")"
    printf "  %15s  %15s" "$c_tps" "$c_cpu"
  fi
  echo
done
