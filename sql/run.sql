-- Run transitions: create, start, checkpoint, complete, fail (under the
-- lease), cancel (control plane). Helpers in sql/common.sql.

-- Moves a run under a validated lease: revision CAS from one status to
-- another, with an event. Shared by start, complete and fail. p_token_sha256:
-- the lease token's hash, judged by _lease_fence.
DROP FUNCTION IF EXISTS _run_advance(uuid, text, bigint, bigint, text, text, jsonb, jsonb);
CREATE OR REPLACE FUNCTION _run_advance(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_expected_revision bigint,
  p_from text, p_to text, p_checkpoint jsonb, p_detail jsonb
) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  verdict text;
  found_status text;
  new_revision bigint;
BEGIN
  verdict := _lease_fence(p_run_id, p_owner, p_epoch, p_token_sha256, false);
  IF verdict <> 'valid' THEN
    RETURN _ledger_result(verdict, p_run_id);
  END IF;
  UPDATE agent_runs
     SET status = p_to,
         checkpoint = COALESCE(p_checkpoint, checkpoint),
         revision = revision + 1,
         updated_at = clock_timestamp()
   WHERE run_id = p_run_id AND revision = p_expected_revision AND status = p_from
  RETURNING revision INTO new_revision;
  IF NOT FOUND THEN
    SELECT status INTO found_status FROM agent_runs WHERE run_id = p_run_id;
    RETURN _ledger_result(CASE WHEN found_status <> p_from THEN 'wrong_status' ELSE 'conflict' END, p_run_id);
  END IF;
  IF p_from <> p_to THEN
    INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, revision, detail)
    VALUES (p_run_id, 'run', p_from, p_to, 'worker', p_owner, p_epoch, new_revision, COALESCE(p_detail, '{}'::jsonb));
  END IF;
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- Creates the task if new (in the tenant's shared namespace, kind 'task';
-- the lease modes' tasks are lease_member_join's), a run (pending, revision 0) and its lease row, and
-- points the task's active_run_id at the run, in one transaction (seed 4).
-- p_run_id is chosen by the caller (UUID v7) so that a retry after a lost
-- COMMIT replays instead of creating a second run ('exists').
-- A task whose active run is still pending/running gets 'active_run_live':
-- the caller takes over that run's lease or cancels it first. Terminal runs
-- are never reused; a retry is a new run with attempt + 1 (invariant 6).
-- With p_owner, p_ttl_ms and p_token_sha256 (the SHA-256 of the holder's
-- secret lease token, see _lease_take) the lease is created held (epoch 1).
-- A replay ('exists') changes nothing, the stored token hash included.
DROP FUNCTION IF EXISTS run_create(text, text, uuid, text, bigint);
CREATE OR REPLACE FUNCTION run_create(
  p_tenant_id text, p_task_id text, p_run_id uuid, p_owner text, p_ttl_ms bigint, p_token_sha256 bytea
) RETURNS run_create_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  t agent_tasks;
  r agent_runs;
  next_attempt integer;
  now_ts timestamptz := clock_timestamp();
  res run_create_result;
BEGIN
  IF p_run_id IS NULL THEN
    RAISE EXCEPTION 'run_id must be given' USING ERRCODE = '22023';
  END IF;
  IF p_owner IS NOT NULL THEN
    PERFORM _ledger_check_ttl(p_ttl_ms);
    IF p_owner = '' THEN
      RAISE EXCEPTION 'lease owner must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_token_sha256 IS NULL OR octet_length(p_token_sha256) <> 32 THEN
      RAISE EXCEPTION 'a lease token hash is 32 bytes (SHA-256)' USING ERRCODE = '22023';
    END IF;
  END IF;

  -- Replay of the same create: report what exists, change nothing.
  SELECT * INTO r FROM agent_runs WHERE run_id = p_run_id;
  IF FOUND THEN
    res.outcome := CASE WHEN r.tenant_id = p_tenant_id AND r.task_id = p_task_id AND r.kind = 'task'
                        THEN 'exists' ELSE 'run_id_taken' END;
    res.run_id := r.run_id;
    res.attempt := r.attempt;
    res.run_status := r.status;
    SELECT owner, epoch, expires_at INTO res.lease_owner, res.lease_epoch, res.lease_expires_at
      FROM worker_leases WHERE run_id = p_run_id;
    RETURN res;
  END IF;

  -- The task row lock serialises concurrent creates for one task.
  INSERT INTO agent_tasks (tenant_id, task_id) VALUES (p_tenant_id, p_task_id)
  ON CONFLICT DO NOTHING;
  SELECT * INTO t FROM agent_tasks
   WHERE tenant_id = p_tenant_id AND kind = 'task' AND principal = '' AND task_id = p_task_id FOR UPDATE;

  IF t.active_run_id IS NOT NULL THEN
    SELECT * INTO r FROM agent_runs WHERE run_id = t.active_run_id;
    IF r.status IN ('pending', 'running') THEN
      -- A concurrent replay of this very create committed first.
      res.outcome := CASE WHEN r.run_id = p_run_id THEN 'exists' ELSE 'active_run_live' END;
      res.run_id := r.run_id;
      res.attempt := r.attempt;
      res.run_status := r.status;
      SELECT owner, epoch, expires_at INTO res.lease_owner, res.lease_epoch, res.lease_expires_at
        FROM worker_leases WHERE run_id = r.run_id;
      RETURN res;
    END IF;
  END IF;

  SELECT COALESCE(max(attempt), 0) + 1 INTO next_attempt
    FROM agent_runs WHERE tenant_id = p_tenant_id AND kind = 'task' AND principal = '' AND task_id = p_task_id;

  INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status)
  VALUES (p_run_id, p_tenant_id, p_task_id, next_attempt, 'pending');

  INSERT INTO worker_leases (run_id, owner, epoch, expires_at, token_sha256, updated_at)
  VALUES (p_run_id, p_owner,
          CASE WHEN p_owner IS NULL THEN 0 ELSE 1 END,
          CASE WHEN p_owner IS NULL THEN 'epoch'::timestamptz
               ELSE now_ts + (p_ttl_ms * interval '1 millisecond') END,
          CASE WHEN p_owner IS NULL THEN NULL ELSE p_token_sha256 END,
          now_ts);

  UPDATE agent_tasks SET active_run_id = p_run_id, updated_at = now_ts
   WHERE tenant_id = p_tenant_id AND kind = 'task' AND principal = '' AND task_id = p_task_id;

  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, revision, detail)
  VALUES (p_run_id, 'run', NULL, 'pending', 'system', p_owner, 0,
          jsonb_build_object('tenant_id', p_tenant_id, 'task_id', p_task_id, 'attempt', next_attempt,
                             'previous_run_id', t.active_run_id));
  IF p_owner IS NOT NULL THEN
    INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
    VALUES (p_run_id, 'lease', 'free', 'held', 'worker', p_owner, 1, jsonb_build_object('ttl_ms', p_ttl_ms));
  END IF;

  res.outcome := 'created';
  res.run_id := p_run_id;
  res.attempt := next_attempt;
  res.run_status := 'pending';
  SELECT owner, epoch, expires_at INTO res.lease_owner, res.lease_epoch, res.lease_expires_at
    FROM worker_leases WHERE run_id = p_run_id;
  RETURN res;
END
$$;

-- Save a checkpoint (seed 6): lock lease row -> validate owner, epoch, expiry
-- -> revision CAS on a running run. The loser of two saves with the same
-- expected revision gets 'conflict' (experiment C).
DROP FUNCTION IF EXISTS checkpoint_save(uuid, text, bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION checkpoint_save(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_expected_revision bigint,
  p_checkpoint jsonb
) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_token_sha256, p_expected_revision, 'running', 'running',
                      COALESCE(p_checkpoint, '{}'::jsonb), NULL)
$$;

-- pending -> running, under the lease and a revision CAS.
DROP FUNCTION IF EXISTS run_start(uuid, text, bigint, bigint);
CREATE OR REPLACE FUNCTION run_start(p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea,
                                     p_expected_revision bigint)
RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_token_sha256, p_expected_revision, 'pending', 'running', NULL, NULL)
$$;

-- running -> succeeded, optionally with a final checkpoint.
DROP FUNCTION IF EXISTS run_complete(uuid, text, bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION run_complete(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_expected_revision bigint,
  p_checkpoint jsonb
) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_token_sha256, p_expected_revision, 'running', 'succeeded',
                      p_checkpoint, NULL)
$$;

-- running -> failed (a deterministic business failure). The reason goes to
-- the event history. A worker that lost its lease cannot do this (seed 7).
DROP FUNCTION IF EXISTS run_fail(uuid, text, bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION run_fail(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_expected_revision bigint,
  p_reason jsonb
) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_token_sha256, p_expected_revision, 'running', 'failed', NULL,
                      jsonb_build_object('reason', p_reason))
$$;

-- pending/running -> cancelled, its prepared operations with it. It takes
-- the lease row lock first, so it orders after any protected write in
-- flight, and every later write of the worker sees 'terminal'. Shared by
-- run_cancel (an operator) and run_retire (the lease holder).
CREATE OR REPLACE FUNCTION _run_cancel(p_run_id uuid, p_actor_kind text, p_actor text, p_reason text)
RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  r agent_runs;
  n integer;
BEGIN
  IF p_actor IS NULL OR p_actor = '' THEN
    RAISE EXCEPTION 'cancel needs an actor' USING ERRCODE = '22023';
  END IF;
  l := _lease_lock(p_run_id, false);
  IF l.run_id IS NULL THEN
    RETURN _ledger_result('not_found', p_run_id);
  END IF;
  SELECT * INTO r FROM agent_runs WHERE run_id = p_run_id FOR NO KEY UPDATE;
  IF r.status NOT IN ('pending', 'running') THEN
    RETURN _ledger_result('terminal', p_run_id);
  END IF;
  UPDATE agent_runs SET status = 'cancelled', revision = revision + 1, updated_at = clock_timestamp()
   WHERE run_id = p_run_id;
  WITH cancelled AS (
    UPDATE tool_operations
       SET status = 'cancelled', revision = revision + 1, updated_at = clock_timestamp()
     WHERE run_id = p_run_id AND status = 'prepared'
    RETURNING operation_id, revision
  )
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, revision, detail)
  SELECT p_run_id, c.operation_id, 'operation', 'prepared', 'cancelled', p_actor_kind, p_actor,
         c.revision, jsonb_build_object('reason', p_reason, 'run_cancelled', true)
    FROM cancelled c;
  GET DIAGNOSTICS n = ROW_COUNT;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, revision, detail)
  VALUES (p_run_id, 'run', r.status, 'cancelled', p_actor_kind, p_actor, r.revision + 1,
          jsonb_build_object('reason', p_reason, 'lease_owner', l.owner, 'lease_epoch', l.epoch,
                             'prepared_operations_cancelled', n));
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- Control plane: an operator cancels a run, no lease needed
-- (leasegate_operator only; migrations/0007).
CREATE OR REPLACE FUNCTION run_cancel(p_run_id uuid, p_actor text, p_reason text) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_cancel(p_run_id, 'operator', p_actor, p_reason)
$$;

-- The lease holder ends its own run as cancelled (lease mode `key` retires
-- a run past its retention this way, after taking its lease over): fenced
-- like every worker write (owner, epoch, token), recorded as the worker's.
CREATE OR REPLACE FUNCTION run_retire(p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea,
                                      p_reason text) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict text;
BEGIN
  verdict := _lease_fence(p_run_id, p_owner, p_epoch, p_token_sha256, false);
  IF verdict <> 'valid' THEN
    RETURN _ledger_result(verdict, p_run_id);
  END IF;
  RETURN _run_cancel(p_run_id, 'worker', p_owner, p_reason);
END
$$;

REVOKE EXECUTE ON FUNCTION
  _run_advance(uuid, text, bigint, bytea, bigint, text, text, jsonb, jsonb),
  run_create(text, text, uuid, text, bigint, bytea),
  checkpoint_save(uuid, text, bigint, bytea, bigint, jsonb),
  run_start(uuid, text, bigint, bytea, bigint),
  run_complete(uuid, text, bigint, bytea, bigint, jsonb),
  run_fail(uuid, text, bigint, bytea, bigint, jsonb),
  _run_cancel(uuid, text, text, text),
  run_cancel(uuid, text, text),
  run_retire(uuid, text, bigint, bytea, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  run_create(text, text, uuid, text, bigint, bytea),
  checkpoint_save(uuid, text, bigint, bytea, bigint, jsonb),
  run_start(uuid, text, bigint, bytea, bigint),
  run_complete(uuid, text, bigint, bytea, bigint, jsonb),
  run_fail(uuid, text, bigint, bytea, bigint, jsonb),
  run_retire(uuid, text, bigint, bytea, text)
TO leasegate_app;
-- Cancel is an operator act (migrations/0007); revoked from the app role
-- explicitly, since a database migrated before kept that grant.
REVOKE EXECUTE ON FUNCTION run_cancel(uuid, text, text) FROM leasegate_app;
GRANT EXECUTE ON FUNCTION run_cancel(uuid, text, text) TO leasegate_operator;
