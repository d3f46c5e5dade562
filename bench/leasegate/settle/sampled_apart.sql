-- pgbench script, variant of ../register_claim_settle.sql: the same
-- register-claim, the settle as a plain function in its own autocommit
-- statement, then the WAL sample as a statement of its own after that
-- commit (three statements, three round trips: the contract kept, the
-- procedure gone).
-- pgbench scripts cannot include one another: the register-claim is a copy
-- of ../register_claim_settle.sql's; keep them in step.
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
SELECT outcome FROM operation_settle(:op, 'pgbench-' || :client_id, :rev, :dg, 'succeeded',
                                   'remote-' || :n, '{"ok": true}');
SELECT wal_lsn FROM ledger_wal_position();
