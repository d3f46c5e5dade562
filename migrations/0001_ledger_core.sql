-- leasegate ledger core: tasks, runs, leases, the operations table, the
-- append-only event log, and every protected transition as ONE SQL function.
--
-- Conventions (see src/ledger/mod.rs for the invariants they enforce):
--   * Every function runs inside the caller's single statement, so one call is
--     one short transaction. No function waits on anything but row locks.
--   * Lock order is always: worker_leases row -> agent_runs row -> agent_tasks
--     row. Every status change of a run holds its lease row lock, so reading
--     the run's status under that lock is consistent.
--   * All time is clock_timestamp() of this database (invariant 7).
--   * Functions are SECURITY DEFINER with a pinned search_path; the
--     application role may EXECUTE them and SELECT, nothing else (seed 12).
--   * Functions return an outcome string instead of raising for expected
--     rejections (lease lost, conflict, busy, ...). They raise SQLSTATE 22023
--     only for input the Rust layer should never have sent.

-- ---------------------------------------------------------------------------
-- Tables (seed section 4). Every seed column and CHECK is kept; additions are
-- marked "leasegate:".
-- ---------------------------------------------------------------------------

CREATE TABLE agent_tasks (
  -- leasegate: tenant isolation. The key is (tenant_id, task_id) so two
  -- tenants may use the same task name without seeing each other.
  tenant_id     text NOT NULL CHECK (tenant_id <> '' AND length(tenant_id) <= 128),
  task_id       text NOT NULL CHECK (task_id <> '' AND length(task_id) <= 256),
  active_run_id uuid,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (tenant_id, task_id)
);

CREATE TABLE agent_runs (
  run_id       uuid PRIMARY KEY,
  tenant_id    text NOT NULL, -- leasegate: part of the task key
  task_id      text NOT NULL,
  -- leasegate: 1 for the first run of a task, +1 for each retry.
  attempt      integer NOT NULL CHECK (attempt > 0),
  status       text NOT NULL CHECK (status IN ('pending','running','succeeded','failed','cancelled')),
  revision     bigint NOT NULL DEFAULT 0 CHECK (revision >= 0),
  checkpoint   jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, task_id),
  UNIQUE (tenant_id, task_id, attempt)
);
CREATE INDEX agent_runs_task_created_idx ON agent_runs (tenant_id, task_id, created_at DESC);

ALTER TABLE agent_tasks
  ADD CONSTRAINT agent_tasks_active_run_fk FOREIGN KEY (active_run_id) REFERENCES agent_runs (run_id);

CREATE TABLE worker_leases (
  run_id       uuid PRIMARY KEY REFERENCES agent_runs(run_id),
  owner        text,
  epoch        bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
  expires_at   timestamptz NOT NULL DEFAULT 'epoch',
  updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE tool_operations (
  operation_id   text PRIMARY KEY,
  run_id         uuid NOT NULL REFERENCES agent_runs(run_id),
  step_id        text NOT NULL,
  effect_version integer NOT NULL CHECK (effect_version > 0),
  tool_name      text NOT NULL,
  request_digest text NOT NULL,
  request_body   jsonb NOT NULL,
  status         text NOT NULL CHECK (status IN ('prepared','dispatching','unknown','succeeded','failed_final','cancelled')),
  dispatch_owner text,
  dispatch_until timestamptz,
  remote_id      text,
  result         jsonb,
  revision       bigint NOT NULL DEFAULT 0,
  updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (run_id, step_id, effect_version)
);
CREATE INDEX tool_operations_reconcile_idx ON tool_operations(status, dispatch_until, updated_at);

-- Append-only history of every status change: runs, leases and (from the
-- operations migration on) tool operations. Invariant 8: nothing is deleted,
-- every change says who made it.
CREATE TABLE ledger_events (
  event_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at           timestamptz NOT NULL DEFAULT clock_timestamp(),
  run_id       uuid NOT NULL REFERENCES agent_runs (run_id),
  operation_id text REFERENCES tool_operations (operation_id),
  subject      text NOT NULL CHECK (subject IN ('run','lease','operation')),
  -- NULL for the creation of the subject.
  from_status  text,
  to_status    text NOT NULL,
  actor_kind   text NOT NULL CHECK (actor_kind IN ('worker','operator','dispatcher','reconciler','system')),
  -- The lease owner, operator name or dispatch owner that made the change.
  actor        text,
  -- The lease epoch under which the change was made (NULL for the control plane).
  epoch        bigint,
  -- The subject's revision after the change.
  revision     bigint,
  detail       jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX ledger_events_run_idx ON ledger_events (run_id, event_id);
CREATE INDEX ledger_events_operation_idx ON ledger_events (operation_id, event_id)
  WHERE operation_id IS NOT NULL;

CREATE FUNCTION ledger_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'ledger_events is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER ledger_events_append_only BEFORE UPDATE OR DELETE ON ledger_events
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();
CREATE TRIGGER ledger_events_no_truncate BEFORE TRUNCATE ON ledger_events
  FOR EACH STATEMENT EXECUTE FUNCTION ledger_events_refuse_change();

-- ---------------------------------------------------------------------------
-- Results
-- ---------------------------------------------------------------------------

-- What every fenced write returns: the verdict plus what the caller needs to
-- name "expected vs found" without a second round trip.
--   outcome: applied | acquired | taken_over | lease_lost | conflict |
--            wrong_status | terminal | busy | not_found
CREATE TYPE ledger_write_result AS (
  outcome          text,
  run_status       text,
  revision         bigint,
  lease_owner      text,
  lease_epoch      bigint,
  lease_expires_at timestamptz,
  db_now           timestamptz
);

CREATE TYPE run_create_result AS (
  -- created | exists (same run_id replayed) | active_run_live | run_id_taken
  outcome          text,
  run_id           uuid,
  attempt          integer,
  run_status       text,
  lease_owner      text,
  lease_epoch      bigint,
  lease_expires_at timestamptz
);

-- ---------------------------------------------------------------------------
-- Private helpers (not granted to the application role)
-- ---------------------------------------------------------------------------

CREATE FUNCTION _ledger_result(p_outcome text, p_run_id uuid) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SET search_path = public, pg_temp AS $$
  SELECT p_outcome, r.status, r.revision, l.owner, l.epoch, l.expires_at, clock_timestamp()
  FROM (SELECT 1) AS one
  LEFT JOIN agent_runs r ON r.run_id = p_run_id
  LEFT JOIN worker_leases l ON l.run_id = p_run_id
$$;

CREATE FUNCTION _ledger_check_ttl(p_ttl_ms bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
    RAISE EXCEPTION 'lease ttl must be > 0 ms, got %', p_ttl_ms USING ERRCODE = '22023';
  END IF;
END
$$;

-- Locks the lease row FOR UPDATE (invariant 1) and judges the caller's claim
-- on the database clock (invariant 7). On 'valid' the run row is locked too.
-- Returns: valid | not_found | lease_lost | terminal.
CREATE FUNCTION _lease_fence(p_run_id uuid, p_owner text, p_epoch bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  s text;
BEGIN
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
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

-- Moves a run under a validated lease: revision CAS from one status to
-- another, with an event. Shared by start, complete and fail.
CREATE FUNCTION _run_advance(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint,
  p_from text, p_to text, p_checkpoint jsonb, p_detail jsonb
) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  verdict text;
  found_status text;
  new_revision bigint;
BEGIN
  verdict := _lease_fence(p_run_id, p_owner, p_epoch);
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

-- ---------------------------------------------------------------------------
-- Protected transitions (the application's only write path)
-- ---------------------------------------------------------------------------

-- Creates the task if new, a run (pending, revision 0) and its lease row, and
-- points the task's active_run_id at the run, in one transaction (seed 4).
-- p_run_id is chosen by the caller (UUID v7) so that a retry after a lost
-- COMMIT replays instead of creating a second run ('exists').
-- A task whose active run is still pending/running gets 'active_run_live':
-- the caller takes over that run's lease or cancels it first. Terminal runs
-- are never reused; a retry is a new run with attempt + 1 (invariant 6).
-- With p_owner and p_ttl_ms the lease is created held (epoch 1).
CREATE FUNCTION run_create(
  p_tenant_id text, p_task_id text, p_run_id uuid, p_owner text, p_ttl_ms bigint
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
  END IF;

  -- Replay of the same create: report what exists, change nothing.
  SELECT * INTO r FROM agent_runs WHERE run_id = p_run_id;
  IF FOUND THEN
    res.outcome := CASE WHEN r.tenant_id = p_tenant_id AND r.task_id = p_task_id
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
  SELECT * INTO t FROM agent_tasks WHERE tenant_id = p_tenant_id AND task_id = p_task_id FOR UPDATE;

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
    FROM agent_runs WHERE tenant_id = p_tenant_id AND task_id = p_task_id;

  INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status)
  VALUES (p_run_id, p_tenant_id, p_task_id, next_attempt, 'pending');

  INSERT INTO worker_leases (run_id, owner, epoch, expires_at, updated_at)
  VALUES (p_run_id, p_owner,
          CASE WHEN p_owner IS NULL THEN 0 ELSE 1 END,
          CASE WHEN p_owner IS NULL THEN 'epoch'::timestamptz
               ELSE now_ts + (p_ttl_ms * interval '1 millisecond') END,
          now_ts);

  UPDATE agent_tasks SET active_run_id = p_run_id, updated_at = now_ts
   WHERE tenant_id = p_tenant_id AND task_id = p_task_id;

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

-- Acquire a free lease or take over an expired one (seed 5.1): epoch + 1,
-- new owner, expiry on the database clock. A held, unexpired lease is 'busy'
-- (the result names its owner and expiry); a run in a terminal status is
-- 'terminal'. A concurrent protected write holding the row lock makes this
-- wait, then judge the row as that transaction left it (experiment D).
CREATE FUNCTION lease_acquire(p_run_id uuid, p_owner text, p_ttl_ms bigint) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  s text;
  now_ts timestamptz;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  IF p_owner IS NULL OR p_owner = '' THEN
    RAISE EXCEPTION 'lease owner must not be empty' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
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
  UPDATE worker_leases
     SET owner = p_owner,
         epoch = epoch + 1,
         expires_at = now_ts + (p_ttl_ms * interval '1 millisecond'),
         updated_at = now_ts
   WHERE run_id = p_run_id;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
  VALUES (p_run_id, 'lease', CASE WHEN l.owner IS NULL THEN 'free' ELSE 'expired' END, 'held',
          'worker', p_owner, l.epoch + 1,
          jsonb_build_object('ttl_ms', p_ttl_ms, 'previous_owner', l.owner, 'previous_epoch', l.epoch));
  RETURN _ledger_result(CASE WHEN l.owner IS NULL THEN 'acquired' ELSE 'taken_over' END, p_run_id);
END
$$;

-- Renew (seed 5.2): only the current owner and epoch, only before expiry. An
-- expired lease is never resurrected, even if nobody took it over. A run that
-- became terminal (e.g. cancelled by an operator) is 'terminal', so the
-- worker's heartbeat stops it.
CREATE FUNCTION lease_renew(p_run_id uuid, p_owner text, p_epoch bigint, p_ttl_ms bigint) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict text;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  verdict := _lease_fence(p_run_id, p_owner, p_epoch);
  IF verdict <> 'valid' THEN
    RETURN _ledger_result(verdict, p_run_id);
  END IF;
  UPDATE worker_leases
     SET expires_at = clock_timestamp() + (p_ttl_ms * interval '1 millisecond'),
         updated_at = clock_timestamp()
   WHERE run_id = p_run_id;
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- Release (seed 5.2): the owner gives the lease up. The epoch is never zeroed,
-- so the next acquire gets epoch + 1. An expired lease may still be released
-- by its owner as long as nobody took it over; the run's status is not judged
-- (a worker releases after completing).
CREATE FUNCTION lease_release(p_run_id uuid, p_owner text, p_epoch bigint) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
BEGIN
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _ledger_result('not_found', p_run_id);
  END IF;
  IF l.owner IS DISTINCT FROM p_owner OR l.epoch IS DISTINCT FROM p_epoch THEN
    RETURN _ledger_result('lease_lost', p_run_id);
  END IF;
  UPDATE worker_leases
     SET owner = NULL, expires_at = clock_timestamp(), updated_at = clock_timestamp()
   WHERE run_id = p_run_id;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch)
  VALUES (p_run_id, 'lease', 'held', 'free', 'worker', p_owner, p_epoch);
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- Save a checkpoint (seed 6): lock lease row -> validate owner, epoch, expiry
-- -> revision CAS on a running run. The loser of two saves with the same
-- expected revision gets 'conflict' (experiment C).
CREATE FUNCTION checkpoint_save(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint, p_checkpoint jsonb
) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_expected_revision, 'running', 'running',
                      COALESCE(p_checkpoint, '{}'::jsonb), NULL)
$$;

-- pending -> running, under the lease and a revision CAS.
CREATE FUNCTION run_start(p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint)
RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_expected_revision, 'pending', 'running', NULL, NULL)
$$;

-- running -> succeeded, optionally with a final checkpoint.
CREATE FUNCTION run_complete(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint, p_checkpoint jsonb
) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_expected_revision, 'running', 'succeeded',
                      p_checkpoint, NULL)
$$;

-- running -> failed (a deterministic business failure). The reason goes to
-- the event history. A worker that lost its lease cannot do this (seed 7).
CREATE FUNCTION run_fail(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint, p_reason jsonb
) RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _run_advance(p_run_id, p_owner, p_epoch, p_expected_revision, 'running', 'failed', NULL,
                      jsonb_build_object('reason', p_reason))
$$;

-- Control plane: pending/running -> cancelled, no lease needed. It still
-- takes the lease row lock first, so it orders after any protected write in
-- flight, and every later write of the worker sees 'terminal'.
CREATE FUNCTION run_cancel(p_run_id uuid, p_actor text, p_reason text) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  r agent_runs;
BEGIN
  IF p_actor IS NULL OR p_actor = '' THEN
    RAISE EXCEPTION 'cancel needs an actor' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _ledger_result('not_found', p_run_id);
  END IF;
  SELECT * INTO r FROM agent_runs WHERE run_id = p_run_id FOR UPDATE;
  IF r.status NOT IN ('pending', 'running') THEN
    RETURN _ledger_result('terminal', p_run_id);
  END IF;
  UPDATE agent_runs SET status = 'cancelled', revision = revision + 1, updated_at = clock_timestamp()
   WHERE run_id = p_run_id;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, revision, detail)
  VALUES (p_run_id, 'run', r.status, 'cancelled', 'operator', p_actor, r.revision + 1,
          jsonb_build_object('reason', p_reason, 'lease_owner', l.owner, 'lease_epoch', l.epoch));
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- ---------------------------------------------------------------------------
-- Permissions (seed 12): the application role may run the protected
-- transitions and read, and nothing else. Roles are cluster-wide while this
-- migration runs once per database, possibly in several databases at once:
-- a concurrent CREATE ROLE blocks on the other transaction and then fails
-- with unique_violation, which is as good as "already exists".
-- Deployments grant this role to their login role
-- (GRANT leasegate_app TO my_login); leasegate then SET ROLEs to it.
-- ---------------------------------------------------------------------------

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'leasegate_app') THEN
    BEGIN
      CREATE ROLE leasegate_app NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL;
    END;
  END IF;
END
$$;

REVOKE ALL ON agent_tasks, agent_runs, worker_leases, tool_operations, ledger_events FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO leasegate_app;
GRANT SELECT ON agent_tasks, agent_runs, worker_leases, tool_operations, ledger_events TO leasegate_app;

REVOKE EXECUTE ON FUNCTION
  ledger_events_refuse_change(),
  _ledger_result(text, uuid),
  _ledger_check_ttl(bigint),
  _lease_fence(uuid, text, bigint),
  _run_advance(uuid, text, bigint, bigint, text, text, jsonb, jsonb),
  run_create(text, text, uuid, text, bigint),
  lease_acquire(uuid, text, bigint),
  lease_renew(uuid, text, bigint, bigint),
  lease_release(uuid, text, bigint),
  checkpoint_save(uuid, text, bigint, bigint, jsonb),
  run_start(uuid, text, bigint, bigint),
  run_complete(uuid, text, bigint, bigint, jsonb),
  run_fail(uuid, text, bigint, bigint, jsonb),
  run_cancel(uuid, text, text)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
  run_create(text, text, uuid, text, bigint),
  lease_acquire(uuid, text, bigint),
  lease_renew(uuid, text, bigint, bigint),
  lease_release(uuid, text, bigint),
  checkpoint_save(uuid, text, bigint, bigint, jsonb),
  run_start(uuid, text, bigint, bigint),
  run_complete(uuid, text, bigint, bigint, jsonb),
  run_fail(uuid, text, bigint, bigint, jsonb),
  run_cancel(uuid, text, text)
TO leasegate_app;
