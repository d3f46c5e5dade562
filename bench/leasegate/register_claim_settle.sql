-- pgbench script: leasegate's gated-call hot path as its two statements,
-- the SQL functions the proxy calls (src/ledger/operation.rs) —
-- register-and-claim (with the tenant check), then the settle with its
-- commit and WAL sample (CALL operation_settle_acknowledged). Client N works on run
-- 00000000-0000-7000-8000-<N as 12 digits>, leased by bench-N at epoch 1
-- (set up by bench/gateway). Run with -M prepared. Every call is a
-- new intent (a random step). The lease token's hash is read from the lease
-- row: pgbench cannot know the token leasegate showed once (leasegate sends
-- the hash it holds). Keep it in step with the functions' signatures.
\set n random(1, 900000000000000)
SELECT operation_id AS op, revision AS rev, request_digest AS dg
  FROM operation_register_claim(
    ('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid,
    'bench-' || :client_id, 1,
    (SELECT token_sha256 FROM worker_leases
      WHERE run_id = ('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid),
    ROW('pgbench-' || :client_id || '-' || :n, 'pgbench-' || :n, 1, 'bench__create',
        'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
        jsonb_build_object('n', :n::bigint), 'bench', 'create')::operation_intent,
    'pgbench-' || :client_id, 60000, 'bench') \gset
CALL operation_settle_acknowledged(:op, 'pgbench-' || :client_id, :rev, :dg, 'succeeded',
                                   'remote-' || :n, '{"ok": true}');
