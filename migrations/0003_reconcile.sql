-- leasegate reconciler: claims on unknown operations, so that with many
-- leasegate processes each unknown operation is worked on by one reconciler
-- at a time (no leader needed), and late responses as convergence evidence.
--
-- A reconcile claim never changes the operation's status: it stays
-- 'unknown' until operation_converge settles it from evidence. The claim
-- bumps the revision, so a converge prepared under an older read fails its
-- revision guard.

ALTER TABLE tool_operations
  ADD COLUMN reconcile_owner    text,
  ADD COLUMN reconcile_until    timestamptz,
  -- Retries with the same key (idempotency_key tools) done by reconcilers.
  ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0 CHECK (reconcile_attempts >= 0),
  ADD COLUMN first_dispatched_at timestamptz;

-- First dispatch time, for key-retention windows: set by the claim helpers.
CREATE OR REPLACE FUNCTION _op_claim(p_operation_id text, p_dispatch_owner text, p_claim_ttl_ms bigint,
                                     p_actor_kind text, p_epoch bigint, p_detail jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  UPDATE tool_operations
     SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
         dispatch_until = clock_timestamp() + (p_claim_ttl_ms * interval '1 millisecond'),
         dispatch_count = dispatch_count + 1, revision = revision + 1, updated_at = clock_timestamp(),
         first_dispatched_at = COALESCE(first_dispatched_at, clock_timestamp())
   WHERE operation_id = p_operation_id AND status = 'prepared'
  RETURNING * INTO o;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, epoch, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'prepared', 'dispatching', p_actor_kind,
          p_dispatch_owner, p_epoch, o.revision,
          p_detail || jsonb_build_object('dispatch_until', o.dispatch_until));
END
$$;

CREATE OR REPLACE FUNCTION operation_claim(p_dispatch_owner text, p_claim_ttl_ms bigint, p_limit integer)
RETURNS SETOF tool_operations
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  PERFORM _check_claim_args(p_dispatch_owner, p_claim_ttl_ms);
  IF p_limit IS NULL OR p_limit <= 0 OR p_limit > 1000 THEN
    RAISE EXCEPTION 'claim batch must be 1..1000, got %', p_limit USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH candidate AS MATERIALIZED (
    SELECT o.operation_id
      FROM tool_operations o
      JOIN agent_runs r ON r.run_id = o.run_id
     WHERE o.status = 'prepared'
       AND r.status IN ('pending', 'running')
     ORDER BY o.updated_at
     LIMIT p_limit
       FOR UPDATE OF o SKIP LOCKED
  ), claimed AS (
    UPDATE tool_operations o
       SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
           dispatch_until = clock_timestamp() + (p_claim_ttl_ms * interval '1 millisecond'),
           dispatch_count = o.dispatch_count + 1, revision = o.revision + 1,
           updated_at = clock_timestamp(),
           first_dispatched_at = COALESCE(o.first_dispatched_at, clock_timestamp())
      FROM candidate c
     WHERE o.operation_id = c.operation_id AND o.status = 'prepared'
    RETURNING o.*
  ), logged AS (
    INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                               actor, revision, detail)
    SELECT c.run_id, c.operation_id, 'operation', 'prepared', 'dispatching', 'dispatcher',
           p_dispatch_owner, c.revision, jsonb_build_object('dispatch_until', c.dispatch_until)
      FROM claimed c
  )
  SELECT * FROM claimed;
END
$$;

-- Claims up to p_limit unknown operations for one reconciler until
-- p_ttl_ms from now: those nobody holds, or whose reconcile claim lapsed.
-- The status stays 'unknown'; the revision moves. SKIP LOCKED + MATERIALIZED
-- as for dispatch claims. p_retry: count a same-key retry attempt.
CREATE FUNCTION operation_reconcile_claim(p_owner text, p_ttl_ms bigint, p_limit integer)
RETURNS SETOF tool_operations
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  PERFORM _check_claim_args(p_owner, p_ttl_ms);
  IF p_limit IS NULL OR p_limit <= 0 OR p_limit > 1000 THEN
    RAISE EXCEPTION 'claim batch must be 1..1000, got %', p_limit USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH candidate AS MATERIALIZED (
    SELECT o.operation_id
      FROM tool_operations o
     WHERE o.status = 'unknown'
       AND (o.reconcile_until IS NULL OR o.reconcile_until <= clock_timestamp())
     ORDER BY o.updated_at
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  )
  UPDATE tool_operations o
     SET reconcile_owner = p_owner,
         reconcile_until = clock_timestamp() + (p_ttl_ms * interval '1 millisecond'),
         revision = o.revision + 1
    FROM candidate c
   WHERE o.operation_id = c.operation_id AND o.status = 'unknown'
  RETURNING o.*;
END
$$;

-- A reconciler asks to retry an operation with its same key, under its
-- reconcile claim: allowed only inside the provider's key retention window
-- (from the first dispatch, on the database clock) and within the retry
-- budget. Counted before the call leaves, so a crash cannot hide an attempt.
-- outcome: attempt | window_passed | budget_spent | stale_claim.
CREATE FUNCTION operation_reconcile_attempt(
  p_operation_id text, p_owner text, p_expected_revision bigint, p_retention_ms bigint, p_max_attempts integer,
  OUT outcome text, OUT revision bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND OR o.status <> 'unknown' OR o.reconcile_owner IS DISTINCT FROM p_owner
     OR o.revision <> p_expected_revision OR o.reconcile_until <= clock_timestamp() THEN
    outcome := 'stale_claim';
    RETURN;
  END IF;
  revision := o.revision;
  IF o.first_dispatched_at IS NULL
     OR o.first_dispatched_at + (p_retention_ms * interval '1 millisecond') <= clock_timestamp() THEN
    outcome := 'window_passed';
    RETURN;
  END IF;
  IF o.reconcile_attempts >= p_max_attempts THEN
    outcome := 'budget_spent';
    RETURN;
  END IF;
  UPDATE tool_operations
     SET reconcile_attempts = reconcile_attempts + 1, revision = tool_operations.revision + 1
   WHERE operation_id = p_operation_id
  RETURNING tool_operations.revision INTO revision;
  outcome := 'attempt';
END
$$;

-- Convergence now also accepts a late response (kept as evidence by a
-- settle that lost its claim) as verified evidence, via the reconciler.
CREATE OR REPLACE FUNCTION operation_converge(
  p_operation_id text, p_expected_revision bigint, p_status text, p_remote_id text,
  p_result jsonb, p_kind text, p_actor text, p_note text, p_evidence jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o  tool_operations;
  ev bigint;
  evidence_kind text := CASE WHEN p_kind = 'late_response' THEN 'query_result' ELSE p_kind END;
BEGIN
  IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'converge status must be succeeded or failed_final, got %', p_status USING ERRCODE = '22023';
  END IF;
  IF p_kind IS NULL OR p_kind NOT IN ('query_result', 'retry_result', 'operator', 'late_response') THEN
    RAISE EXCEPTION 'converge evidence must be query_result, retry_result, late_response or operator, got %', p_kind
      USING ERRCODE = '22023';
  END IF;
  IF p_actor IS NULL OR p_actor = '' THEN
    RAISE EXCEPTION 'converge needs an actor' USING ERRCODE = '22023';
  END IF;
  IF p_kind = 'operator' AND (p_note IS NULL OR btrim(p_note) = '') THEN
    RAISE EXCEPTION 'an operator resolution needs a note' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', NULL, p_operation_id, NULL);
  END IF;
  IF o.status <> 'unknown' THEN
    RETURN _op_result('not_unknown', o.run_id, p_operation_id, NULL);
  END IF;
  IF o.revision <> p_expected_revision THEN
    RETURN _op_result('conflict', o.run_id, p_operation_id, NULL);
  END IF;
  INSERT INTO operation_evidence (operation_id, kind, source, outcome, remote_id, body)
  VALUES (p_operation_id, evidence_kind, p_actor, p_status, p_remote_id,
          COALESCE(p_evidence, '{}'::jsonb)
            || jsonb_build_object('note', p_note, 'result', p_result, 'converged_from', p_kind))
  RETURNING evidence_id INTO ev;
  UPDATE tool_operations
     SET status = p_status, remote_id = COALESCE(p_remote_id, remote_id),
         result = COALESCE(p_result, result), revision = revision + 1, updated_at = clock_timestamp(),
         reconcile_owner = NULL, reconcile_until = NULL
   WHERE operation_id = p_operation_id;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'unknown', p_status,
          CASE WHEN p_kind = 'operator' THEN 'operator' ELSE 'reconciler' END, p_actor, o.revision + 1,
          jsonb_build_object('evidence_id', ev, 'kind', p_kind, 'note', p_note, 'remote_id', p_remote_id));
  RETURN _op_result('converged', o.run_id, p_operation_id, ev);
END
$$;

REVOKE EXECUTE ON FUNCTION
  operation_reconcile_claim(text, bigint, integer),
  operation_reconcile_attempt(text, text, bigint, bigint, integer)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  operation_reconcile_claim(text, bigint, integer),
  operation_reconcile_attempt(text, text, bigint, bigint, integer)
TO leasegate_app;

-- ---------------------------------------------------------------------------
-- Observability: every fenced write reports how long it waited for the
-- lease row lock, and a takeover how long the lease had been expired.
-- The wait is measured around the row lock and carried to the result in a
-- transaction-local setting (no signature changes).
-- ---------------------------------------------------------------------------

ALTER TYPE ledger_write_result ADD ATTRIBUTE lock_wait_ms double precision;
ALTER TYPE ledger_write_result ADD ATTRIBUTE takeover_after_ms double precision;

CREATE OR REPLACE FUNCTION _ledger_result(p_outcome text, p_run_id uuid) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SET search_path = public, pg_temp AS $$
  SELECT p_outcome, r.status, r.revision, l.owner, l.epoch, l.expires_at, clock_timestamp(),
         NULLIF(current_setting('leasegate.lock_wait_ms', true), '')::double precision,
         NULLIF(current_setting('leasegate.takeover_after_ms', true), '')::double precision
  FROM (SELECT 1) AS one
  LEFT JOIN agent_runs r ON r.run_id = p_run_id
  LEFT JOIN worker_leases l ON l.run_id = p_run_id
$$;

CREATE OR REPLACE FUNCTION _lease_fence(p_run_id uuid, p_owner text, p_epoch bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  s text;
  t0 timestamptz := clock_timestamp();
  found_lease boolean;
BEGIN
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  found_lease := FOUND;  -- PERFORM below resets FOUND
  PERFORM set_config('leasegate.lock_wait_ms',
                     (extract(epoch FROM clock_timestamp() - t0) * 1000)::text, true);
  IF NOT found_lease THEN
    RETURN 'not_found';
  END IF;
  IF l.owner IS DISTINCT FROM p_owner
     OR l.epoch IS DISTINCT FROM p_epoch
     OR l.expires_at <= clock_timestamp() THEN
    RETURN 'lease_lost';
  END IF;
  SELECT status INTO s FROM agent_runs WHERE run_id = p_run_id FOR UPDATE;
  IF s IN ('succeeded', 'failed', 'cancelled') THEN
    RETURN 'terminal';
  END IF;
  RETURN 'valid';
END
$$;

CREATE OR REPLACE FUNCTION lease_acquire(p_run_id uuid, p_owner text, p_ttl_ms bigint) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  s text;
  now_ts timestamptz;
  t0 timestamptz := clock_timestamp();
  found_lease boolean;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  IF p_owner IS NULL OR p_owner = '' THEN
    RAISE EXCEPTION 'lease owner must not be empty' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  found_lease := FOUND;  -- PERFORM below resets FOUND
  PERFORM set_config('leasegate.lock_wait_ms',
                     (extract(epoch FROM clock_timestamp() - t0) * 1000)::text, true);
  IF NOT found_lease THEN
    RETURN _ledger_result('not_found', p_run_id);
  END IF;
  SELECT status INTO s FROM agent_runs WHERE run_id = p_run_id;
  IF s IN ('succeeded', 'failed', 'cancelled') THEN
    RETURN _ledger_result('terminal', p_run_id);
  END IF;
  now_ts := clock_timestamp();
  IF l.owner IS NOT NULL AND l.expires_at > now_ts THEN
    RETURN _ledger_result('busy', p_run_id);
  END IF;
  IF l.owner IS NOT NULL THEN
    PERFORM set_config('leasegate.takeover_after_ms',
                       (extract(epoch FROM now_ts - l.expires_at) * 1000)::text, true);
  END IF;
  UPDATE worker_leases
     SET owner = p_owner,
         epoch = epoch + 1,
         expires_at = now_ts + (p_ttl_ms * interval '1 millisecond'),
         updated_at = now_ts
   WHERE run_id = p_run_id;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
  VALUES (p_run_id, 'lease', CASE WHEN l.owner IS NULL THEN 'free' ELSE 'expired' END, 'held',
          'worker', p_owner, l.epoch + 1,
          jsonb_build_object('ttl_ms', p_ttl_ms, 'previous_owner', l.owner, 'previous_epoch', l.epoch,
                             'previous_expires_at', l.expires_at));
  RETURN _ledger_result(CASE WHEN l.owner IS NULL THEN 'acquired' ELSE 'taken_over' END, p_run_id);
END
$$;
