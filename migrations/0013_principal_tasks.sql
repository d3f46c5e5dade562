-- Task namespaces and shared leases.
--
-- 1. A task belongs to a namespace: kind 'task' (the tenant's shared
--    namespace, the one the control API creates and leases in; principal
--    is '') or kind 'session' / 'key' (leasegate's lease modes: one
--    namespace per principal, the caller identity a bearer token or JWT
--    stands for, or 'anonymous'). Another principal naming the same task
--    key names another task. The key of a task is (tenant_id, kind,
--    principal, task_id); runs carry the same four columns.
-- 2. The lease of a session- or key-mode run is held by leasegate itself,
--    shared by the leasegate processes that serve that principal's task:
--    worker_leases.held_by_members marks it, and lease_members holds one
--    row per process with its own token hash and liveness. The fence
--    accepts a member's writes while its row is alive; a member that is
--    provably gone is removed, which fences it alone (sql/members.sql).
--
-- Existing rows: key-mode tasks (task ids 'idempotency-key:<principal>:<key>'
-- whose lease leasegate's key owner took) and session-mode tasks (whose
-- lease an owner ending in ':session' took) move to their namespaces; a
-- session task's principal was not recorded, so it becomes 'anonymous'.
-- New columns have constant defaults (no table rewrite); the primary key
-- and the runs' unique key and foreign key are rebuilt under this
-- migration's lock.

ALTER TABLE agent_tasks
  ADD COLUMN kind text NOT NULL DEFAULT 'task',
  ADD COLUMN principal text NOT NULL DEFAULT '';
ALTER TABLE agent_runs
  ADD COLUMN kind text NOT NULL DEFAULT 'task',
  ADD COLUMN principal text NOT NULL DEFAULT '';
ALTER TABLE worker_leases
  ADD COLUMN held_by_members boolean NOT NULL DEFAULT false;

ALTER TABLE agent_runs
  DROP CONSTRAINT agent_runs_tenant_id_task_id_fkey,
  DROP CONSTRAINT agent_runs_tenant_id_task_id_attempt_key;

CREATE TEMPORARY TABLE moved_tasks ON COMMIT DROP AS
SELECT t.tenant_id, t.task_id AS old_task_id, m.kind, m.principal, m.task_id
  FROM agent_tasks t
  CROSS JOIN LATERAL (
    SELECT 'key'::text AS kind,
           split_part(substr(t.task_id, 17), ':', 1) AS principal,
           substr(t.task_id, 18 + length(split_part(substr(t.task_id, 17), ':', 1))) AS task_id
     WHERE t.task_id LIKE 'idempotency-key:%:_%'
       AND EXISTS (SELECT 1 FROM agent_runs r JOIN ledger_events e ON e.run_id = r.run_id
                    WHERE r.tenant_id = t.tenant_id AND r.task_id = t.task_id
                      AND e.subject = 'lease' AND e.actor = 'leasegate:idempotency-key')
    UNION ALL
    SELECT 'session', 'anonymous', t.task_id
     WHERE t.task_id NOT LIKE 'idempotency-key:%'
       AND EXISTS (SELECT 1 FROM agent_runs r JOIN ledger_events e ON e.run_id = r.run_id
                    WHERE r.tenant_id = t.tenant_id AND r.task_id = t.task_id
                      AND e.subject = 'lease' AND e.actor LIKE '%:session')
  ) m
 WHERE m.principal <> '' AND m.task_id <> '';

UPDATE agent_runs r
   SET kind = m.kind, principal = m.principal, task_id = m.task_id
  FROM moved_tasks m
 WHERE r.tenant_id = m.tenant_id AND r.task_id = m.old_task_id;
UPDATE agent_tasks t
   SET kind = m.kind, principal = m.principal, task_id = m.task_id
  FROM moved_tasks m
 WHERE t.tenant_id = m.tenant_id AND t.task_id = m.old_task_id;
-- Their leases were held by processes of the build before (tokens in
-- memory only): they become shared leases with no member, free for the
-- next member to take.
UPDATE worker_leases l
   SET held_by_members = true
  FROM agent_runs r
 WHERE r.run_id = l.run_id AND r.kind <> 'task';

ALTER TABLE agent_tasks
  DROP CONSTRAINT agent_tasks_pkey,
  ADD PRIMARY KEY (tenant_id, kind, principal, task_id),
  ADD CONSTRAINT agent_tasks_kind CHECK (kind IN ('task', 'session', 'key')),
  ADD CONSTRAINT agent_tasks_principal CHECK (
    CASE WHEN kind = 'task' THEN principal = ''
         ELSE principal ~ '^[!-~]+$' AND length(principal) <= 200 END);
ALTER TABLE agent_runs
  ADD CONSTRAINT agent_runs_task_attempt_key UNIQUE (tenant_id, kind, principal, task_id, attempt),
  ADD CONSTRAINT agent_runs_task_fkey FOREIGN KEY (tenant_id, kind, principal, task_id)
    REFERENCES agent_tasks (tenant_id, kind, principal, task_id);

CREATE TABLE lease_members (
  run_id       uuid NOT NULL REFERENCES worker_leases (run_id),
  -- The leasegate process (its dispatch owner); a member's claims name it
  -- as their owner.
  member       text NOT NULL CHECK (member ~ '^[!-~]+$' AND length(member) <= 200),
  token_sha256 bytea NOT NULL CHECK (octet_length(token_sha256) = 32),
  joined_at    timestamptz NOT NULL,
  -- The last renewal: a member renewed after another joined is alive, so
  -- the newcomer shares the lease with it instead of waiting it out.
  renewed_at   timestamptz NOT NULL,
  alive_until  timestamptz NOT NULL,
  PRIMARY KEY (run_id, member)
);

REVOKE ALL ON lease_members FROM PUBLIC;
GRANT SELECT ON lease_members TO leasegate_operator;
