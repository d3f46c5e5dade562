#!/usr/bin/env bash
# Runs a benchmark with PostgreSQL on cores of its own: every process of
# the local PostgreSQL server (the postmaster, its auxiliary processes and
# so every backend it forks from now on) is pinned to DB_CPUS, the command
# to the other cores (CLIENT_CPUS), and PostgreSQL's affinity is given back
# when the command ends, however it ends.
#
#   bench/pinned.sh COMMAND [ARGS...]
#   DB_CPUS=0 CLIENT_CPUS=1 bench/pinned.sh target/release/examples/bench_gateway --single-path ...
#
# What it is for: on a host where the database shares its cores with
# leasegate, the upstream and the load generator, a ratio to the pgbench
# ceiling measures how little CPU those processes use as much as how fast
# leasegate is (bench/results/2026-12-02-where-the-cpu-goes.md). Split like this, the
# database and the rest each have their own cores, as when PostgreSQL runs
# on its own host, and the ceiling (pgbench on CLIENT_CPUS) is measured in
# the same split. The split is not free: neither side can use the other's
# idle core. Defaults: DB_CPUS=0, CLIENT_CPUS=1 (a 2-core machine).
#
# Needs: taskset (util-linux), permission to set the PostgreSQL processes'
# affinity (root, or the postgres user).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: bench/pinned.sh COMMAND [ARGS...]" >&2; exit 2; }
db_cpus=${DB_CPUS:-0}
client_cpus=${CLIENT_CPUS:-1}
all_cpus="0-$(($(nproc --all) - 1))"
postmaster=$(pgrep -o -x postgres) || { echo "no postgres process on this host" >&2; exit 1; }

pin_postgres() { # pin_postgres <cpu list>
  local pid
  for pid in "$postmaster" $(pgrep -P "$postmaster"); do
    taskset -a -p -c "$1" "$pid" >/dev/null 2>&1 || true
  done
}
trap 'pin_postgres "$all_cpus"' EXIT
pin_postgres "$db_cpus"
echo "bench/pinned.sh: PostgreSQL (postmaster $postmaster) on CPUs $db_cpus, the command on CPUs $client_cpus" >&2
taskset -c "$client_cpus" "$@"
