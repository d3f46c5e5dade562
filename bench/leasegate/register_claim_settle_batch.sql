-- pgbench script: leasegate's gated calls as group commit sends them — one
-- operation_register_claim_batch statement of :k calls of :k runs, then
-- one CALL operation_settle_acknowledged_batch — on bench/sql-ab.sh's
-- databases (64 runs, run N leased by bench-N at epoch 1 with the token
-- 'token-N'). Client C works on runs C*k .. C*k+k-1, so clients × k must
-- not pass 64. Set k with pgbench -D k=<calls per batch> (sql-ab.sh:
-- PGBENCH_ARGS='-D k=8'). A transaction is k calls. Run with -M prepared.
\set n random(1, 900000000000000)
SELECT array_agg(b.operation_id ORDER BY b.item) AS ops, array_agg(b.request_digest ORDER BY b.item) AS dgs
  FROM (SELECT array_agg(l.run_id ORDER BY g) AS runs,
               array_agg('bench-' || (:client_id::int * :k::int + g) ORDER BY g) AS owners,
               array_agg(1::bigint) AS epochs,
               array_agg(l.token_sha256 ORDER BY g) AS tokens,
               array_agg(ROW('pgbench-' || :client_id || '-' || :n || '-' || g,
                             'pgbench-' || :n || '-' || g, 1, 'bench__create',
                             'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
                             jsonb_build_object('n', :n::bigint), 'bench', 'create')::operation_intent
                         ORDER BY g) AS intents,
               array_agg('pgbench-' || :client_id) AS dos,
               array_agg(60000::bigint) AS ttls,
               array_agg('bench'::text) AS tenants
          FROM generate_series(0, :k::int - 1) g
          JOIN worker_leases l
            ON l.run_id = ('00000000-0000-7000-8000-' || lpad((:client_id::int * :k::int + g)::text, 12, '0'))::uuid) a,
       operation_register_claim_batch(a.runs, a.owners, a.epochs, a.tokens, a.intents, a.dos, a.ttls,
                                      a.tenants) b \gset
CALL operation_settle_acknowledged_batch(:ops::text[], array_fill('pgbench-' || :client_id, ARRAY[:k::int]),
                                         array_fill(1::bigint, ARRAY[:k::int]), :dgs::text[],
                                         array_fill('succeeded'::text, ARRAY[:k::int]),
                                         array_fill(NULL::text, ARRAY[:k::int]),
                                         array_fill('{"ok": true}'::jsonb, ARRAY[:k::int]));
