-- pgbench script: leasegate's own single-lease renew, the SQL function the
-- control API's POST /v1/runs/{run_id}/lease/renew calls. Client N renews
-- run 00000000-0000-7000-8000-<N as 12 digits>, leased by bench-N at epoch 1
-- (set up by bench/gateway, as bench/operations does).
-- The lease token's hash is read from the lease row: pgbench cannot know the
-- token leasegate showed once (the control API hashes the token it is sent).
-- The tenant is the served process's (`tenant = "bench"`), checked in the
-- same statement as the control API's renew route checks it.
-- Run with -M prepared.
SELECT outcome FROM lease_renew(
    ('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid,
    'bench-' || :client_id, 1,
    (SELECT token_sha256 FROM worker_leases
      WHERE run_id = ('00000000-0000-7000-8000-' || lpad(:client_id::text, 12, '0'))::uuid),
    600000, 'bench');
