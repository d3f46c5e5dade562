-- Lease transitions (seed 5): acquire/take over, renew, release. Helpers in
-- sql/common.sql.

-- The one home of "this owner takes the lease" (epoch + 1, new owner,
-- expiry on the database clock), for lease_acquire and lease_takeover. A
-- held, unexpired lease is 'busy' unless p_force; a run in a terminal status
-- is 'terminal'. A concurrent protected write holding the row lock makes
-- this wait, then judge the row as that transaction left it (experiment D).
-- p_token_sha256 is the SHA-256 of the new holder's secret lease token (the
-- caller generates the token and shows it once; only the hash is stored and
-- the previous holder's token stops working with this commit).
DROP FUNCTION IF EXISTS _lease_take(uuid, text, bigint, boolean);
CREATE OR REPLACE FUNCTION _lease_take(p_run_id uuid, p_owner text, p_ttl_ms bigint, p_token_sha256 bytea,
                                       p_force boolean)
RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  s text;
  now_ts timestamptz;
  held boolean;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  IF p_owner IS NULL OR p_owner = '' THEN
    RAISE EXCEPTION 'lease owner must not be empty' USING ERRCODE = '22023';
  END IF;
  IF p_token_sha256 IS NULL OR octet_length(p_token_sha256) <> 32 THEN
    RAISE EXCEPTION 'a lease token hash is 32 bytes (SHA-256)' USING ERRCODE = '22023';
  END IF;
  l := _lease_lock(p_run_id, false);
  IF l.run_id IS NULL OR l.held_by_members THEN
    -- A shared lease (sql/members.sql) is not the control API's to take.
    RETURN _not_found();
  END IF;
  SELECT status INTO s FROM agent_runs WHERE run_id = p_run_id;
  IF s IN ('succeeded', 'failed', 'cancelled') THEN
    RETURN _ledger_result('terminal', p_run_id);
  END IF;
  now_ts := clock_timestamp();
  held := l.owner IS NOT NULL AND l.expires_at > now_ts;
  IF held AND NOT p_force THEN
    RETURN _ledger_result('busy', p_run_id);
  END IF;
  IF l.owner IS NOT NULL AND NOT held THEN
    PERFORM set_config('leasegate.takeover_after_ms',
                       (extract(epoch FROM now_ts - l.expires_at) * 1000)::text, true);
  END IF;
  UPDATE worker_leases
     SET owner = p_owner,
         epoch = epoch + 1,
         expires_at = now_ts + (p_ttl_ms * interval '1 millisecond'),
         token_sha256 = p_token_sha256,
         updated_at = now_ts
   WHERE run_id = p_run_id;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch, detail)
  VALUES (p_run_id, 'lease',
          CASE WHEN l.owner IS NULL THEN 'free' WHEN held THEN 'held' ELSE 'expired' END,
          'held', 'worker', p_owner, l.epoch + 1,
          jsonb_build_object('ttl_ms', p_ttl_ms, 'previous_owner', l.owner, 'previous_epoch', l.epoch,
                             'previous_expires_at', l.expires_at)
            || CASE WHEN p_force THEN '{"forced": true}'::jsonb ELSE '{}'::jsonb END);
  RETURN _ledger_result(CASE WHEN l.owner IS NULL THEN 'acquired' ELSE 'taken_over' END, p_run_id);
END
$$;
REVOKE EXECUTE ON FUNCTION _lease_take(uuid, text, bigint, bytea, boolean) FROM PUBLIC;

-- Acquire a free lease or take over an expired one (seed 5.1). A held,
-- unexpired lease is 'busy'. p_token_sha256: see _lease_take.
DROP FUNCTION IF EXISTS lease_acquire(uuid, text, bigint);
CREATE OR REPLACE FUNCTION lease_acquire(p_run_id uuid, p_owner text, p_ttl_ms bigint, p_token_sha256 bytea)
RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _lease_take(p_run_id, p_owner, p_ttl_ms, p_token_sha256, false)
$$;

-- Take the lease over now, held or not (an operator's act, leasegate_operator
-- only: a stuck worker fenced at once instead of waiting for its lease to
-- expire); the previous holder's writes are rejected from this commit on. Recorded with
-- the previous owner and epoch and 'forced'. p_token_sha256: see _lease_take.
DROP FUNCTION IF EXISTS lease_takeover(uuid, text, bigint);
CREATE OR REPLACE FUNCTION lease_takeover(p_run_id uuid, p_owner text, p_ttl_ms bigint, p_token_sha256 bytea)
RETURNS ledger_write_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _lease_take(p_run_id, p_owner, p_ttl_ms, p_token_sha256, true)
$$;

-- Renew (seed 5.2): only the current owner and epoch, only before expiry. An
-- expired lease is never resurrected, even if nobody took it over. A run that
-- became terminal (e.g. cancelled by an operator) is 'terminal', so the
-- worker's heartbeat stops it. The lease token's hash is judged by the fence.
-- p_tenant (NULL: any) scopes the renew (the control API's tenant check in
-- the same round trip): a run of another tenant is
-- 'not_found' with nothing found shown, nothing locked and nothing written,
-- exactly as a run that does not exist.
--
-- After the ttl check, the common case in two statements (not six: the
-- tenant lookup, _lease_fence's lock, lock-time setting and run read, the
-- UPDATE and _ledger_result's read-back):
--   1. the lease row FOR UPDATE, joined to its run for the tenant (another
--      tenant's lease is not even locked), read as locked: owner, epoch,
--      expiry and token hash are judged on it, on the database clock read
--      after the lock, in _lease_fence's order;
--   2. a fresh statement (READ COMMITTED: a new snapshot, taken with the
--      lock held) renews the lease only if the run is not terminal and
--      returns the run's status and revision. Every status change of a run
--      holds its lease row lock (_run_cancel, _run_transition, completion),
--      so the status this snapshot sees cannot change before commit; the
--      run row itself is not locked (as lease_renew_batch, which judges the
--      same way).
-- Every other answer (no lease, lease lost, token unset or invalid,
-- terminal) is built by _ledger_result as before, with the lock wait
-- recorded first, so each answer's columns are what they were.
DROP FUNCTION IF EXISTS lease_renew(uuid, text, bigint, bigint);
DROP FUNCTION IF EXISTS lease_renew(uuid, text, bigint, bytea, bigint);
CREATE OR REPLACE FUNCTION lease_renew(p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea,
                                       p_ttl_ms bigint, p_tenant text DEFAULT NULL)
RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  t0        timestamptz := clock_timestamp();
  now_ts    timestamptz;
  l_owner   text;
  l_epoch   bigint;
  l_expires timestamptz;
  l_token   bytea;
  r_status  text;
  r_rev     bigint;
  verdict   text;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  -- 1. The lock.
  SELECT l.owner, l.epoch, l.expires_at, l.token_sha256
    INTO l_owner, l_epoch, l_expires, l_token
    FROM worker_leases l JOIN agent_runs a ON a.run_id = l.run_id
   WHERE l.run_id = p_run_id AND (p_tenant IS NULL OR a.tenant_id = p_tenant)
     AND NOT l.held_by_members
     FOR UPDATE OF l;
  now_ts := clock_timestamp();
  IF NOT FOUND THEN
    -- No such run, another tenant's, or a shared lease (sql/members.sql):
    -- nothing about it is shown.
    RETURN _not_found();
  ELSIF l_owner IS DISTINCT FROM p_owner OR l_epoch IS DISTINCT FROM p_epoch OR l_expires <= now_ts THEN
    verdict := 'lease_lost';
  ELSIF l_token IS NULL THEN
    verdict := 'lease_token_unset';
  ELSIF p_token_sha256 IS NULL OR l_token <> p_token_sha256 THEN
    verdict := 'lease_token_invalid';
  ELSE
    -- 2. The renewal, if the run is not terminal.
    UPDATE worker_leases w
       SET expires_at = now_ts + (p_ttl_ms * interval '1 millisecond'),
           updated_at = now_ts
      FROM agent_runs a
     WHERE w.run_id = p_run_id AND a.run_id = p_run_id
       AND a.status NOT IN ('succeeded', 'failed', 'cancelled')
    RETURNING a.status, a.revision, w.expires_at INTO r_status, r_rev, l_expires;
    IF FOUND THEN
      RETURN ROW('applied', r_status, r_rev, l_owner, l_epoch, l_expires, clock_timestamp(),
                 extract(epoch FROM now_ts - t0)::double precision * 1000,
                 NULLIF(current_setting('leasegate.takeover_after_ms', true), '')::double precision
                )::ledger_write_result;
    END IF;
    verdict := 'terminal';
  END IF;
  PERFORM set_config('leasegate.lock_wait_ms', (extract(epoch FROM now_ts - t0) * 1000)::text, true);
  RETURN _ledger_result(verdict, p_run_id);
END
$$;

-- Release (seed 5.2): the owner gives the lease up. The epoch is never zeroed,
-- so the next acquire gets epoch + 1. An expired lease may still be released
-- by its owner as long as nobody took it over; the run's status is not judged
-- (a worker releases after completing). The current owner and epoch with a
-- missing or wrong token is 'lease_token_invalid' ('lease_token_unset' on a
-- lease taken before migration 0005), as in _lease_fence. The released
-- lease keeps no token.
DROP FUNCTION IF EXISTS lease_release(uuid, text, bigint);
CREATE OR REPLACE FUNCTION lease_release(p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea)
RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
BEGIN
  l := _lease_lock(p_run_id, false);
  IF l.run_id IS NULL OR l.held_by_members THEN
    RETURN _not_found();
  END IF;
  IF l.owner IS DISTINCT FROM p_owner OR l.epoch IS DISTINCT FROM p_epoch THEN
    RETURN _ledger_result('lease_lost', p_run_id);
  END IF;
  IF l.token_sha256 IS NULL THEN
    RETURN _ledger_result('lease_token_unset', p_run_id);
  END IF;
  IF p_token_sha256 IS NULL OR l.token_sha256 <> p_token_sha256 THEN
    RETURN _ledger_result('lease_token_invalid', p_run_id);
  END IF;
  UPDATE worker_leases
     SET owner = NULL, expires_at = clock_timestamp(), token_sha256 = NULL, updated_at = clock_timestamp()
   WHERE run_id = p_run_id;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch)
  VALUES (p_run_id, 'lease', 'held', 'free', 'worker', p_owner, p_epoch);
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- Batch renewal: one worker host renews many leases in one
-- call. Each lease is judged exactly as lease_renew judges it (the fence of
-- _lease_fence: owner, epoch, unexpired, lease token hash, non-terminal run)
-- and answered on its own row, in the order given:
--   applied (renewed: lease_expires_at is the new expiry) | not_found |
--   lease_lost | lease_token_unset | lease_token_invalid | terminal.
-- p_tenant (NULL: any) scopes the batch: a run of another tenant is
-- 'not_found' with nothing found shown and nothing written, exactly as a run
-- that does not exist. Like lease_renew, a renewal writes no event (the
-- audit trail of a lease is its takes and releases; the expiry is on the
-- row), so a batch writes none either.
--
-- Two statements in one call (one transaction, one round trip):
--   1. lock every named lease row FOR UPDATE in run_id order (two batches
--      naming the same leases cannot deadlock; a single renew or takeover
--      locks one row, so it queues like it would behind one renew);
--   2. with every lock held, a fresh snapshot (READ COMMITTED: a new one per
--      statement) sees the committed state of those rows and, since every
--      status change of a run holds its lease row lock, of their runs; the
--      verdicts and the UPDATE of the renewed rows come from that one view,
--      on one database clock reading. The renewed rows are updated by the
--      ctid this statement read them at (no second index lookup): locked
--      since step 1, they cannot have moved.
-- lock_wait_ms is the time the whole batch took to lock its rows (the same
-- on every row); takeover_after_ms is always NULL (the columns are
-- ledger_write_result's, so each row decodes like a single renew's answer).
-- Input the Rust layer never sends (arrays of different lengths, a NULL or
-- repeated run id, more than 100,000 leases) raises 22023 and writes nothing.
-- Planned afresh on every call (plan_cache_mode): a custom plan sees the
-- arrays' real sizes; from the sixth call on PL/pgSQL would otherwise reuse
-- a generic plan guessing 10 rows per array, slower on large batches
-- (bench/results/2026-12-01-batch-lease-renewal.md). No JIT: where an
-- estimate crosses jit_above_cost, compiling costs more than the work.
CREATE OR REPLACE FUNCTION lease_renew_batch(p_run_ids uuid[], p_owners text[], p_epochs bigint[],
                                             p_token_sha256s bytea[], p_ttl_ms bigint, p_tenant text)
RETURNS TABLE (run_id uuid, outcome text, run_status text, revision bigint, lease_owner text,
               lease_epoch bigint, lease_expires_at timestamptz, db_now timestamptz,
               lock_wait_ms double precision, takeover_after_ms double precision)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp
  SET plan_cache_mode = force_custom_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  n integer := coalesce(cardinality(p_run_ids), 0);
  t0 timestamptz;
  now_ts timestamptz;
BEGIN
  PERFORM _ledger_check_ttl(p_ttl_ms);
  IF n <> coalesce(cardinality(p_owners), 0) OR n <> coalesce(cardinality(p_epochs), 0)
     OR n <> coalesce(cardinality(p_token_sha256s), 0) THEN
    RAISE EXCEPTION 'lease_renew_batch: run ids, owners, epochs and token hashes must be arrays of one length'
      USING ERRCODE = '22023';
  END IF;
  IF n > 100000 THEN
    RAISE EXCEPTION 'lease_renew_batch: at most 100000 leases per call, got %', n USING ERRCODE = '22023';
  END IF;
  IF array_position(p_run_ids, NULL) IS NOT NULL THEN
    RAISE EXCEPTION 'lease_renew_batch: a run id is NULL' USING ERRCODE = '22023';
  END IF;
  IF (SELECT count(DISTINCT u) FROM unnest(p_run_ids) u) <> n THEN
    RAISE EXCEPTION 'lease_renew_batch: a run id appears twice' USING ERRCODE = '22023';
  END IF;

  -- 1. Locks, in one order.
  t0 := clock_timestamp();
  -- (Another tenant's leases are not even locked.)
  PERFORM 1 FROM worker_leases l
   WHERE l.run_id = ANY (p_run_ids)
     AND (p_tenant IS NULL
          OR EXISTS (SELECT 1 FROM agent_runs a WHERE a.run_id = l.run_id AND a.tenant_id = p_tenant))
   ORDER BY l.run_id
     FOR UPDATE OF l;
  now_ts := clock_timestamp();

  -- 2. Verdicts and renewals under those locks.
  RETURN QUERY
  WITH req AS (
    SELECT r.run_id, r.owner, r.epoch, r.token_sha256, r.ord
      FROM unnest(p_run_ids, p_owners, p_epochs, p_token_sha256s) WITH ORDINALITY
           AS r(run_id, owner, epoch, token_sha256, ord)
  ),
  judged AS (
    SELECT q.ord, q.run_id, a.status, a.revision, l.owner, l.epoch, l.expires_at, l.ctid AS lease_ctid,
           CASE
             WHEN l.run_id IS NULL OR a.run_id IS NULL OR l.held_by_members THEN 'not_found'
             WHEN l.owner IS DISTINCT FROM q.owner OR l.epoch IS DISTINCT FROM q.epoch
                  OR l.expires_at <= now_ts THEN 'lease_lost'
             WHEN l.token_sha256 IS NULL THEN 'lease_token_unset'
             WHEN q.token_sha256 IS NULL OR l.token_sha256 <> q.token_sha256 THEN 'lease_token_invalid'
             WHEN a.status IN ('succeeded', 'failed', 'cancelled') THEN 'terminal'
             ELSE 'applied'
           END AS verdict
      FROM req q
      LEFT JOIN agent_runs a
             ON a.run_id = q.run_id AND (p_tenant IS NULL OR a.tenant_id = p_tenant)
      LEFT JOIN worker_leases l ON l.run_id = a.run_id
  ),
  renewed AS (
    UPDATE worker_leases w
       SET expires_at = now_ts + (p_ttl_ms * interval '1 millisecond'),
           updated_at = now_ts
      FROM judged j
     WHERE j.verdict = 'applied' AND w.ctid = j.lease_ctid
    RETURNING w.run_id, w.expires_at
  )
  SELECT j.run_id, j.verdict,
         CASE WHEN j.verdict = 'not_found' THEN NULL ELSE j.status END,
         CASE WHEN j.verdict = 'not_found' THEN NULL ELSE j.revision END,
         CASE WHEN j.verdict = 'not_found' THEN NULL ELSE j.owner END,
         CASE WHEN j.verdict = 'not_found' THEN NULL ELSE j.epoch END,
         CASE WHEN j.verdict = 'not_found' THEN NULL ELSE coalesce(n.expires_at, j.expires_at) END,
         now_ts,
         extract(epoch FROM now_ts - t0)::double precision * 1000,
         NULL::double precision
    FROM judged j
    LEFT JOIN renewed n ON n.run_id = j.run_id
   ORDER BY j.ord;
END
$$;

REVOKE EXECUTE ON FUNCTION
  lease_acquire(uuid, text, bigint, bytea),
  lease_takeover(uuid, text, bigint, bytea),
  lease_renew(uuid, text, bigint, bytea, bigint, text),
  lease_release(uuid, text, bigint, bytea),
  lease_renew_batch(uuid[], text[], bigint[], bytea[], bigint, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  lease_acquire(uuid, text, bigint, bytea),
  lease_renew(uuid, text, bigint, bytea, bigint, text),
  lease_release(uuid, text, bigint, bytea),
  lease_renew_batch(uuid[], text[], bigint[], bytea[], bigint, text)
TO leasegate_app;
-- Taking a live lease away from its holder is an operator's act: the lease
-- modes share their leases through members (sql/members.sql) and never
-- need it, so the proxy's own login cannot fence a worker it does not
-- serve. Revoked explicitly: a database migrated before kept the grant.
REVOKE EXECUTE ON FUNCTION lease_takeover(uuid, text, bigint, bytea) FROM leasegate_app;
GRANT EXECUTE ON FUNCTION lease_takeover(uuid, text, bigint, bytea) TO leasegate_operator;
