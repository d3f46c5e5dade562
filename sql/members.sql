-- Shared leases (lease modes `session` and `key`): the lease of a task in a
-- principal's namespace (agent_tasks.kind 'session' or 'key') is held by
-- leasegate, shared by every leasegate process serving that principal's
-- task. Each process is a member (lease_members) with its own token hash
-- and liveness; its claims name the member as owner and carry the lease's
-- epoch. Helpers in sql/common.sql; the fence of a member's writes is
-- _lease_fence (and the two register functions' copies of it).
--
-- Rules:
--   * A member's writes are accepted while its row is alive (alive_until on
--     the database clock). A lapsed row is never renewed: the member must
--     join again.
--   * Joining never fences a live member. A member whose liveness lapsed is
--     removed by the next join or readiness check (an event records it):
--     that fences it alone, without a new epoch.
--   * The lease is taken afresh (epoch + 1) only when no live member is
--     left: released, or every member gone.
--   * A newcomer in session mode may register its first call only once
--     every other member has renewed after the newcomer joined (it is alive,
--     a parallel connection of the same agent) or has been removed as gone
--     (a frozen or dead predecessor): lease_member_ready. The join notifies
--     channel leasegate_lease_members with the run id, so that live members
--     renew at once instead of at their next heartbeat.
--   * Every change of a lease's members holds the lease row FOR UPDATE;
--     the fence holds it at least FOR SHARE, so the members it reads are
--     stable until its transaction ends.
--
-- The control API's lease functions (sql/lease.sql) answer 'not_found' for
-- a lease held by members, as for a run that does not exist.

-- Removes the members of p_run_id (lease row locked) whose liveness lapsed,
-- except p_keep, with an event each (session mode: a member that stopped
-- renewing is news; key-mode members are never renewed and lapse by
-- design, so p_record is false for them). Returns how many.
CREATE OR REPLACE FUNCTION _members_evict(p_run_id uuid, p_epoch bigint, p_keep text, p_actor text,
                                          p_record boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  n integer;
BEGIN
  IF NOT p_record THEN
    DELETE FROM lease_members m
     WHERE m.run_id = p_run_id AND m.alive_until <= clock_timestamp() AND m.member <> p_keep;
    RETURN 0;
  END IF;
  WITH gone AS (
    DELETE FROM lease_members m
     WHERE m.run_id = p_run_id AND m.alive_until <= clock_timestamp() AND m.member <> p_keep
    RETURNING m.member, m.alive_until
  )
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
  SELECT p_run_id, 'lease', 'held', 'held', 'system', p_actor, p_epoch,
         jsonb_build_object('member_removed', g.member, 'alive_until', g.alive_until,
                            'reason', 'its liveness lapsed')
    FROM gone g;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$$;

-- p_member joins the lease of the task (p_tenant_id, p_kind, p_principal,
-- p_task_id), creating the task and a running run (id p_new_run_id) when
-- the task has no live run. With p_retention_ms (key mode), a live run
-- created longer ago than that is cancelled first ('retention passed') and
-- a new one created: the key is a new request then.
-- Outcome 'joined' with the run, the lease epoch, the member's alive_until,
-- waiting_on (other members not yet proven alive since this join),
-- evicted (gone members removed) and took ('created', 'acquired',
-- 'taken_over' after every member lapsed, or NULL when it joined a held
-- lease). 'retry' when the task's run changed under it three times.
DROP FUNCTION IF EXISTS lease_member_join(text, text, text, text, uuid, text, bigint, bytea, bigint);
CREATE OR REPLACE FUNCTION lease_member_join(
  p_tenant_id text, p_kind text, p_principal text, p_task_id text, p_new_run_id uuid,
  p_member text, p_ttl_ms bigint, p_token_sha256 bytea, p_retention_ms bigint,
  OUT outcome text, OUT run_id uuid, OUT epoch bigint, OUT run_status text, OUT revision bigint,
  OUT alive_until timestamptz, OUT waiting_on integer, OUT evicted integer, OUT took text,
  OUT run_created_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  shared_owner text := 'leasegate:' || p_kind;
  v_run    uuid;
  v_locked uuid;
  l        worker_leases;
  r        agent_runs;
  now_ts   timestamptz;
  next_attempt integer;
  held     boolean;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  IF p_kind NOT IN ('session', 'key') THEN
    RAISE EXCEPTION 'a shared lease is for kind session or key, got %', p_kind USING ERRCODE = '22023';
  END IF;
  IF p_member IS NULL OR p_member = '' THEN
    RAISE EXCEPTION 'member must not be empty' USING ERRCODE = '22023';
  END IF;
  IF p_token_sha256 IS NULL OR octet_length(p_token_sha256) <> 32 THEN
    RAISE EXCEPTION 'a lease token hash is 32 bytes (SHA-256)' USING ERRCODE = '22023';
  END IF;
  IF p_new_run_id IS NULL THEN
    RAISE EXCEPTION 'run_id must be given' USING ERRCODE = '22023';
  END IF;
  -- A retention cancels the task's live run once it is older: only a key
  -- has one, of at least a second (the config's own rule), so a join
  -- cannot end a session's run or every key's at once.
  IF p_retention_ms IS NOT NULL AND (p_kind <> 'key' OR p_retention_ms < 1000) THEN
    RAISE EXCEPTION 'a retention is for kind key and at least 1000 ms, got % ms for %', p_retention_ms, p_kind
      USING ERRCODE = '22023';
  END IF;

  FOR attempt IN 1..3 LOOP
    INSERT INTO agent_tasks (tenant_id, kind, principal, task_id)
    VALUES (p_tenant_id, p_kind, p_principal, p_task_id)
    ON CONFLICT DO NOTHING;
    SELECT t.active_run_id INTO v_run FROM agent_tasks t
     WHERE t.tenant_id = p_tenant_id AND t.kind = p_kind AND t.principal = p_principal
       AND t.task_id = p_task_id;

    IF v_run IS NOT NULL THEN
      -- Lock order: lease row, then run, then task.
      l := _lease_lock(v_run, false);
      SELECT * INTO r FROM agent_runs a WHERE a.run_id = v_run;
      IF r.status IN ('pending', 'running') AND p_retention_ms IS NOT NULL
         AND r.created_at <= clock_timestamp() - p_retention_ms * interval '1 millisecond' THEN
        DELETE FROM lease_members m WHERE m.run_id = v_run;
        UPDATE worker_leases w SET owner = NULL, expires_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE w.run_id = v_run;
        PERFORM _run_cancel(v_run, 'system', p_member, 'retention passed');
        r.status := 'cancelled';
      END IF;

      IF r.status IN ('pending', 'running') THEN
        now_ts := clock_timestamp();
        evicted := _members_evict(v_run, l.epoch, p_member, p_member, p_kind = 'session');
        held := l.owner IS NOT NULL AND l.expires_at > now_ts
                AND EXISTS (SELECT 1 FROM lease_members m
                             WHERE m.run_id = v_run AND m.member <> p_member AND m.alive_until > now_ts);
        IF NOT held THEN
          -- Free, or every member gone: a new term. This member's own
          -- earlier row (if any) is of the old term.
          DELETE FROM lease_members m WHERE m.run_id = v_run;
          UPDATE worker_leases w
             SET owner = shared_owner, epoch = w.epoch + 1, expires_at = now_ts + p_ttl_ms * interval '1 millisecond',
                 token_sha256 = NULL, held_by_members = true, updated_at = now_ts
           WHERE w.run_id = v_run;
          IF l.owner IS NOT NULL AND p_kind = 'session' THEN
            PERFORM set_config('leasegate.takeover_after_ms',
                               (extract(epoch FROM now_ts - l.expires_at) * 1000)::text, true);
          END IF;
          INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
          -- A key's members lapse by design: that is a free lease, not a
          -- takeover.
          VALUES (v_run, 'lease', CASE WHEN l.owner IS NULL OR p_kind = 'key' THEN 'free' ELSE 'expired' END,
                  'held', 'worker',
                  p_member, l.epoch + 1,
                  jsonb_build_object('ttl_ms', p_ttl_ms, 'member', p_member, 'previous_epoch', l.epoch,
                                     'previous_expires_at', l.expires_at));
          took := CASE WHEN l.owner IS NULL OR p_kind = 'key' THEN 'acquired' ELSE 'taken_over' END;
        END IF;
        INSERT INTO lease_members AS m (run_id, member, token_sha256, joined_at, renewed_at, alive_until)
        VALUES (v_run, p_member, p_token_sha256, now_ts, now_ts, now_ts + p_ttl_ms * interval '1 millisecond')
        ON CONFLICT ON CONSTRAINT lease_members_pkey DO UPDATE
          SET token_sha256 = EXCLUDED.token_sha256, joined_at = EXCLUDED.joined_at,
              renewed_at = EXCLUDED.renewed_at, alive_until = EXCLUDED.alive_until;
        UPDATE worker_leases w
           SET expires_at = greatest(w.expires_at, now_ts + p_ttl_ms * interval '1 millisecond'), updated_at = now_ts
         WHERE w.run_id = v_run
        RETURNING w.epoch INTO epoch;
        IF r.status = 'pending' THEN
          -- A run created before its task moved to a namespace: started by
          -- its first member, as a created one is.
          UPDATE agent_runs a SET status = 'running', revision = a.revision + 1, updated_at = now_ts
           WHERE a.run_id = v_run
          RETURNING a.* INTO r;
          INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, revision, detail)
          VALUES (v_run, 'run', 'pending', 'running', 'worker', p_member, epoch, r.revision, '{}'::jsonb);
        END IF;
        SELECT count(*) INTO waiting_on FROM lease_members m WHERE m.run_id = v_run AND m.member <> p_member;
        IF waiting_on > 0 AND p_kind = 'session' THEN
          PERFORM pg_notify('leasegate_lease_members', v_run::text);
        END IF;
        outcome := 'joined';
        run_id := v_run;
        run_created_at := r.created_at;
        run_status := r.status;
        revision := r.revision;
        alive_until := now_ts + p_ttl_ms * interval '1 millisecond';
        RETURN;
      END IF;
    END IF;

    -- No live run: create one. The task row lock serialises creators; a
    -- task whose run changed meanwhile is looked at again.
    SELECT t.active_run_id INTO v_locked FROM agent_tasks t
     WHERE t.tenant_id = p_tenant_id AND t.kind = p_kind AND t.principal = p_principal
       AND t.task_id = p_task_id
       FOR UPDATE;
    IF v_locked IS DISTINCT FROM v_run THEN
      CONTINUE;
    END IF;
    IF EXISTS (SELECT 1 FROM agent_runs a WHERE a.run_id = p_new_run_id) THEN
      RAISE EXCEPTION 'run id % is taken', p_new_run_id USING ERRCODE = '23505';
    END IF;
    now_ts := clock_timestamp();
    SELECT COALESCE(max(a.attempt), 0) + 1 INTO next_attempt FROM agent_runs a
     WHERE a.tenant_id = p_tenant_id AND a.kind = p_kind AND a.principal = p_principal
       AND a.task_id = p_task_id;
    INSERT INTO agent_runs (run_id, tenant_id, kind, principal, task_id, attempt, status, revision, created_at)
    VALUES (p_new_run_id, p_tenant_id, p_kind, p_principal, p_task_id, next_attempt, 'running', 1, now_ts);
    INSERT INTO worker_leases (run_id, owner, epoch, expires_at, token_sha256, held_by_members, updated_at)
    VALUES (p_new_run_id, shared_owner, 1, now_ts + p_ttl_ms * interval '1 millisecond', NULL, true, now_ts);
    INSERT INTO lease_members (run_id, member, token_sha256, joined_at, renewed_at, alive_until)
    VALUES (p_new_run_id, p_member, p_token_sha256, now_ts, now_ts, now_ts + p_ttl_ms * interval '1 millisecond');
    UPDATE agent_tasks t SET active_run_id = p_new_run_id, updated_at = now_ts
     WHERE t.tenant_id = p_tenant_id AND t.kind = p_kind AND t.principal = p_principal
       AND t.task_id = p_task_id;
    INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, revision, detail)
    VALUES (p_new_run_id, 'run', NULL, 'pending', 'system', p_member, NULL, 0,
            jsonb_build_object('tenant_id', p_tenant_id, 'task_id', p_task_id, 'kind', p_kind,
                               'principal', p_principal, 'attempt', next_attempt, 'previous_run_id', v_run)),
           (p_new_run_id, 'lease', 'free', 'held', 'worker', p_member, 1,
            NULL, jsonb_build_object('ttl_ms', p_ttl_ms, 'member', p_member)),
           (p_new_run_id, 'run', 'pending', 'running', 'worker', p_member, 1, 1, '{}'::jsonb);
    outcome := 'joined';
    run_id := p_new_run_id;
    run_created_at := now_ts;
    epoch := 1;
    run_status := 'running';
    revision := 1;
    alive_until := now_ts + p_ttl_ms * interval '1 millisecond';
    waiting_on := 0;
    evicted := 0;
    took := 'created';
    RETURN;
  END LOOP;
  outcome := 'retry';
END
$$;

-- Judges a member's claim on its locked lease row: NULL when valid, else
-- the verdict (not_found, lease_lost, lease_token_invalid, terminal).
CREATE OR REPLACE FUNCTION _member_check(l worker_leases, p_member text, p_epoch bigint, p_token_sha256 bytea)
RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  m lease_members;
  s text;
BEGIN
  IF l.run_id IS NULL OR NOT l.held_by_members THEN
    RETURN 'not_found';
  END IF;
  SELECT * INTO m FROM lease_members WHERE run_id = l.run_id AND member = p_member;
  IF l.epoch IS DISTINCT FROM p_epoch OR NOT FOUND OR m.alive_until <= clock_timestamp() THEN
    RETURN 'lease_lost';
  END IF;
  IF p_token_sha256 IS NULL OR m.token_sha256 <> p_token_sha256 THEN
    RETURN 'lease_token_invalid';
  END IF;
  SELECT status INTO s FROM agent_runs WHERE run_id = l.run_id;
  IF s IN ('succeeded', 'failed', 'cancelled') THEN
    RETURN 'terminal';
  END IF;
  RETURN NULL;
END
$$;

-- The member renews its liveness (and so the shared lease). A lapsed
-- member is 'lease_lost', never resurrected.
CREATE OR REPLACE FUNCTION lease_member_renew(p_run_id uuid, p_member text, p_epoch bigint,
                                              p_token_sha256 bytea, p_ttl_ms bigint)
RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  verdict text;
  now_ts timestamptz;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  l := _lease_lock(p_run_id, false);
  verdict := _member_check(l, p_member, p_epoch, p_token_sha256);
  IF verdict = 'not_found' THEN
    RETURN _not_found();
  ELSIF verdict IS NOT NULL THEN
    RETURN _ledger_result(verdict, p_run_id);
  END IF;
  now_ts := clock_timestamp();
  UPDATE lease_members
     SET renewed_at = now_ts, alive_until = now_ts + p_ttl_ms * interval '1 millisecond'
   WHERE run_id = p_run_id AND member = p_member;
  UPDATE worker_leases
     SET expires_at = greatest(expires_at, now_ts + p_ttl_ms * interval '1 millisecond'), updated_at = now_ts
   WHERE run_id = p_run_id;
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- Whether the member may register its first call (session mode, see the
-- rules above): removes gone members, then counts the others not renewed
-- since this member joined. outcome: applied | not_found | lease_lost |
-- lease_token_invalid | terminal.
CREATE OR REPLACE FUNCTION lease_member_ready(p_run_id uuid, p_member text, p_epoch bigint,
                                              p_token_sha256 bytea,
                                              OUT outcome text, OUT waiting_on integer, OUT evicted integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  joined timestamptz;
BEGIN
  l := _lease_lock(p_run_id, false);
  outcome := _member_check(l, p_member, p_epoch, p_token_sha256);
  IF outcome IS NOT NULL THEN
    RETURN;
  END IF;
  evicted := _members_evict(p_run_id, l.epoch, p_member, p_member, true);
  SELECT joined_at INTO joined FROM lease_members WHERE run_id = p_run_id AND member = p_member;
  SELECT count(*) INTO waiting_on FROM lease_members
   WHERE run_id = p_run_id AND member <> p_member AND renewed_at < joined;
  outcome := 'applied';
END
$$;

-- The member leaves; the last live member to leave releases the lease
-- (the run stays as it is, for the next member to resume).
CREATE OR REPLACE FUNCTION lease_member_leave(p_run_id uuid, p_member text, p_epoch bigint,
                                              p_token_sha256 bytea)
RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  m lease_members;
BEGIN
  l := _lease_lock(p_run_id, false);
  IF l.run_id IS NULL OR NOT l.held_by_members THEN
    RETURN _not_found();
  END IF;
  SELECT * INTO m FROM lease_members WHERE run_id = p_run_id AND member = p_member;
  IF l.epoch IS DISTINCT FROM p_epoch OR NOT FOUND THEN
    RETURN _ledger_result('lease_lost', p_run_id);
  END IF;
  IF p_token_sha256 IS NULL OR m.token_sha256 <> p_token_sha256 THEN
    RETURN _ledger_result('lease_token_invalid', p_run_id);
  END IF;
  DELETE FROM lease_members WHERE run_id = p_run_id AND member = p_member;
  IF NOT EXISTS (SELECT 1 FROM lease_members WHERE run_id = p_run_id AND alive_until > clock_timestamp()) THEN
    DELETE FROM lease_members WHERE run_id = p_run_id;
    UPDATE worker_leases
       SET owner = NULL, expires_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE run_id = p_run_id;
    INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
    VALUES (p_run_id, 'lease', 'held', 'free', 'worker', p_member, p_epoch,
            jsonb_build_object('member', p_member));
  END IF;
  RETURN _ledger_result('applied', p_run_id);
END
$$;

REVOKE EXECUTE ON FUNCTION
  _members_evict(uuid, bigint, text, text, boolean),
  _member_check(worker_leases, text, bigint, bytea),
  lease_member_join(text, text, text, text, uuid, text, bigint, bytea, bigint),
  lease_member_renew(uuid, text, bigint, bytea, bigint),
  lease_member_ready(uuid, text, bigint, bytea),
  lease_member_leave(uuid, text, bigint, bytea)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  lease_member_join(text, text, text, text, uuid, text, bigint, bytea, bigint),
  lease_member_renew(uuid, text, bigint, bytea, bigint),
  lease_member_ready(uuid, text, bigint, bytea),
  lease_member_leave(uuid, text, bigint, bytea)
TO leasegate_app;
