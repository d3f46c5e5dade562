-- Operation transitions (seed 9): register, claim, settle, mark unknown,
-- converge, supersede, and the reconciler's claim and retry budget. The
-- state model is drawn in migrations/0002_operations.sql. Helpers in
-- sql/common.sql.

-- Registers one intent of run p_run_id, or finds it. The operation row is
-- left locked FOR UPDATE for the caller. On an existing operation_id, or an
-- existing (run, step, effect_version), run_id, step, tool and digest must
-- all match: otherwise 'intent_conflict' and nothing is written. This
-- comparison is on every path, including the concurrent-insert one.
-- Returns (outcome: registered | exists | intent_conflict, operation_id of
-- the row to report).
CREATE OR REPLACE FUNCTION _op_upsert(p_run_id uuid, p_intent operation_intent, p_owner text, p_epoch bigint,
                                      OUT outcome text, OUT found_id text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_id      text    := p_intent.operation_id;
  v_step    text    := p_intent.step_id;
  v_version integer := p_intent.effect_version;
  v_tool    text    := p_intent.tool_name;
  v_digest  text    := p_intent.request_digest;
  v_body    jsonb   := COALESCE(p_intent.request_body, 'null'::jsonb);
  o         tool_operations;
  attempt   integer := 0;
BEGIN
  IF v_id IS NULL OR v_step IS NULL OR v_version IS NULL OR v_tool IS NULL OR v_digest IS NULL THEN
    RAISE EXCEPTION 'intent needs operation_id, step_id, effect_version, tool_name, request_digest: %', p_intent
      USING ERRCODE = '22023';
  END IF;
  LOOP
    attempt := attempt + 1;
    SELECT * INTO o FROM tool_operations WHERE operation_id = v_id FOR UPDATE;
    IF NOT FOUND THEN
      SELECT * INTO o FROM tool_operations
       WHERE run_id = p_run_id AND step_id = v_step AND effect_version = v_version FOR UPDATE;
    END IF;
    IF FOUND THEN
      found_id := o.operation_id;
      -- Not the id itself: an operation registered before the id's current
      -- shape (leasegate/operation/v1) is found by (run, step, version)
      -- under its stored id, which stays its id (invariant 3).
      IF o.run_id = p_run_id AND o.step_id = v_step
         AND o.effect_version = v_version AND o.tool_name = v_tool AND o.request_digest = v_digest THEN
        outcome := 'exists';
      ELSE
        outcome := 'intent_conflict';
      END IF;
      RETURN;
    END IF;
    INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                 request_digest, request_body, status, upstream, upstream_tool)
    VALUES (v_id, p_run_id, v_step, v_version, v_tool, v_digest, v_body, 'prepared',
            p_intent.upstream, p_intent.upstream_tool)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
      INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                                 actor, epoch, revision, detail)
      VALUES (p_run_id, v_id, 'operation', NULL, 'prepared', 'worker', p_owner, p_epoch, 0,
              jsonb_build_object('tool_name', v_tool, 'step_id', v_step, 'effect_version', v_version,
                                 'request_digest', v_digest));
      -- Lock it like the found path does.
      PERFORM 1 FROM tool_operations WHERE operation_id = v_id FOR UPDATE;
      outcome := 'registered';
      found_id := v_id;
      RETURN;
    END IF;
    -- A concurrent transaction inserted a conflicting key and committed;
    -- the next round's statements see it.
    IF attempt >= 3 THEN
      RAISE EXCEPTION 'intent % keeps colliding with concurrent inserts', v_id USING ERRCODE = '40001';
    END IF;
  END LOOP;
END
$$;

-- prepared -> dispatching by the dispatcher (the outbox's claims). The
-- caller holds the row lock. Returns the claimed row, or a row of NULLs if
-- it was not prepared. A claim writes no event: its facts (claimed_at;
-- no epoch and no worker, the outbox holds no lease) stay on the row until
-- the event that ends the claim carries them (migrations/0017).
DROP FUNCTION IF EXISTS _op_claim(text, text, bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION _op_claim(p_operation_id text, p_dispatch_owner text, p_claim_ttl_ms bigint)
RETURNS tool_operations
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  o tool_operations;
BEGIN
  UPDATE tool_operations
     SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
         dispatch_until = clock_timestamp() + (p_claim_ttl_ms * interval '1 millisecond'),
         dispatch_count = dispatch_count + 1, revision = revision + 1, updated_at = clock_timestamp(),
         first_dispatched_at = COALESCE(first_dispatched_at, clock_timestamp()),
         claimed_at = clock_timestamp(), claim_epoch = NULL, claim_worker = NULL
   WHERE operation_id = p_operation_id AND status = 'prepared'
  RETURNING * INTO o;
  RETURN o;
END
$$;

-- The facts of the claim row o is under (status dispatching), as the event
-- that ends the claim carries them in detail.claim (migrations/0017). The
-- settles build the same object inline (their row is the one after the
-- update), without dispatch_until.
CREATE OR REPLACE FUNCTION _op_claim_facts(o tool_operations) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object('dispatch_owner', o.dispatch_owner, 'worker', o.claim_worker,
                            'at', o.claimed_at, 'epoch', o.claim_epoch,
                            'dispatch_count', o.dispatch_count, 'revision', o.revision,
                            'dispatch_until', o.dispatch_until, 'inline', o.claim_worker IS NOT NULL)
$$;

-- "Step planned" (seed 9.1): registers intents (prepared) under the current
-- lease, optionally together with a checkpoint CAS, all or nothing. One row
-- per intent comes back (registered | exists). On any conflict nothing is
-- written and the conflicting intents come back as 'intent_conflict' rows
-- (the existing operation's fields). A fence or CAS rejection is one row
-- with that outcome.
-- p_token_sha256: the lease token's hash, judged by _lease_fence.
DROP FUNCTION IF EXISTS operation_register(uuid, text, bigint, operation_intent[], bigint, jsonb);
CREATE OR REPLACE FUNCTION operation_register(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_intents operation_intent[],
  p_expected_revision bigint, p_checkpoint jsonb
) RETURNS SETOF operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict      text;
  found_status text;
  intent       operation_intent;
  v_outcome    text;
  v_found      text;
  registered   text[] := '{}';
  outcomes     text[] := '{}';
  conflicts    text[] := '{}';
BEGIN
  IF p_intents IS NULL OR cardinality(p_intents) = 0 THEN
    RAISE EXCEPTION 'intents must be a non-empty array' USING ERRCODE = '22023';
  END IF;
  IF p_checkpoint IS NOT NULL OR p_expected_revision IS NOT NULL THEN
    verdict := _lease_fence(p_run_id, p_owner, p_epoch, p_token_sha256, false);
  ELSE
    verdict := _lease_fence(p_run_id, p_owner, p_epoch, p_token_sha256, true);
  END IF;
  IF verdict <> 'valid' THEN
    RETURN NEXT _op_result(verdict, p_run_id, NULL, NULL);
    RETURN;
  END IF;

  BEGIN
    IF p_expected_revision IS NOT NULL THEN
      UPDATE agent_runs
         SET checkpoint = COALESCE(p_checkpoint, checkpoint), revision = revision + 1,
             updated_at = clock_timestamp()
       WHERE run_id = p_run_id AND revision = p_expected_revision AND status = 'running';
      IF NOT FOUND THEN
        SELECT status INTO found_status FROM agent_runs WHERE run_id = p_run_id;
        RETURN NEXT _op_result(CASE WHEN found_status <> 'running' THEN 'wrong_status' ELSE 'conflict' END,
                               p_run_id, NULL, NULL);
        RETURN;
      END IF;
    END IF;
    FOREACH intent IN ARRAY p_intents LOOP
      SELECT * INTO v_outcome, v_found FROM _op_upsert(p_run_id, intent, p_owner, p_epoch);
      IF v_outcome = 'intent_conflict' THEN
        conflicts := conflicts || v_found;
      END IF;
      registered := registered || v_found;
      outcomes := outcomes || v_outcome;
    END LOOP;
    IF cardinality(conflicts) > 0 THEN
      -- Undo every insert and the checkpoint of this call.
      RAISE EXCEPTION USING ERRCODE = 'LG001';
    END IF;
  EXCEPTION WHEN SQLSTATE 'LG001' THEN
    FOR i IN 1 .. cardinality(conflicts) LOOP
      RETURN NEXT _op_result('intent_conflict', p_run_id, conflicts[i], NULL);
    END LOOP;
    RETURN;
  END;

  FOR i IN 1 .. cardinality(registered) LOOP
    RETURN NEXT _op_result(outcomes[i], p_run_id, registered[i], NULL);
  END LOOP;
END
$$;

-- The proxy's hot path, one transaction: validate the lease, register or
-- find the intent, and claim it. 'claimed' means the caller now holds a
-- claim (dispatch_owner, revision, dispatch_until) and may send; 'exists'
-- returns the operation as it is (settled, in flight under another claim,
-- unknown, cancelled) and the caller must not send.
--
-- One plpgsql body, no helper calls (each `SET search_path` helper costs a
-- GUC save/restore per call and cannot be inlined); what it does is what
-- _lease_fence, _op_upsert and _op_claim do, in their order:
--   1. the lease row FOR SHARE joined to its run (tenant, status, revision):
--      one index probe each. A run of another tenant than p_tenant (NULL:
--      any) is 'not_found' before anything about its lease is judged. Then
--      the fence verdicts of _lease_fence (not_found, lease_lost,
--      lease_token_unset, lease_token_invalid, terminal); nothing written.
--      FOR SHARE, not FOR UPDATE: a takeover (which updates the row) still
--      waits for this transaction (invariant 1), while parallel calls of
--      one run do not queue behind each other.
--   2. a new intent is inserted directly as 'dispatching' under the claim
--      (revision 1, dispatch_count 1, claimed_at, claim_epoch = p_epoch,
--      claim_worker = p_owner), with no event: the claim's facts are on
--      the row, and the event that ends the claim carries them
--      (migrations/0017). The 'prepared' state of an inline call was
--      never visible outside this transaction.
--   3. an existing one (same operation_id, or same run/step/effect_version:
--      ON CONFLICT DO NOTHING covers both keys) is locked FOR UPDATE and
--      compared on run, step, version, tool and digest: any difference is
--      'intent_conflict' and nothing is written (invariant 3, on every
--      path, the concurrent-insert one included). If it is 'prepared'
--      (planned by a checkpoint, released unsent) it is claimed here, its
--      claim's facts on the row as in 2; anything else is 'exists'.
-- On 'exists' the answer also carries the WAL position read after the row
-- was (system_identifier, timeline, wal_lsn: ledger_wal_position()): every
-- commit visible to that read, the settle being replayed included, ends at
-- or before it, so the caller can count it as the acknowledged high-water
-- of a replay without another round trip (src/durability).
-- p_token_sha256: the lease token's hash, judged as _lease_fence does.
DROP FUNCTION IF EXISTS operation_register_claim(uuid, text, bigint, operation_intent, text, bigint);
DROP FUNCTION IF EXISTS operation_register_claim(uuid, text, bigint, bytea, operation_intent, text, bigint);
CREATE OR REPLACE FUNCTION operation_register_claim(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_intent operation_intent,
  p_dispatch_owner text, p_claim_ttl_ms bigint, p_tenant text,
  OUT outcome text, OUT run_status text, OUT run_revision bigint, OUT lease_owner text,
  OUT lease_epoch bigint, OUT lease_expires_at timestamptz, OUT db_now timestamptz,
  OUT operation_id text, OUT run_id uuid, OUT step_id text, OUT effect_version integer,
  OUT tool_name text, OUT request_digest text, OUT status text, OUT revision bigint,
  OUT dispatch_owner text, OUT dispatch_until timestamptz, OUT dispatch_count integer,
  OUT remote_id text, OUT result jsonb, OUT evidence_id bigint, OUT upstream text,
  OUT upstream_tool text, OUT system_identifier text, OUT timeline bigint, OUT wal_lsn bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_tenant   text;
  v_token    bytea;
  v_members  boolean;
  v_verdict  text;
  o          tool_operations;
  v_id       text := p_intent.operation_id;
  attempt    integer := 0;
BEGIN
  IF p_dispatch_owner IS NULL OR p_dispatch_owner = '' THEN
    RAISE EXCEPTION 'dispatch owner must not be empty' USING ERRCODE = '22023';
  END IF;
  IF p_claim_ttl_ms IS NULL OR p_claim_ttl_ms <= 0 THEN
    RAISE EXCEPTION 'claim ttl must be > 0 ms, got %', p_claim_ttl_ms USING ERRCODE = '22023';
  END IF;
  IF v_id IS NULL OR p_intent.step_id IS NULL OR p_intent.effect_version IS NULL
     OR p_intent.tool_name IS NULL OR p_intent.request_digest IS NULL THEN
    RAISE EXCEPTION 'intent needs operation_id, step_id, effect_version, tool_name, request_digest: %', p_intent
      USING ERRCODE = '22023';
  END IF;

  -- 1. The fence (invariant 1, on the database clock: invariant 7).
  SELECT l.owner, l.epoch, l.expires_at, l.token_sha256, l.held_by_members, r.status, r.revision, r.tenant_id
    INTO lease_owner, lease_epoch, lease_expires_at, v_token, v_members, run_status, run_revision, v_tenant
    FROM worker_leases l JOIN agent_runs r ON r.run_id = l.run_id
   WHERE l.run_id = p_run_id
     FOR SHARE OF l;
  db_now := clock_timestamp();
  run_id := p_run_id;
  IF NOT FOUND OR (p_tenant IS NOT NULL AND v_tenant IS DISTINCT FROM p_tenant) THEN
    lease_owner := NULL; lease_epoch := NULL; lease_expires_at := NULL;
    run_status := NULL; run_revision := NULL;
    outcome := 'not_found';
    RETURN;
  END IF;
  IF v_members THEN
    -- A shared lease (sql/members.sql): p_owner is a member, judged on its
    -- row (stable: every change of it holds the lease row FOR UPDATE).
    SELECT CASE WHEN m.alive_until <= db_now THEN 'lease_lost'
                WHEN p_token_sha256 IS NULL OR m.token_sha256 <> p_token_sha256 THEN 'lease_token_invalid'
           END
      INTO v_verdict
      FROM lease_members m WHERE m.run_id = p_run_id AND m.member = p_owner;
    IF NOT FOUND OR lease_epoch IS DISTINCT FROM p_epoch THEN
      v_verdict := 'lease_lost';
    END IF;
    IF v_verdict IS NOT NULL THEN
      outcome := v_verdict;
      RETURN;
    END IF;
  ELSIF lease_owner IS DISTINCT FROM p_owner OR lease_epoch IS DISTINCT FROM p_epoch
     OR lease_expires_at <= db_now THEN
    outcome := 'lease_lost';
    RETURN;
  ELSIF v_token IS NULL THEN
    outcome := 'lease_token_unset';
    RETURN;
  ELSIF p_token_sha256 IS NULL OR v_token <> p_token_sha256 THEN
    outcome := 'lease_token_invalid';
    RETURN;
  END IF;
  IF run_status IN ('succeeded', 'failed', 'cancelled') THEN
    outcome := 'terminal';
    RETURN;
  END IF;

  LOOP
    attempt := attempt + 1;
    -- 2. A new intent: registered and claimed in one row.
    INSERT INTO tool_operations AS t (operation_id, run_id, step_id, effect_version, tool_name,
                                      request_digest, request_body, status, upstream, upstream_tool,
                                      dispatch_owner, dispatch_until, dispatch_count, revision,
                                      first_dispatched_at, claimed_at, claim_epoch, claim_worker)
    VALUES (v_id, p_run_id, p_intent.step_id, p_intent.effect_version, p_intent.tool_name,
            p_intent.request_digest, COALESCE(p_intent.request_body, 'null'::jsonb), 'dispatching',
            p_intent.upstream, p_intent.upstream_tool, p_dispatch_owner,
            db_now + (p_claim_ttl_ms * interval '1 millisecond'), 1, 1, db_now, db_now, p_epoch, p_owner)
    ON CONFLICT DO NOTHING
    RETURNING t.operation_id, t.run_id, t.step_id, t.effect_version, t.tool_name, t.request_digest,
              t.status, t.revision, t.dispatch_owner, t.dispatch_until, t.dispatch_count, t.remote_id,
              t.upstream, t.upstream_tool
         INTO operation_id, run_id, step_id, effect_version, tool_name, request_digest,
              status, revision, dispatch_owner, dispatch_until, dispatch_count, remote_id,
              upstream, upstream_tool;
    IF FOUND THEN
      -- The answer is the new row's, read straight into the answer's
      -- fields (not through a copy of the whole row, arguments included).
      outcome := 'claimed';
      RETURN;
    END IF;
    -- 3. It exists (or a concurrent transaction inserted a key of it and
    -- committed: this statement's snapshot sees it).
    SELECT * INTO o FROM tool_operations t WHERE t.operation_id = v_id FOR UPDATE;
    IF NOT FOUND THEN
      SELECT * INTO o FROM tool_operations t
       WHERE t.run_id = p_run_id AND t.step_id = p_intent.step_id
         AND t.effect_version = p_intent.effect_version
         FOR UPDATE;
    END IF;
    IF FOUND THEN
      -- Not the id itself: an operation stored under an earlier id shape
      -- (leasegate/operation/v1) keeps that id (see _op_upsert).
      IF o.run_id <> p_run_id OR o.step_id <> p_intent.step_id
         OR o.effect_version <> p_intent.effect_version OR o.tool_name <> p_intent.tool_name
         OR o.request_digest <> p_intent.request_digest THEN
        outcome := 'intent_conflict';
      ELSIF o.status = 'prepared' THEN
        UPDATE tool_operations t
           SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
               dispatch_until = clock_timestamp() + (p_claim_ttl_ms * interval '1 millisecond'),
               dispatch_count = t.dispatch_count + 1, revision = t.revision + 1,
               updated_at = clock_timestamp(),
               first_dispatched_at = COALESCE(t.first_dispatched_at, clock_timestamp()),
               claimed_at = clock_timestamp(), claim_epoch = p_epoch, claim_worker = p_owner
         WHERE t.operation_id = o.operation_id
        RETURNING t.* INTO o;
        outcome := 'claimed';
      ELSE
        outcome := 'exists';
        result := o.result;
        SELECT w.system_identifier, w.timeline, w.wal_lsn INTO system_identifier, timeline, wal_lsn
          FROM ledger_wal_position() w;
      END IF;
      EXIT;
    END IF;
    -- The conflicting insert was rolled back, or its row is not visible yet:
    -- try again.
    IF attempt >= 3 THEN
      RAISE EXCEPTION 'intent % keeps colliding with concurrent inserts', v_id USING ERRCODE = '40001';
    END IF;
  END LOOP;

  operation_id := o.operation_id; run_id := o.run_id; step_id := o.step_id;
  effect_version := o.effect_version; tool_name := o.tool_name; request_digest := o.request_digest;
  status := o.status; revision := o.revision; dispatch_owner := o.dispatch_owner;
  dispatch_until := o.dispatch_until; dispatch_count := o.dispatch_count; remote_id := o.remote_id;
  upstream := o.upstream; upstream_tool := o.upstream_tool;
END
$$;

-- Group commit: N register-claims of (usually) different
-- runs in ONE statement and transaction, with per-item verdicts equal to
-- what operation_register_claim above (the one definition of the fence,
-- tenant, lease-token, conflict and event rules) answers for that item.
--
-- Two phases:
-- 1. The fast phase, set-based: the batch's lease rows are locked FOR
--    SHARE in run_id order (one statement), then ONE statement takes every
--    item that the single function would certainly answer 'claimed' by
--    inserting a new row (lease found, same tenant, owner and epoch, not
--    expired on the database clock, lease token set and equal, run not
--    terminal, arguments well formed, first item of its operation_id and
--    of its (run, step, effect_version) in the batch) and inserts their
--    dispatching rows (INSERT ... ON CONFLICT DO NOTHING, in (run, step)
--    order) with the claim's facts, exactly the rows the single function
--    writes (and, as it, no event). An item whose insert met an
--    existing row is not claimed here. The whole phase runs in one
--    subtransaction: if it raises (a check constraint, a deadlock), it is
--    rolled back and every item goes to phase 2.
-- 2. Every other item (refused by the fence, existing, a duplicate within
--    the batch, malformed) runs through operation_register_claim itself,
--    in (run_id, step_id, item) order, each in its own subtransaction: an
--    item that raises (bad arguments 22023, 40001 after colliding
--    inserts, a deadlock) is rolled back alone and comes back as (item,
--    error_sqlstate, error_message, outcome 'item_error'); the others
--    stand. At most 64 items: more subtransaction XIDs in one transaction
--    overflow the per-backend subxid cache.
-- Locks: lease rows FOR SHARE (run_id order), the unique index entries
-- the inserts take ((run, step) order), then phase 2's own (run, step)
-- order; a takeover of a run's lease waits for the batch's commit
-- (invariant 1), and no caller is answered before that commit. Two items
-- of the same step in one batch: the first is claimed, the second (phase
-- 2) finds that row of its own transaction and answers 'exists' with
-- status dispatching, what the second of two concurrent single calls
-- answers once the first has committed.
-- The caller (src/ledger/group.rs) sends an erroring item again alone
-- through the single function, which then answers or raises as it would
-- have; nothing of it was written by the batch.
CREATE OR REPLACE FUNCTION operation_register_claim_batch(
  p_run_ids uuid[], p_owners text[], p_epochs bigint[], p_token_sha256s bytea[],
  p_intents operation_intent[], p_dispatch_owners text[], p_claim_ttl_ms bigint[], p_tenants text[])
RETURNS TABLE (item integer, error_sqlstate text, error_message text,
  outcome text, run_status text, run_revision bigint, lease_owner text,
  lease_epoch bigint, lease_expires_at timestamptz, db_now timestamptz,
  operation_id text, run_id uuid, step_id text, effect_version integer,
  tool_name text, request_digest text, status text, revision bigint,
  dispatch_owner text, dispatch_until timestamptz, dispatch_count integer,
  remote_id text, result jsonb, evidence_id bigint, upstream text,
  upstream_tool text, system_identifier text, timeline bigint, wal_lsn bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  n           integer := cardinality(p_run_ids);
  i           integer;
  state       text;
  msg         text;
  v_now       timestamptz;
  v_claimed   integer[] := '{}';
  v_statuses  text[];
  v_revisions bigint[];
  v_expiries  timestamptz[];
BEGIN
  IF n IS NULL OR n = 0 OR n > 64 THEN
    RAISE EXCEPTION 'a register-claim batch holds 1..64 items, got %', n USING ERRCODE = '22023';
  END IF;
  IF cardinality(p_owners) <> n OR cardinality(p_epochs) <> n OR cardinality(p_token_sha256s) <> n
     OR cardinality(p_intents) <> n OR cardinality(p_dispatch_owners) <> n
     OR cardinality(p_claim_ttl_ms) <> n OR cardinality(p_tenants) <> n THEN
    RAISE EXCEPTION 'register-claim batch arrays differ in length' USING ERRCODE = '22023';
  END IF;

  -- Phase 1.
  BEGIN
    PERFORM 1 FROM worker_leases l WHERE l.run_id = ANY (p_run_ids) ORDER BY l.run_id FOR SHARE;
    v_now := clock_timestamp();
    -- unnest (estimated at 10 rows) keeps the joins on the primary keys.
    WITH items AS (
      SELECT x.k::integer AS k, x.run_id, x.owner, x.epoch, x.token_sha256, x.operation_id, x.step_id,
             x.effect_version, x.tool_name, x.request_digest, x.request_body, x.upstream, x.upstream_tool,
             x.dispatch_owner, x.claim_ttl_ms, x.tenant
        FROM unnest(p_run_ids, p_owners, p_epochs, p_token_sha256s, p_intents, p_dispatch_owners,
                    p_claim_ttl_ms, p_tenants) WITH ORDINALITY
             AS x(run_id, owner, epoch, token_sha256, operation_id, step_id, effect_version, tool_name,
                  request_digest, request_body, upstream, upstream_tool, dispatch_owner, claim_ttl_ms,
                  tenant, k)
    ), fenced AS (
      SELECT it.*, r.status AS run_status, r.revision AS run_revision, l.expires_at,
             row_number() OVER (PARTITION BY it.operation_id ORDER BY it.k) AS nth_of_id,
             row_number() OVER (PARTITION BY it.run_id, it.step_id, it.effect_version ORDER BY it.k) AS nth_of_step
        FROM items it
        JOIN worker_leases l ON l.run_id = it.run_id
        JOIN agent_runs r ON r.run_id = it.run_id
       WHERE it.operation_id IS NOT NULL AND it.step_id IS NOT NULL AND it.effect_version IS NOT NULL
         AND it.tool_name IS NOT NULL AND it.request_digest IS NOT NULL
         AND it.dispatch_owner <> '' AND it.claim_ttl_ms > 0
         AND (it.tenant IS NULL OR r.tenant_id = it.tenant)
         AND l.epoch = it.epoch AND l.expires_at > v_now
         AND CASE WHEN l.held_by_members
                  THEN EXISTS (SELECT 1 FROM lease_members m
                                WHERE m.run_id = it.run_id AND m.member = it.owner
                                  AND m.token_sha256 = it.token_sha256 AND m.alive_until > v_now)
                  ELSE l.owner = it.owner AND l.token_sha256 IS NOT NULL AND l.token_sha256 = it.token_sha256
             END
         AND r.status NOT IN ('succeeded', 'failed', 'cancelled')
    ), inserted AS (
      INSERT INTO tool_operations AS t (operation_id, run_id, step_id, effect_version, tool_name,
                                        request_digest, request_body, status, upstream, upstream_tool,
                                        dispatch_owner, dispatch_until, dispatch_count, revision,
                                        first_dispatched_at, claimed_at, claim_epoch, claim_worker)
      SELECT f.operation_id, f.run_id, f.step_id, f.effect_version, f.tool_name, f.request_digest,
             COALESCE(f.request_body, 'null'::jsonb), 'dispatching', f.upstream, f.upstream_tool,
             f.dispatch_owner, v_now + (f.claim_ttl_ms * interval '1 millisecond'), 1, 1, v_now,
             v_now, f.epoch, f.owner
        FROM fenced f
       WHERE f.nth_of_id = 1 AND f.nth_of_step = 1
       ORDER BY f.run_id, f.step_id, f.k
      ON CONFLICT DO NOTHING
      RETURNING t.operation_id
    ), claimed AS (
      SELECT f.*
        FROM inserted ins JOIN fenced f ON f.operation_id = ins.operation_id AND f.nth_of_id = 1
    )
    SELECT COALESCE(array_agg(c.k ORDER BY c.k), '{}'), array_agg(c.run_status ORDER BY c.k),
           array_agg(c.run_revision ORDER BY c.k), array_agg(c.expires_at ORDER BY c.k)
      INTO v_claimed, v_statuses, v_revisions, v_expiries
      FROM claimed c;
  EXCEPTION WHEN OTHERS THEN
    v_claimed := '{}';
  END;
  RETURN QUERY
    SELECT c.k, NULL::text, NULL::text, 'claimed'::text, c.run_status, c.run_revision, p_owners[c.k],
           p_epochs[c.k], c.expires_at, v_now, (p_intents[c.k]).operation_id, p_run_ids[c.k],
           (p_intents[c.k]).step_id, (p_intents[c.k]).effect_version, (p_intents[c.k]).tool_name,
           (p_intents[c.k]).request_digest, 'dispatching'::text, 1::bigint, p_dispatch_owners[c.k],
           v_now + (p_claim_ttl_ms[c.k] * interval '1 millisecond'), 1, NULL::text, NULL::jsonb,
           NULL::bigint, (p_intents[c.k]).upstream, (p_intents[c.k]).upstream_tool, NULL::text,
           NULL::bigint, NULL::bigint
      FROM unnest(v_claimed, v_statuses, v_revisions, v_expiries) AS c(k, run_status, run_revision, expires_at);

  -- Phase 2.
  FOR i IN
    SELECT g.k FROM generate_subscripts(p_run_ids, 1) AS g(k)
     WHERE g.k <> ALL (v_claimed)
     ORDER BY p_run_ids[g.k], (p_intents[g.k]).step_id, g.k
  LOOP
    BEGIN
      RETURN QUERY
        SELECT i, NULL::text, NULL::text, c.*
          FROM operation_register_claim(p_run_ids[i], p_owners[i], p_epochs[i], p_token_sha256s[i],
                                        p_intents[i], p_dispatch_owners[i], p_claim_ttl_ms[i],
                                        p_tenants[i]) c;
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      item := i; error_sqlstate := state; error_message := msg;
      outcome := 'item_error'; run_status := NULL; run_revision := NULL; lease_owner := NULL;
      lease_epoch := NULL; lease_expires_at := NULL; db_now := clock_timestamp();
      operation_id := NULL; run_id := NULL; step_id := NULL; effect_version := NULL;
      tool_name := NULL; request_digest := NULL; status := NULL; revision := NULL;
      dispatch_owner := NULL; dispatch_until := NULL; dispatch_count := NULL; remote_id := NULL;
      result := NULL; evidence_id := NULL; upstream := NULL; upstream_tool := NULL;
      system_identifier := NULL; timeline := NULL; wal_lsn := NULL;
      RETURN NEXT;
    END;
  END LOOP;
END
$$;

-- The dispatcher's claim (seed 9.2): up to p_limit prepared operations of
-- live runs of p_tenants (NULL: every tenant), oldest first, skipping rows
-- another claimer holds. Each
-- candidate is locked as the loop reads it (READ COMMITTED re-checks the
-- status on the newest row version) and claimed by _op_claim; the LIMIT
-- bounds the batch.
DROP FUNCTION IF EXISTS operation_claim(text, bigint, integer, text[]);
CREATE OR REPLACE FUNCTION operation_claim(p_dispatch_owner text, p_claim_ttl_ms bigint, p_limit integer,
                                           p_tenants text[], p_unavailable text[])
RETURNS SETOF tool_operations
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  candidate text;
  claimed   tool_operations;
BEGIN
  PERFORM _check_claim_args(p_dispatch_owner, p_claim_ttl_ms);
  IF p_limit IS NULL OR p_limit <= 0 OR p_limit > 1000 THEN
    RAISE EXCEPTION 'claim batch must be 1..1000, got %', p_limit USING ERRCODE = '22023';
  END IF;
  FOR candidate IN
    SELECT o.operation_id
      FROM tool_operations o
      JOIN agent_runs r ON r.run_id = o.run_id
     WHERE o.status = 'prepared'
       AND r.status IN ('pending', 'running')
       AND (p_tenants IS NULL OR r.tenant_id = ANY (p_tenants))
       AND (o.not_before IS NULL OR o.not_before <= clock_timestamp())
       AND (o.upstream IS NULL OR p_unavailable IS NULL OR NOT (o.upstream = ANY (p_unavailable)))
     ORDER BY o.updated_at
     LIMIT p_limit
       FOR UPDATE OF o SKIP LOCKED
  LOOP
    claimed := _op_claim(candidate, p_dispatch_owner, p_claim_ttl_ms);
    IF claimed.operation_id IS NOT NULL THEN
      RETURN NEXT claimed;
    END IF;
  END LOOP;
END
$$;

-- An upstream is reachable again: the prepared operations of runs of
-- p_tenants (NULL: every tenant) routed to it that wait out a "not sent"
-- backoff may be claimed at once. Returns how many. The backoff paces
-- sends at an upstream that keeps refusing; once it answers, waiting longer
-- only delays calls that are known never to have left.
CREATE OR REPLACE FUNCTION operation_wake_prepared(p_upstream text, p_tenants text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  woken bigint;
BEGIN
  UPDATE tool_operations o
     SET not_before = NULL
    FROM agent_runs r
   WHERE r.run_id = o.run_id
     AND o.status = 'prepared' AND o.upstream = p_upstream
     AND o.not_before > clock_timestamp()
     AND (p_tenants IS NULL OR r.tenant_id = ANY (p_tenants));
  GET DIAGNOSTICS woken = ROW_COUNT;
  RETURN woken;
END
$$;

-- Settle from a verified response (seed 9.3): only the live claim (same
-- dispatch owner and revision, same request digest) may settle. An answer
-- under a claim the operation once had is stored as evidence of kind
-- 'late_response' and settles nothing: 'stale_claim' (the operation moved
-- on: unknown, re-claimed, settled, cancelled) or 'digest_mismatch'. An
-- owner and revision that never claimed the operation keep nothing:
-- 'not_claimed'. A claim was the operation's if it is the row's live claim,
-- or an event that ended a claim carries it ("claim" in its detail,
-- migrations/0017), or, for a claim taken before 0017, its own
-- 'dispatching' event exists. The reconciler converges an unknown
-- operation from late_response evidence, so evidence from a claim that
-- never was would be a convergence without any claim.
-- The live claim settles in one guarded UPDATE (the guard is the claim
-- itself; its row lock orders it after any concurrent change), plus its
-- event: the one event of the claim, carrying the claim's facts from the
-- row (who, when, the epoch, the dispatch number, the claim's revision)
-- and its epoch. The answer names the operation as it is now, without the
-- result (the caller sent it) and without the run and lease (settling has
-- no fence verdicts).
CREATE OR REPLACE FUNCTION operation_settle(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint,
  p_request_digest text, p_status text, p_remote_id text, p_result jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o  tool_operations;
  c  record;
  ev bigint;
BEGIN
  IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'settle status must be succeeded or failed_final, got %', p_status USING ERRCODE = '22023';
  END IF;
  UPDATE tool_operations
     SET status = p_status, remote_id = p_remote_id, result = p_result, dispatch_until = NULL,
         revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id AND status = 'dispatching' AND dispatch_owner = p_dispatch_owner
     AND revision = p_expected_revision AND request_digest = p_request_digest
  RETURNING operation_id, run_id, step_id, effect_version, tool_name, request_digest, status, revision,
            dispatch_owner, dispatch_until, dispatch_count, remote_id, upstream, upstream_tool,
            claim_epoch, claim_worker, claimed_at
       INTO c;
  IF FOUND THEN
    -- The settled row's answer and claim facts only (the whole row would
    -- carry the request's arguments and the result along).
    INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                               actor, epoch, revision, detail)
    VALUES (c.run_id, c.operation_id, 'operation', 'dispatching', p_status, 'dispatcher',
            p_dispatch_owner, c.claim_epoch, c.revision,
            jsonb_build_object('claim', jsonb_build_object(
                'dispatch_owner', p_dispatch_owner, 'worker', c.claim_worker, 'at', c.claimed_at,
                'epoch', c.claim_epoch, 'dispatch_count', c.dispatch_count, 'revision', p_expected_revision,
                'inline', c.claim_worker IS NOT NULL))
              || CASE WHEN p_remote_id IS NULL THEN '{}'::jsonb
                      ELSE jsonb_build_object('remote_id', p_remote_id) END);
    RETURN ROW('settled', NULL, NULL, NULL, NULL, NULL, clock_timestamp(), c.operation_id, c.run_id,
               c.step_id, c.effect_version, c.tool_name, c.request_digest, c.status, c.revision,
               c.dispatch_owner, c.dispatch_until, c.dispatch_count, c.remote_id, NULL, NULL,
               c.upstream, c.upstream_tool)::operation_result;
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', NULL, p_operation_id, NULL);
  END IF;
  IF NOT (o.status = 'dispatching' AND o.dispatch_owner = p_dispatch_owner
          AND o.revision = p_expected_revision)
     AND NOT EXISTS (SELECT 1 FROM ledger_events e
                      WHERE e.operation_id = p_operation_id
                        AND ((e.to_status = 'dispatching' AND e.actor = p_dispatch_owner
                              AND e.revision = p_expected_revision)
                             OR (e.detail->'claim'->>'dispatch_owner' = p_dispatch_owner
                                 AND (e.detail->'claim'->>'revision')::bigint = p_expected_revision))) THEN
    RETURN _op_result('not_claimed', o.run_id, p_operation_id, NULL);
  END IF;
  INSERT INTO operation_evidence (operation_id, kind, source, claim_owner, claim_revision, outcome,
                                  remote_id, body)
  VALUES (p_operation_id, 'late_response', p_dispatch_owner, p_dispatch_owner, p_expected_revision,
          p_status, p_remote_id,
          jsonb_build_object('result', p_result, 'request_digest', p_request_digest,
                             'found_status', o.status, 'found_revision', o.revision))
  RETURNING evidence_id INTO ev;
  RETURN _op_result(CASE WHEN o.request_digest <> p_request_digest THEN 'digest_mismatch' ELSE 'stale_claim' END,
                    o.run_id, p_operation_id, ev);
END
$$;

-- operation_settle, committed, then where the WAL stands: one statement
-- (CALL), so the proxy's settle and its durability sample are one round
-- trip. The COMMIT returns once the commit is as durable as the session's
-- synchronous_commit makes it (invariant of src/durability: at least 'on'
-- under sync_replica); the position is read after it, so it is at or
-- beyond the end of this settle's commit record: an upper bound of what
-- was acknowledged, as the separate sample was. A WAL position read inside
-- the settle's own transaction would not be (the commit record comes after
-- it), which is why this is a procedure.
-- A procedure that commits can be neither SECURITY DEFINER nor carry a SET
-- clause: it runs as the caller (leasegate_app), calls only granted
-- functions, schema-qualified. On an error before the COMMIT nothing is
-- written; a connection lost after it is "outcome unknown" as for any call.
CREATE OR REPLACE PROCEDURE operation_settle_acknowledged(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint,
  p_request_digest text, p_status text, p_remote_id text, p_result jsonb,
  INOUT outcome text DEFAULT NULL, INOUT db_now timestamptz DEFAULT NULL,
  INOUT operation_id text DEFAULT NULL, INOUT run_id uuid DEFAULT NULL, INOUT step_id text DEFAULT NULL,
  INOUT effect_version integer DEFAULT NULL, INOUT tool_name text DEFAULT NULL,
  INOUT request_digest text DEFAULT NULL, INOUT status text DEFAULT NULL,
  INOUT revision bigint DEFAULT NULL, INOUT dispatch_owner text DEFAULT NULL,
  INOUT dispatch_until timestamptz DEFAULT NULL, INOUT dispatch_count integer DEFAULT NULL,
  INOUT remote_id text DEFAULT NULL, INOUT evidence_id bigint DEFAULT NULL,
  INOUT upstream text DEFAULT NULL, INOUT upstream_tool text DEFAULT NULL,
  INOUT system_identifier text DEFAULT NULL, INOUT timeline bigint DEFAULT NULL,
  INOUT wal_lsn bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  SELECT s.outcome, s.db_now, s.operation_id, s.run_id, s.step_id, s.effect_version, s.tool_name,
         s.request_digest, s.status, s.revision, s.dispatch_owner, s.dispatch_until,
         s.dispatch_count, s.remote_id, s.evidence_id, s.upstream, s.upstream_tool
    INTO outcome, db_now, operation_id, run_id, step_id, effect_version, tool_name,
         request_digest, status, revision, dispatch_owner, dispatch_until,
         dispatch_count, remote_id, evidence_id, upstream, upstream_tool
    FROM public.operation_settle(p_operation_id, p_dispatch_owner, p_expected_revision,
                                 p_request_digest, p_status, p_remote_id, p_result) s;
  COMMIT;
  SELECT w.system_identifier, w.timeline, w.wal_lsn INTO system_identifier, timeline, wal_lsn
    FROM public.ledger_wal_position() w;
END
$$;

-- Group commit of settles, the writes: N operation_settle
-- calls' worth in one transaction (not committed here: see
-- operation_settle_acknowledged_batch below). The verdicts come back as
-- one jsonb array, element k answering item k+1: {"item",
-- "error_sqlstate", "error_message"} or the operation_result fields.
-- Two phases, as in operation_register_claim_batch:
-- 1. Set-based, in one subtransaction: ONE statement settles every item
--    that is the live claim (status dispatching, same dispatch owner,
--    revision and request digest; a valid status; the first item of its
--    operation_id in the batch) with operation_settle's guarded UPDATE
--    and writes the same dispatching -> status event, with the claim's
--    facts; its answer is the one operation_settle gives ('settled'). If the phase raises, it is
--    rolled back and every item goes to phase 2.
-- 2. Every other item (a stale claim, a digest mismatch, a second settle
--    of one claim in the batch, a bad status) runs through
--    operation_settle itself (the one definition of the late-response
--    evidence and of every refusal), in operation_id order, each in its
--    own subtransaction: one that raises comes back with its
--    error_sqlstate/error_message and nothing written, the others stand
--    (at most 64 items, the subxid cache).
-- Each item locks only its own operation row.
CREATE OR REPLACE FUNCTION operation_settle_batch(
  p_operation_ids text[], p_dispatch_owners text[], p_expected_revisions bigint[],
  p_request_digests text[], p_statuses text[], p_remote_ids text[], p_results jsonb[])
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  n         integer := cardinality(p_operation_ids);
  i         integer;
  s         operation_result;
  state     text;
  msg       text;
  answers   jsonb[];
  v_settled jsonb[];
  v_done    integer[] := '{}';
BEGIN
  IF n IS NULL OR n = 0 OR n > 64 THEN
    RAISE EXCEPTION 'a settle batch holds 1..64 items, got %', n USING ERRCODE = '22023';
  END IF;
  IF cardinality(p_dispatch_owners) <> n OR cardinality(p_expected_revisions) <> n
     OR cardinality(p_request_digests) <> n OR cardinality(p_statuses) <> n
     OR cardinality(p_remote_ids) <> n OR cardinality(p_results) <> n THEN
    RAISE EXCEPTION 'settle batch arrays differ in length' USING ERRCODE = '22023';
  END IF;
  answers := array_fill(NULL::jsonb, ARRAY[n]);

  -- Phase 1.
  BEGIN
    -- unnest (estimated at 10 rows) keeps the UPDATE on the primary key.
    WITH items AS (
      SELECT DISTINCT ON (x.operation_id) x.k::integer AS k, x.operation_id, x.dispatch_owner,
             x.expected_revision, x.request_digest, x.status, x.remote_id, x.result
        FROM unnest(p_operation_ids, p_dispatch_owners, p_expected_revisions, p_request_digests,
                    p_statuses, p_remote_ids, p_results) WITH ORDINALITY
             AS x(operation_id, dispatch_owner, expected_revision, request_digest, status, remote_id,
                  result, k)
       WHERE x.status IN ('succeeded', 'failed_final')
       ORDER BY x.operation_id, x.k
    ), settled AS (
      UPDATE tool_operations t
         SET status = it.status, remote_id = it.remote_id, result = it.result,
             dispatch_until = NULL, revision = t.revision + 1, updated_at = clock_timestamp()
        FROM items it
       WHERE t.operation_id = it.operation_id AND t.status = 'dispatching'
         AND t.dispatch_owner = it.dispatch_owner AND t.revision = it.expected_revision
         AND t.request_digest = it.request_digest
      RETURNING it.k, t.*
    ), events AS (
      INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                                 actor, epoch, revision, detail)
      SELECT st.run_id, st.operation_id, 'operation', 'dispatching', st.status, 'dispatcher',
             p_dispatch_owners[st.k], st.claim_epoch, st.revision,
             jsonb_build_object('claim', jsonb_build_object(
                 'dispatch_owner', p_dispatch_owners[st.k], 'worker', st.claim_worker,
                 'at', st.claimed_at, 'epoch', st.claim_epoch, 'dispatch_count', st.dispatch_count,
                 'revision', p_expected_revisions[st.k], 'inline', st.claim_worker IS NOT NULL))
               || CASE WHEN p_remote_ids[st.k] IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('remote_id', p_remote_ids[st.k]) END
        FROM settled st
       ORDER BY st.operation_id
    )
    SELECT COALESCE(array_agg(st.k), '{}'),
           array_agg(to_jsonb(ROW('settled', NULL, NULL, NULL, NULL, NULL, clock_timestamp(),
                                  st.operation_id, st.run_id, st.step_id, st.effect_version, st.tool_name,
                                  st.request_digest, st.status, st.revision, st.dispatch_owner,
                                  st.dispatch_until, st.dispatch_count, st.remote_id, NULL, NULL,
                                  st.upstream, st.upstream_tool)::operation_result)
                     || jsonb_build_object('item', st.k))
      INTO v_done, v_settled
      FROM settled st;
  EXCEPTION WHEN OTHERS THEN
    v_done := '{}';
  END;
  FOR i IN 1 .. cardinality(v_done) LOOP
    answers[v_done[i]] := v_settled[i];
  END LOOP;

  -- Phase 2.
  FOR i IN
    SELECT g.k FROM generate_subscripts(p_operation_ids, 1) AS g(k)
     WHERE g.k <> ALL (v_done)
     ORDER BY p_operation_ids[g.k], g.k
  LOOP
    BEGIN
      s := operation_settle(p_operation_ids[i], p_dispatch_owners[i], p_expected_revisions[i],
                            p_request_digests[i], p_statuses[i], p_remote_ids[i], p_results[i]);
      answers[i] := to_jsonb(s) || jsonb_build_object('item', i);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      answers[i] := jsonb_build_object('item', i, 'error_sqlstate', state, 'error_message', msg);
    END;
  END LOOP;
  RETURN to_jsonb(answers);
END
$$;

-- Group commit of settles: operation_settle_batch, committed once, then
-- where the WAL stands: read after the COMMIT, as
-- operation_settle_acknowledged does, so it bounds every settle of the
-- batch. A procedure (it commits), so not SECURITY DEFINER: the writes are
-- operation_settle_batch's. On an error before the COMMIT nothing is
-- written; a connection lost after it is "outcome unknown" for every
-- item, as for one.
CREATE OR REPLACE PROCEDURE operation_settle_acknowledged_batch(
  p_operation_ids text[], p_dispatch_owners text[], p_expected_revisions bigint[],
  p_request_digests text[], p_statuses text[], p_remote_ids text[], p_results jsonb[],
  INOUT verdicts jsonb DEFAULT NULL, INOUT system_identifier text DEFAULT NULL,
  INOUT timeline bigint DEFAULT NULL, INOUT wal_lsn bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  verdicts := public.operation_settle_batch(p_operation_ids, p_dispatch_owners, p_expected_revisions,
                                            p_request_digests, p_statuses, p_remote_ids, p_results);
  COMMIT;
  SELECT w.system_identifier, w.timeline, w.wal_lsn INTO system_identifier, timeline, wal_lsn
    FROM public.ledger_wal_position() w;
END
$$;

-- dispatching -> unknown, guarded by the original dispatch owner and
-- revision (seed 9.2). The reconciler may do it only once the claim has
-- expired or its holder is provably gone (leasegate_processes; 'claim_live'
-- otherwise); the claim holder itself may give up its
-- live claim at once (p_holder: its request timed out or broke after bytes
-- may have left). The evidence (error, timeout) is kept.
CREATE OR REPLACE FUNCTION operation_mark_unknown(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint,
  p_holder boolean, p_actor text, p_evidence_kind text, p_evidence jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o  tool_operations;
  ev bigint;
BEGIN
  IF p_evidence_kind IS NULL OR p_evidence_kind NOT IN ('timeout', 'send_error') THEN
    RAISE EXCEPTION 'unknown evidence kind must be timeout or send_error, got %', p_evidence_kind
      USING ERRCODE = '22023';
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', NULL, p_operation_id, NULL);
  END IF;
  IF o.status IS DISTINCT FROM 'dispatching' OR o.dispatch_owner IS DISTINCT FROM p_dispatch_owner
     OR o.revision <> p_expected_revision THEN
    RETURN _op_result('stale_claim', o.run_id, p_operation_id, NULL);
  END IF;
  IF NOT p_holder AND o.dispatch_until > clock_timestamp() AND NOT _holder_gone(o.dispatch_owner) THEN
    RETURN _op_result('claim_live', o.run_id, p_operation_id, NULL);
  END IF;
  INSERT INTO operation_evidence (operation_id, kind, source, claim_owner, claim_revision, outcome, body)
  VALUES (p_operation_id, p_evidence_kind, p_actor, o.dispatch_owner, o.revision, 'unknown',
          COALESCE(p_evidence, '{}'::jsonb))
  RETURNING evidence_id INTO ev;
  UPDATE tool_operations
     SET status = 'unknown', dispatch_owner = NULL, dispatch_until = NULL,
         revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, epoch, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'dispatching', 'unknown',
          CASE WHEN p_holder THEN 'dispatcher' ELSE 'reconciler' END, p_actor, o.claim_epoch, o.revision + 1,
          jsonb_build_object('evidence_id', ev, 'dispatch_owner', o.dispatch_owner,
                             'dispatch_until', o.dispatch_until, 'claim_expired', NOT p_holder,
                             'claim', _op_claim_facts(o)));
  RETURN _op_result('marked_unknown', o.run_id, p_operation_id, ev);
END
$$;

-- One round of a call that asked its agent something before it answered
-- (sampling, elicitation, roots; to a 2026-07-28 agent an input_required
-- result and the agent's retry), recorded under the dispatch claim that
-- carries the call: evidence of kind input_round, no status change and no
-- event. A claim that is no longer the operation's records nothing (false).
CREATE OR REPLACE FUNCTION operation_note_round(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_body jsonb
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  INSERT INTO operation_evidence (operation_id, kind, source, claim_owner, claim_revision, body)
  SELECT o.operation_id, 'input_round', p_dispatch_owner, o.dispatch_owner, o.revision,
         COALESCE(p_body, '{}'::jsonb)
    FROM tool_operations o
   WHERE o.operation_id = p_operation_id AND o.status = 'dispatching'
     AND o.dispatch_owner = p_dispatch_owner AND o.revision = p_expected_revision;
  RETURN FOUND;
END
$$;

-- A task the upstream made of a dispatched call (MCP Tasks extension): its
-- handle recorded as task evidence under the dispatch claim (p_body not
-- NULL, once per task), and the claim extended to now + p_extend_ms while
-- its holder follows the task (never shortened, never revived: a claim
-- that has lapsed stays lapsed, and claim expiry turns it unknown, where
-- the reconciler follows the task from this evidence). No status change,
-- no revision bump: the settle that follows is the claim's own. FALSE:
-- the claim is no longer the operation's, or has lapsed; nothing written.
CREATE OR REPLACE FUNCTION operation_follow_task(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_body jsonb,
  p_extend_ms bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  IF p_extend_ms IS NULL OR p_extend_ms < 0 OR p_extend_ms > 86400000 THEN
    RAISE EXCEPTION 'claim extension must be 0 to 86400000 ms, got %', p_extend_ms USING ERRCODE = '22023';
  END IF;
  UPDATE tool_operations
     SET dispatch_until = GREATEST(dispatch_until,
                                   clock_timestamp() + make_interval(secs => p_extend_ms / 1000.0))
   WHERE operation_id = p_operation_id AND status = 'dispatching'
     AND dispatch_owner = p_dispatch_owner AND revision = p_expected_revision
     AND dispatch_until > clock_timestamp()
  RETURNING * INTO o;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF p_body IS NOT NULL THEN
    INSERT INTO operation_evidence (operation_id, kind, source, claim_owner, claim_revision, body)
    VALUES (o.operation_id, 'task', p_dispatch_owner, o.dispatch_owner, o.revision, p_body);
  END IF;
  RETURN true;
END
$$;

-- dispatching -> prepared, by the claim's holder only, with proof that no
-- byte of the request left (the upstream was unreachable before the request
-- was handed over). The proof is kept as not_sent evidence. The operation
-- can then be claimed again under the same operation id: by the agent's
-- re-call at once, by the outbox after a backoff (5 s doubling per not_sent
-- proof of this operation, at most 5 min), so a long outage costs few rows.
CREATE OR REPLACE FUNCTION operation_release_unsent(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_evidence jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o       tool_operations;
  ev      bigint;
  proofs  integer;
BEGIN
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', NULL, p_operation_id, NULL);
  END IF;
  IF o.status IS DISTINCT FROM 'dispatching' OR o.dispatch_owner IS DISTINCT FROM p_dispatch_owner
     OR o.revision <> p_expected_revision THEN
    RETURN _op_result('stale_claim', o.run_id, p_operation_id, NULL);
  END IF;
  INSERT INTO operation_evidence (operation_id, kind, source, claim_owner, claim_revision, outcome, body)
  VALUES (p_operation_id, 'not_sent', p_dispatch_owner, o.dispatch_owner, o.revision, 'not_sent',
          COALESCE(p_evidence, '{}'::jsonb))
  RETURNING evidence_id INTO ev;
  SELECT count(*) INTO proofs FROM operation_evidence
   WHERE operation_id = p_operation_id AND kind = 'not_sent';
  UPDATE tool_operations
     SET status = 'prepared', dispatch_owner = NULL, dispatch_until = NULL,
         not_before = clock_timestamp()
                      + LEAST(interval '5 minutes', interval '5 seconds' * power(2, LEAST(proofs - 1, 16))),
         revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, epoch, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'dispatching', 'prepared', 'dispatcher',
          p_dispatch_owner, o.claim_epoch, o.revision + 1,
          jsonb_build_object('evidence_id', ev, 'not_sent', true,
                             'claim', _op_claim_facts(o)));
  RETURN _op_result('released', o.run_id, p_operation_id, ev);
END
$$;

-- unknown -> succeeded | failed_final from verified evidence: a query of
-- the remote by operation id, a same-key retry, or an operator's resolution
-- (which needs a note). The evidence is stored and cited by the event.
-- Shared by operation_converge (the reconciler, as leasegate_app) and
-- operation_resolve (an operator, as leasegate_operator).
CREATE OR REPLACE FUNCTION _op_converge(
  p_operation_id text, p_expected_revision bigint, p_status text, p_remote_id text,
  p_result jsonb, p_kind text, p_actor text, p_note text, p_evidence jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  o  tool_operations;
  ev bigint;
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
  VALUES (p_operation_id, p_kind, p_actor, p_status, p_remote_id,
          COALESCE(p_evidence, '{}'::jsonb)
            || jsonb_build_object('note', p_note, 'result', p_result))
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

-- The reconciler's convergence (leasegate_app): evidence from the remote
-- only — a query, a same-key retry, a late response. An operator's
-- resolution is operation_resolve's, which the app role cannot run.
CREATE OR REPLACE FUNCTION operation_converge(
  p_operation_id text, p_expected_revision bigint, p_status text, p_remote_id text,
  p_result jsonb, p_kind text, p_actor text, p_note text, p_evidence jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  IF p_kind = 'operator' THEN
    RAISE EXCEPTION 'an operator resolution is operation_resolve, run as leasegate_operator'
      USING ERRCODE = '42501';
  END IF;
  -- Evidence converges an operation only in the hands of the reconciler
  -- that claimed it (operation_reconcile_claim) while its claim lives: the
  -- application role cannot settle an operation it did not set out to
  -- reconcile. The row's revision is judged by _op_converge.
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id;
  IF FOUND AND o.status = 'unknown'
     AND (o.reconcile_owner IS DISTINCT FROM p_actor
          OR o.reconcile_until IS NULL OR o.reconcile_until <= clock_timestamp()) THEN
    RETURN _op_result('stale_claim', o.run_id, p_operation_id, NULL);
  END IF;
  RETURN _op_converge(p_operation_id, p_expected_revision, p_status, p_remote_id, p_result,
                      p_kind, p_actor, p_note, p_evidence);
END
$$;

-- An operator's resolution of an unknown operation (leasegate_operator
-- only): unknown -> succeeded | failed_final with who and why (a note is
-- required), kept as 'operator' evidence and cited by the event.
CREATE OR REPLACE FUNCTION operation_resolve(
  p_operation_id text, p_expected_revision bigint, p_status text, p_remote_id text,
  p_result jsonb, p_actor text, p_note text, p_evidence jsonb
) RETURNS operation_result
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  SELECT _op_converge(p_operation_id, p_expected_revision, p_status, p_remote_id, p_result,
                      'operator', p_actor, p_note, p_evidence)
$$;

-- Changes a planned intent (seed 9.3): the old prepared row becomes
-- cancelled with superseded_by set, a new row with a higher effect_version
-- of the same step is registered; both kept for audit. Only a prepared
-- intent can change: once claimed, the side effect may be under way
-- ('not_changeable').
-- p_token_sha256: the lease token's hash, judged by _lease_fence.
DROP FUNCTION IF EXISTS operation_supersede(uuid, text, bigint, text, operation_intent);
CREATE OR REPLACE FUNCTION operation_supersede(
  p_run_id uuid, p_owner text, p_epoch bigint, p_token_sha256 bytea, p_old_operation_id text,
  p_new_intent operation_intent
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict   text;
  old       tool_operations;
  v_outcome text;
  v_found   text;
BEGIN
  verdict := _lease_fence(p_run_id, p_owner, p_epoch, p_token_sha256, true);
  IF verdict <> 'valid' THEN
    RETURN _op_result(verdict, p_run_id, NULL, NULL);
  END IF;
  SELECT * INTO old FROM tool_operations
   WHERE operation_id = p_old_operation_id AND run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', p_run_id, NULL, NULL);
  END IF;
  IF old.status <> 'prepared' THEN
    RETURN _op_result('not_changeable', p_run_id, p_old_operation_id, NULL);
  END IF;
  IF p_new_intent.step_id IS DISTINCT FROM old.step_id
     OR p_new_intent.effect_version <= old.effect_version THEN
    RAISE EXCEPTION 'a changed intent keeps step % and raises effect_version above %',
      old.step_id, old.effect_version USING ERRCODE = '22023';
  END IF;
  SELECT * INTO v_outcome, v_found FROM _op_upsert(p_run_id, p_new_intent, p_owner, p_epoch);
  IF v_outcome = 'intent_conflict' THEN
    RETURN _op_result('intent_conflict', p_run_id, v_found, NULL);
  END IF;
  UPDATE tool_operations
     SET status = 'cancelled', superseded_by = v_found, revision = revision + 1,
         updated_at = clock_timestamp()
   WHERE operation_id = p_old_operation_id;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, epoch, revision, detail)
  VALUES (p_run_id, p_old_operation_id, 'operation', 'prepared', 'cancelled', 'worker', p_owner,
          p_epoch, old.revision + 1, jsonb_build_object('superseded_by', v_found));
  RETURN _op_result('superseded', p_run_id, v_found, NULL);
END
$$;

-- Claims up to p_limit unknown operations of runs of p_tenants (NULL: every
-- tenant) for one reconciler until p_ttl_ms from now: those nobody holds,
-- or whose reconcile claim lapsed.
-- The status stays 'unknown'; the revision moves. The MATERIALIZED CTE fixes
-- the candidate set before the UPDATE (SKIP LOCKED), so no more than
-- p_limit rows are claimed.
CREATE OR REPLACE FUNCTION operation_reconcile_claim(p_owner text, p_ttl_ms bigint, p_limit integer,
                                                     p_tenants text[])
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
      JOIN agent_runs r ON r.run_id = o.run_id
     WHERE o.status = 'unknown'
       AND (o.reconcile_until IS NULL OR o.reconcile_until <= clock_timestamp())
       AND (p_tenants IS NULL OR r.tenant_id = ANY (p_tenants))
     ORDER BY o.updated_at
     LIMIT p_limit
       FOR UPDATE OF o SKIP LOCKED
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
CREATE OR REPLACE FUNCTION operation_reconcile_attempt(
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

-- A same-key retry that provably never left leasegate (nothing was sent:
-- the upstream was down) gives its attempt back, under the reconcile claim
-- and the revision operation_reconcile_attempt returned, so a down upstream
-- does not spend the retry budget.
-- outcome: refunded | stale_claim.
CREATE OR REPLACE FUNCTION operation_reconcile_refund(
  p_operation_id text, p_owner text, p_expected_revision bigint,
  OUT outcome text, OUT revision bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND OR o.status <> 'unknown' OR o.reconcile_owner IS DISTINCT FROM p_owner
     OR o.revision <> p_expected_revision OR o.reconcile_attempts = 0 THEN
    outcome := 'stale_claim';
    RETURN;
  END IF;
  UPDATE tool_operations
     SET reconcile_attempts = reconcile_attempts - 1, revision = tool_operations.revision + 1
   WHERE operation_id = p_operation_id
  RETURNING tool_operations.revision INTO revision;
  outcome := 'refunded';
END
$$;

-- A reconciler that proved nothing this time (no answer, not found yet,
-- upstream restarting) hands its claim back early: the operation may be
-- claimed again after p_retry_after_ms instead of after the whole claim
-- ttl. Only the claim's owner can; the status never changes here.
-- outcome: released | stale_claim.
CREATE OR REPLACE FUNCTION operation_reconcile_release(
  p_operation_id text, p_owner text, p_retry_after_ms bigint, OUT outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  IF p_retry_after_ms IS NULL OR p_retry_after_ms < 0 THEN
    RAISE EXCEPTION 'retry after must be >= 0 ms, got %', p_retry_after_ms USING ERRCODE = '22023';
  END IF;
  UPDATE tool_operations
     SET reconcile_until = LEAST(reconcile_until,
                                 clock_timestamp() + (p_retry_after_ms * interval '1 millisecond'))
   WHERE operation_id = p_operation_id AND status = 'unknown' AND reconcile_owner = p_owner;
  outcome := CASE WHEN FOUND THEN 'released' ELSE 'stale_claim' END;
END
$$;

-- A reconciler re-sends an unknown operation under the same operation id,
-- under its reconcile claim, after the tool answered an authoritative "not
-- found" (operation_query / resource_id tools, whose adapter opts in with
-- resend_after_not_found): unknown -> prepared, where the dispatcher (or the
-- agent's re-call) sends it again. Only once p_settle_ms have passed since
-- the operation was last sent (its last claim, on the database clock), so
-- a first request still in flight has had time to land; counted against
-- the same budget as same-key retries. The query answer is kept as
-- evidence.
-- outcome: resent | settling | budget_spent | stale_claim.
CREATE OR REPLACE FUNCTION operation_reconcile_resend(
  p_operation_id text, p_owner text, p_expected_revision bigint, p_settle_ms bigint,
  p_max_attempts integer, p_evidence jsonb,
  OUT outcome text, OUT revision bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o         tool_operations;
  last_sent timestamptz;
  ev        bigint;
BEGIN
  IF p_settle_ms IS NULL OR p_settle_ms < 0 THEN
    RAISE EXCEPTION 'settle delay must be >= 0 ms, got %', p_settle_ms USING ERRCODE = '22023';
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND OR o.status <> 'unknown' OR o.reconcile_owner IS DISTINCT FROM p_owner
     OR o.revision <> p_expected_revision OR o.reconcile_until <= clock_timestamp() THEN
    outcome := 'stale_claim';
    RETURN;
  END IF;
  revision := o.revision;
  -- The last claim's time is on the row (migrations/0017); a claim taken
  -- before that has its own 'dispatching' event.
  last_sent := o.claimed_at;
  IF last_sent IS NULL THEN
    SELECT max(e.at) INTO last_sent FROM ledger_events e
     WHERE e.run_id = o.run_id AND e.operation_id = p_operation_id AND e.to_status = 'dispatching';
  END IF;
  IF COALESCE(last_sent, o.first_dispatched_at, o.updated_at)
       + (p_settle_ms * interval '1 millisecond') > clock_timestamp() THEN
    outcome := 'settling';
    RETURN;
  END IF;
  IF o.reconcile_attempts >= p_max_attempts THEN
    outcome := 'budget_spent';
    RETURN;
  END IF;
  INSERT INTO operation_evidence (operation_id, kind, source, outcome, body)
  VALUES (p_operation_id, 'query_result', p_owner, 'not_sent',
          COALESCE(p_evidence, '{}'::jsonb) || jsonb_build_object('last_sent', last_sent))
  RETURNING evidence_id INTO ev;
  UPDATE tool_operations
     SET status = 'prepared', reconcile_owner = NULL, reconcile_until = NULL,
         reconcile_attempts = reconcile_attempts + 1, not_before = NULL,
         revision = tool_operations.revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id
  RETURNING tool_operations.revision INTO revision;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'unknown', 'prepared', 'reconciler', p_owner,
          revision, jsonb_build_object('evidence_id', ev, 'resend', true, 'not_found', true));
  outcome := 'resent';
END
$$;

-- An operator asks the reconciler to try an unknown operation again: its
-- same-key retry budget starts over and any reconcile claim is dropped, so
-- the next pass takes it. Who and why go to the history. Only from unknown.
-- outcome: reset | not_unknown | not_found.
CREATE OR REPLACE FUNCTION operation_reconcile_reset(p_operation_id text, p_actor text, p_note text)
RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  IF p_actor IS NULL OR p_actor = '' THEN
    RAISE EXCEPTION 'a retry needs an actor' USING ERRCODE = '22023';
  END IF;
  IF p_note IS NULL OR btrim(p_note) = '' THEN
    RAISE EXCEPTION 'a retry needs a note' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', NULL, p_operation_id, NULL);
  END IF;
  IF o.status <> 'unknown' THEN
    RETURN _op_result('not_unknown', o.run_id, p_operation_id, NULL);
  END IF;
  UPDATE tool_operations
     SET reconcile_attempts = 0, reconcile_owner = NULL, reconcile_until = NULL,
         revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'unknown', 'unknown', 'operator', p_actor,
          o.revision + 1,
          jsonb_build_object('retry_budget_reset', true, 'note', p_note,
                             'previous_attempts', o.reconcile_attempts));
  RETURN _op_result('reset', o.run_id, p_operation_id, NULL);
END
$$;

REVOKE EXECUTE ON FUNCTION
  _op_upsert(uuid, operation_intent, text, bigint),
  _op_claim(text, text, bigint),
  _op_claim_facts(tool_operations),
  operation_register(uuid, text, bigint, bytea, operation_intent[], bigint, jsonb),
  operation_register_claim(uuid, text, bigint, bytea, operation_intent, text, bigint, text),
  operation_register_claim_batch(uuid[], text[], bigint[], bytea[], operation_intent[], text[], bigint[], text[]),
  operation_claim(text, bigint, integer, text[], text[]),
  operation_wake_prepared(text, text[]),
  operation_settle(text, text, bigint, text, text, text, jsonb),
  operation_settle_batch(text[], text[], bigint[], text[], text[], text[], jsonb[]),
  operation_mark_unknown(text, text, bigint, boolean, text, text, jsonb),
  operation_release_unsent(text, text, bigint, jsonb),
  operation_note_round(text, text, bigint, jsonb),
  operation_follow_task(text, text, bigint, jsonb, bigint),
  _op_converge(text, bigint, text, text, jsonb, text, text, text, jsonb),
  operation_converge(text, bigint, text, text, jsonb, text, text, text, jsonb),
  operation_resolve(text, bigint, text, text, jsonb, text, text, jsonb),
  operation_supersede(uuid, text, bigint, bytea, text, operation_intent),
  operation_reconcile_claim(text, bigint, integer, text[]),
  operation_reconcile_attempt(text, text, bigint, bigint, integer),
  operation_reconcile_refund(text, text, bigint),
  operation_reconcile_release(text, text, bigint),
  operation_reconcile_resend(text, text, bigint, bigint, integer, jsonb),
  operation_reconcile_reset(text, text, text)
FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE operation_settle_acknowledged FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE operation_settle_acknowledged TO leasegate_app;
REVOKE EXECUTE ON PROCEDURE operation_settle_acknowledged_batch FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE operation_settle_acknowledged_batch TO leasegate_app;
GRANT EXECUTE ON FUNCTION
  operation_register(uuid, text, bigint, bytea, operation_intent[], bigint, jsonb),
  operation_register_claim(uuid, text, bigint, bytea, operation_intent, text, bigint, text),
  operation_register_claim_batch(uuid[], text[], bigint[], bytea[], operation_intent[], text[], bigint[], text[]),
  operation_claim(text, bigint, integer, text[], text[]),
  operation_wake_prepared(text, text[]),
  operation_settle(text, text, bigint, text, text, text, jsonb),
  operation_settle_batch(text[], text[], bigint[], text[], text[], text[], jsonb[]),
  operation_mark_unknown(text, text, bigint, boolean, text, text, jsonb),
  operation_release_unsent(text, text, bigint, jsonb),
  operation_note_round(text, text, bigint, jsonb),
  operation_follow_task(text, text, bigint, jsonb, bigint),
  operation_converge(text, bigint, text, text, jsonb, text, text, text, jsonb),
  operation_supersede(uuid, text, bigint, bytea, text, operation_intent),
  operation_reconcile_claim(text, bigint, integer, text[]),
  operation_reconcile_attempt(text, text, bigint, bigint, integer),
  operation_reconcile_refund(text, text, bigint),
  operation_reconcile_release(text, text, bigint),
  operation_reconcile_resend(text, text, bigint, bigint, integer, jsonb)
TO leasegate_app;
-- Operator acts (migrations/0007): a resolution and a retry-budget reset
-- are leasegate_operator's. Revoked from the app role explicitly, since a
-- database migrated before kept that grant across CREATE OR REPLACE.
REVOKE EXECUTE ON FUNCTION
  operation_resolve(text, bigint, text, text, jsonb, text, text, jsonb),
  operation_reconcile_reset(text, text, text)
FROM leasegate_app;
GRANT EXECUTE ON FUNCTION
  operation_resolve(text, bigint, text, text, jsonb, text, text, jsonb),
  operation_reconcile_reset(text, text, text)
TO leasegate_operator;
