-- pgbench script: the array building of bench_cycle alone (the harness floor); -D k=<calls>.
\set n random(1, 900000000000000)
SELECT cardinality(intents) FROM bench_intents(:client_id, :k, :n);
