-- pgbench script for bench_scale: 16 gated calls of 16 runs as leasegate's
-- group commit sends them — one operation_register_claim_batch
-- statement, then one CALL operation_settle_acknowledged_batch — with the
-- current signatures (sql/operation.sql). Client N works on runs
-- 00000000-0000-7000-8000-<16N .. 16N+15 as 12 digits>, run R leased by
-- bench-R at epoch 1 (set up by bench_scale). A transaction is 16 calls.
\set n random(1, 900000000000000)
SELECT array_agg(b.operation_id ORDER BY b.item) AS ops, array_agg(b.request_digest ORDER BY b.item) AS dgs
  FROM (SELECT array_agg(l.run_id ORDER BY g) AS runs,
               array_agg('bench-' || (:client_id * 16 + g) ORDER BY g) AS owners,
               array_agg(1::bigint) AS epochs,
               array_agg(l.token_sha256 ORDER BY g) AS tokens,
               array_agg(ROW(bench_op_id(l.run_id, 'bench', 'pgbench-' || :client_id || '-' || :n || '-' || g),
                             'pgbench-' || :n || '-' || g, 1, 'payments__charge',
                             'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
                             jsonb_build_object('n', :n::bigint), NULL, NULL)::operation_intent
                         ORDER BY g) AS intents,
               array_agg('pgbench-' || :client_id) AS dos,
               array_agg(60000::bigint) AS ttls,
               array_agg('bench'::text) AS tenants
          FROM generate_series(0, 15) g
          JOIN worker_leases l
            ON l.run_id = ('00000000-0000-7000-8000-' || lpad((:client_id * 16 + g)::text, 12, '0'))::uuid) a,
       operation_register_claim_batch(a.runs, a.owners, a.epochs, a.tokens, a.intents, a.dos, a.ttls,
                                      a.tenants) b \gset
CALL operation_settle_acknowledged_batch(:ops::text[], array_fill('pgbench-' || :client_id, ARRAY[16]),
                                         array_fill(1::bigint, ARRAY[16]), :dgs::text[],
                                         array_fill('succeeded'::text, ARRAY[16]),
                                         array_fill(NULL::text, ARRAY[16]),
                                         array_fill('{"ok": true}'::jsonb, ARRAY[16]));
