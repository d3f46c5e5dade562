-- pgbench script for bench/sql-ab.sh: one CALL of bench_cycle per transaction (k calls;
-- set -D k=<calls per batch> -D ops={} -D dgs={}); see bench/leasegate/cycle/README.md.
\set n random(1, 900000000000000)
CALL bench_cycle(:client_id, :k, :n, :ops::text[], :dgs::text[], NULL, NULL, NULL) \gset
