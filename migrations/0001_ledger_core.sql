-- leasegate ledger core: tasks, runs, leases, the operations table, the
-- append-only event log and the application role.
--
-- Migrations hold tables, types, indexes and grants on tables, and change
-- only by a new numbered file. The functions (every protected transition as
-- ONE SQL function) have one current home each under sql/ and are applied
-- after the migrations (src/ledger/schema.rs).
--
-- Conventions of those functions (src/ledger/mod.rs names the invariants
-- they enforce):
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

-- Shared by every append-only table (ledger_events, operation_evidence).
CREATE FUNCTION ledger_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER ledger_events_append_only BEFORE UPDATE OR DELETE ON ledger_events
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();
REVOKE EXECUTE ON FUNCTION ledger_events_refuse_change() FROM PUBLIC;
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
  db_now           timestamptz,
  -- How long the call waited for the lease row lock, and for a takeover how
  -- long the lease had been expired (observability; NULL when not measured).
  lock_wait_ms      double precision,
  takeover_after_ms double precision
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

-- The leasegate processes that hold claims, and until when each is known
-- alive (renewed by the process; set to now when it stops cleanly): a claim
-- whose holder is provably gone expires at once instead of after its ttl.
-- A holder with no row (or a live one) is judged by the claim's ttl alone.
CREATE TABLE leasegate_processes (
  owner       text PRIMARY KEY CHECK (owner <> '' AND length(owner) <= 200),
  started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  alive_until timestamptz NOT NULL
);
REVOKE ALL ON leasegate_processes FROM PUBLIC;
GRANT SELECT ON leasegate_processes TO leasegate_app;

-- Which set of function files (sql/*.sql) this database runs: their SHA-256,
-- so a process applies them only when they differ (src/ledger/schema.rs).
CREATE TABLE ledger_functions (
  singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  digest     text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON ledger_functions FROM PUBLIC;
