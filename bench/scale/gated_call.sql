-- pgbench script for bench_scale: one gated call as leasegate's hot path
-- makes it — register-and-claim, then settle — with the current signatures
-- (sql/operation.sql). Client N works on run
-- 00000000-0000-7000-8000-<N as 12 digits>, leased by bench-N at epoch 1
-- (set up by bench_scale). Operation ids: bench_op_id (bench_scale), the
-- shape leasegate gives them. The lease token's hash is read from the lease
-- row (pgbench cannot know the token leasegate showed once).
\set n random(1, 900000000000000)
SELECT operation_id AS op, revision AS rev, request_digest AS dg
  FROM operation_register_claim(
    ('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid,
    'bench-' || :client_id, 1,
    (SELECT token_sha256 FROM worker_leases
      WHERE run_id = ('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid),
    jsonb_populate_record(NULL::operation_intent,
      jsonb_build_object('operation_id',
                         bench_op_id(('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid,
                                     'bench', 'pgbench-' || :client_id || '-' || :n),
                         'step_id', 'pgbench-' || :n, 'effect_version', 1,
                         'tool_name', 'payments__charge',
                         'request_digest', 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
                         'request_body', jsonb_build_object('n', :n::bigint))),
    'pgbench-' || :client_id, 60000, 'bench') \gset
CALL operation_settle_acknowledged(:op, 'pgbench-' || :client_id, :rev, :dg, 'succeeded',
                                   'remote-' || :n, '{"ok": true}');
