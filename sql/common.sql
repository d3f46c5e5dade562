-- Private helpers shared by sql/lease.sql, sql/run.sql and
-- sql/operation.sql: results, argument checks, the lease lock and fence.
-- Not granted to the application role. They carry no `SET search_path`:
-- only SECURITY DEFINER functions that set it call them, and a SET clause
-- costs a GUC save and restore on every call (and keeps a LANGUAGE sql
-- helper from being inlined).

CREATE OR REPLACE FUNCTION _ledger_result(p_outcome text, p_run_id uuid) RETURNS ledger_write_result
LANGUAGE sql VOLATILE AS $$
  SELECT p_outcome, r.status, r.revision, l.owner, l.epoch, l.expires_at, clock_timestamp(),
         NULLIF(current_setting('leasegate.lock_wait_ms', true), '')::double precision,
         NULLIF(current_setting('leasegate.takeover_after_ms', true), '')::double precision
  FROM (SELECT 1) AS one
  LEFT JOIN agent_runs r ON r.run_id = p_run_id
  LEFT JOIN worker_leases l ON l.run_id = p_run_id
$$;

-- A bare 'not_found' answer: nothing about the run is shown.
CREATE OR REPLACE FUNCTION _not_found() RETURNS ledger_write_result
LANGUAGE sql VOLATILE AS $$
  SELECT ROW('not_found', NULL, NULL, NULL, NULL, NULL, clock_timestamp(), NULL, NULL)::ledger_write_result
$$;

CREATE OR REPLACE FUNCTION _ledger_check_ttl(p_ttl_ms bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
    RAISE EXCEPTION 'lease ttl must be > 0 ms, got %', p_ttl_ms USING ERRCODE = '22023';
  END IF;
END
$$;

-- Locks the run's lease row, FOR UPDATE or (p_shared) FOR SHARE, and
-- records how long the lock took in the transaction-local setting
-- leasegate.lock_wait_ms, which _ledger_result and _op_result report.
-- Returns the row, or a row of NULLs when the run has no lease.
CREATE OR REPLACE FUNCTION _lease_lock(p_run_id uuid, p_shared boolean) RETURNS worker_leases
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  l  worker_leases;
  t0 timestamptz := clock_timestamp();
BEGIN
  IF p_shared THEN
    SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR SHARE;
  ELSE
    SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  END IF;
  PERFORM set_config('leasegate.lock_wait_ms',
                     (extract(epoch FROM clock_timestamp() - t0) * 1000)::text, true);
  RETURN l;
END
$$;

-- The fence (invariant 1): locks the lease row and judges the caller's
-- claim on the database clock (invariant 7).
-- Returns: valid | not_found | lease_lost | lease_token_unset |
-- lease_token_invalid | terminal.
--
-- Owner and epoch are the lease's public identity; p_token_sha256 (the
-- SHA-256 of the secret token its taker was shown, migration 0005) is the
-- credential. A stale owner, epoch or expiry is 'lease_lost' as before,
-- whatever token is sent; the current owner and epoch with a missing or
-- wrong token is 'lease_token_invalid', and on a lease taken before 0005
-- (no token stored) 'lease_token_unset' until it is acquired again or taken
-- over. Nothing is written on any of them.
--
-- p_shared = false (run-state writes): the lease row FOR UPDATE, and on
-- 'valid' the run row FOR NO KEY UPDATE too: run-state writes change no
-- key, and the weaker lock still excludes every other writer of the row
-- but lets the foreign-key checks of rows that reference the run (FOR KEY
-- SHARE: a new operation's tool_operations.run_id) through. A settle
-- never waits for a heartbeat of its run, nor a heartbeat for a settle
-- (its event row references nothing since migrations/0011).
-- A lease held by members (lease modes session and key, sql/members.sql)
-- is judged by _member_check instead: p_owner names the member, whose row
-- must be alive with the token; the epoch is the shared lease's.
--
-- p_shared = true (the intent fence): the lease row FOR SHARE. A takeover
-- (which updates the row) still waits for this transaction, so invariant 1
-- holds, while parallel tool calls of one run do not queue behind each
-- other. Every status change of a run holds the lease row FOR UPDATE, so
-- the run status read here is stable until commit.
DROP FUNCTION IF EXISTS _lease_fence(uuid, text, bigint, boolean);
CREATE OR REPLACE FUNCTION _lease_fence(p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea,
                                        p_shared boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  l worker_leases := _lease_lock(p_run_id, p_shared);
  s text;
BEGIN
  IF l.run_id IS NULL THEN
    RETURN 'not_found';
  END IF;
  IF l.held_by_members THEN
    -- A shared lease (sql/members.sql): p_owner is a member.
    s := _member_check(l, p_owner, p_epoch, p_token_sha256);
    IF s IS NOT NULL THEN
      RETURN s;
    END IF;
    IF NOT p_shared THEN
      PERFORM 1 FROM agent_runs WHERE run_id = p_run_id FOR NO KEY UPDATE;
    END IF;
    RETURN 'valid';
  END IF;
  IF l.owner IS DISTINCT FROM p_owner
     OR l.epoch IS DISTINCT FROM p_epoch
     OR l.expires_at <= clock_timestamp() THEN
    RETURN 'lease_lost';
  END IF;
  IF l.token_sha256 IS NULL THEN
    RETURN 'lease_token_unset';
  END IF;
  IF p_token_sha256 IS NULL OR l.token_sha256 <> p_token_sha256 THEN
    RETURN 'lease_token_invalid';
  END IF;
  IF p_shared THEN
    SELECT status INTO s FROM agent_runs WHERE run_id = p_run_id;
  ELSE
    SELECT status INTO s FROM agent_runs WHERE run_id = p_run_id FOR NO KEY UPDATE;
  END IF;
  IF s IN ('succeeded', 'failed', 'cancelled') THEN
    RETURN 'terminal';
  END IF;
  RETURN 'valid';
END
$$;

CREATE OR REPLACE FUNCTION _op_result(p_outcome text, p_run_id uuid, p_operation_id text, p_evidence_id bigint)
RETURNS operation_result
LANGUAGE sql VOLATILE AS $$
  SELECT p_outcome, r.status, r.revision, l.owner, l.epoch, l.expires_at, clock_timestamp(),
         o.operation_id, COALESCE(o.run_id, p_run_id), o.step_id, o.effect_version, o.tool_name,
         o.request_digest, o.status, o.revision, o.dispatch_owner, o.dispatch_until,
         o.dispatch_count, o.remote_id, o.result, p_evidence_id, o.upstream, o.upstream_tool
  FROM (SELECT 1) AS one
  LEFT JOIN tool_operations o ON o.operation_id = p_operation_id
  LEFT JOIN agent_runs r ON r.run_id = COALESCE(o.run_id, p_run_id)
  LEFT JOIN worker_leases l ON l.run_id = COALESCE(o.run_id, p_run_id)
$$;

CREATE OR REPLACE FUNCTION _check_claim_args(p_dispatch_owner text, p_claim_ttl_ms bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_dispatch_owner IS NULL OR p_dispatch_owner = '' THEN
    RAISE EXCEPTION 'dispatch owner must not be empty' USING ERRCODE = '22023';
  END IF;
  IF p_claim_ttl_ms IS NULL OR p_claim_ttl_ms <= 0 THEN
    RAISE EXCEPTION 'claim ttl must be > 0 ms, got %', p_claim_ttl_ms USING ERRCODE = '22023';
  END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION
  _ledger_result(text, uuid),
  _not_found(),
  _ledger_check_ttl(bigint),
  _lease_lock(uuid, boolean),
  _lease_fence(uuid, text, bigint, bytea, boolean),
  _op_result(text, uuid, text, bigint),
  _check_claim_args(text, bigint)
FROM PUBLIC;
