-- leasegate operations ledger: side-effect intents, claims, settlement,
-- unknown outcomes and their evidence (seed sections 8 and 9).
--
-- State model of an operation (seed 9.3):
--
--   (new) ──register──▶ prepared ──claim──▶ dispatching ──settle──▶ succeeded | failed_final
--                          │                    │
--                          │ run cancelled /    │ claim expired / holder gave up
--                          │ plan superseded    ▼
--                          ▼                 unknown ──converge (evidence)──▶ succeeded | failed_final
--                      cancelled
--
-- dispatching never goes back to prepared; cancelling a run leaves
-- dispatching and unknown operations as they are (the side effect may have
-- happened). Every change appends a ledger_events row; every answer that
-- does not match a live claim is kept in operation_evidence.
--
-- Conventions are those of 0001: one function = one short transaction,
-- lock order lease row -> run row -> operation rows, database clock,
-- SECURITY DEFINER, typed outcomes instead of exceptions.

ALTER TABLE tool_operations
  ADD COLUMN created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- How many times a claim was handed out (inline or by a dispatcher).
  ADD COLUMN dispatch_count integer NOT NULL DEFAULT 0 CHECK (dispatch_count >= 0),
  -- Set when a changed plan replaced this intent (it is then 'cancelled').
  ADD COLUMN superseded_by  text REFERENCES tool_operations (operation_id),
  ADD CONSTRAINT tool_operations_operation_id_shape CHECK (operation_id <> '' AND length(operation_id) <= 255),
  ADD CONSTRAINT tool_operations_step_id_shape CHECK (step_id <> '' AND length(step_id) <= 512),
  ADD CONSTRAINT tool_operations_digest_shape CHECK (request_digest ~ '^[0-9a-f]{64}$');

CREATE INDEX tool_operations_run_status_idx ON tool_operations (run_id, status);
CREATE INDEX tool_operations_prepared_idx ON tool_operations (updated_at) WHERE status = 'prepared';

-- What leasegate learned about an operation outside a successful settle:
-- late responses, send errors, timeouts, query results, same-key retries,
-- operator resolutions. Append-only.
CREATE TABLE operation_evidence (
  evidence_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  operation_id   text NOT NULL REFERENCES tool_operations (operation_id),
  at             timestamptz NOT NULL DEFAULT clock_timestamp(),
  kind           text NOT NULL CHECK (kind IN ('late_response', 'not_sent', 'send_error', 'timeout',
                                               'query_result', 'retry_result', 'operator')),
  -- Who brought it: dispatch owner, reconciler, operator.
  source         text NOT NULL,
  -- The claim the evidence belongs to, when it came from a dispatch.
  claim_owner    text,
  claim_revision bigint,
  -- What the evidence says happened remotely.
  outcome        text CHECK (outcome IN ('succeeded', 'failed_final', 'unknown', 'not_sent')),
  remote_id      text,
  body           jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX operation_evidence_operation_idx ON operation_evidence (operation_id, evidence_id);

CREATE OR REPLACE FUNCTION ledger_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER operation_evidence_append_only BEFORE UPDATE OR DELETE ON operation_evidence
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();
CREATE TRIGGER operation_evidence_no_truncate BEFORE TRUNCATE ON operation_evidence
  FOR EACH STATEMENT EXECUTE FUNCTION ledger_events_refuse_change();

-- What every operation function returns: the verdict, the run and lease (to
-- name expected vs found on fence rejections) and the operation as it is
-- after the call (or as found).
--   outcome: registered | exists | claimed | settled | marked_unknown |
--            converged | superseded | intent_conflict | stale_claim |
--            digest_mismatch | claim_live | not_unknown | not_changeable |
--            conflict | wrong_status | lease_lost | terminal | not_found
CREATE TYPE operation_result AS (
  outcome          text,
  run_status       text,
  run_revision     bigint,
  lease_owner      text,
  lease_epoch      bigint,
  lease_expires_at timestamptz,
  db_now           timestamptz,
  operation_id     text,
  run_id           uuid,
  step_id          text,
  effect_version   integer,
  tool_name        text,
  request_digest   text,
  status           text,
  revision         bigint,
  dispatch_owner   text,
  dispatch_until   timestamptz,
  dispatch_count   integer,
  remote_id        text,
  result           jsonb,
  evidence_id      bigint
);

-- ---------------------------------------------------------------------------
-- Private helpers
-- ---------------------------------------------------------------------------

CREATE FUNCTION _op_result(p_outcome text, p_run_id uuid, p_operation_id text, p_evidence_id bigint)
RETURNS operation_result
LANGUAGE sql VOLATILE SET search_path = public, pg_temp AS $$
  SELECT p_outcome, r.status, r.revision, l.owner, l.epoch, l.expires_at, clock_timestamp(),
         o.operation_id, COALESCE(o.run_id, p_run_id), o.step_id, o.effect_version, o.tool_name,
         o.request_digest, o.status, o.revision, o.dispatch_owner, o.dispatch_until,
         o.dispatch_count, o.remote_id, o.result, p_evidence_id
  FROM (SELECT 1) AS one
  LEFT JOIN tool_operations o ON o.operation_id = p_operation_id
  LEFT JOIN agent_runs r ON r.run_id = COALESCE(o.run_id, p_run_id)
  LEFT JOIN worker_leases l ON l.run_id = COALESCE(o.run_id, p_run_id)
$$;

-- The intent fence: the lease row is locked FOR SHARE, not FOR UPDATE. A
-- takeover (which updates the row) still waits for this transaction, so
-- invariant 1 holds, while parallel tool calls of one run do not queue
-- behind each other. Every status change of a run holds the lease row FOR
-- UPDATE, so the run status read here is stable until commit.
-- Returns: valid | not_found | lease_lost | terminal.
CREATE FUNCTION _lease_fence_shared(p_run_id uuid, p_owner text, p_epoch bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  s text;
BEGIN
  SELECT * INTO l FROM worker_leases WHERE run_id = p_run_id FOR SHARE;
  IF NOT FOUND THEN
    RETURN 'not_found';
  END IF;
  IF l.owner IS DISTINCT FROM p_owner
     OR l.epoch IS DISTINCT FROM p_epoch
     OR l.expires_at <= clock_timestamp() THEN
    RETURN 'lease_lost';
  END IF;
  SELECT status INTO s FROM agent_runs WHERE run_id = p_run_id;
  IF s IN ('succeeded', 'failed', 'cancelled') THEN
    RETURN 'terminal';
  END IF;
  RETURN 'valid';
END
$$;

-- Registers one intent of run p_run_id, or finds it. The operation row is
-- left locked FOR UPDATE for the caller. On an existing operation_id, or an
-- existing (run, step, effect_version), run_id, step, tool and digest must
-- all match: otherwise 'intent_conflict' and nothing is written. This
-- comparison is on every path, including the concurrent-insert one.
-- Returns (outcome: registered | exists | intent_conflict, operation_id of
-- the row to report).
CREATE FUNCTION _op_upsert(p_run_id uuid, p_intent jsonb, p_owner text, p_epoch bigint,
                           OUT outcome text, OUT found_id text)
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  v_id      text    := p_intent->>'operation_id';
  v_step    text    := p_intent->>'step_id';
  v_version integer := (p_intent->>'effect_version')::integer;
  v_tool    text    := p_intent->>'tool_name';
  v_digest  text    := p_intent->>'request_digest';
  v_body    jsonb   := COALESCE(p_intent->'request_body', 'null'::jsonb);
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
      IF o.operation_id = v_id AND o.run_id = p_run_id AND o.step_id = v_step
         AND o.effect_version = v_version AND o.tool_name = v_tool AND o.request_digest = v_digest THEN
        outcome := 'exists';
      ELSE
        outcome := 'intent_conflict';
      END IF;
      RETURN;
    END IF;
    INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                 request_digest, request_body, status)
    VALUES (v_id, p_run_id, v_step, v_version, v_tool, v_digest, v_body, 'prepared')
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

-- Claims a prepared operation (already locked by the caller).
CREATE FUNCTION _op_claim(p_operation_id text, p_dispatch_owner text, p_claim_ttl_ms bigint,
                          p_actor_kind text, p_epoch bigint, p_detail jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  UPDATE tool_operations
     SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
         dispatch_until = clock_timestamp() + (p_claim_ttl_ms * interval '1 millisecond'),
         dispatch_count = dispatch_count + 1, revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id AND status = 'prepared'
  RETURNING * INTO o;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, epoch, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'prepared', 'dispatching', p_actor_kind,
          p_dispatch_owner, p_epoch, o.revision,
          p_detail || jsonb_build_object('dispatch_until', o.dispatch_until));
END
$$;

CREATE FUNCTION _check_claim_args(p_dispatch_owner text, p_claim_ttl_ms bigint) RETURNS void
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

-- ---------------------------------------------------------------------------
-- Protected transitions
-- ---------------------------------------------------------------------------

-- "Step planned" (seed 9.1): registers intents (prepared) under the current
-- lease, optionally together with a checkpoint CAS, all or nothing. One row
-- per intent comes back (registered | exists). On any conflict nothing is
-- written and the conflicting intents come back as 'intent_conflict' rows
-- (the existing operation's fields). A fence or CAS rejection is one row
-- with that outcome.
CREATE FUNCTION operation_register(
  p_run_id uuid, p_owner text, p_epoch bigint, p_intents jsonb,
  p_expected_revision bigint, p_checkpoint jsonb
) RETURNS SETOF operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict      text;
  found_status text;
  intent       jsonb;
  v_outcome    text;
  v_found      text;
  registered   text[] := '{}';
  outcomes     text[] := '{}';
  conflicts    text[] := '{}';
BEGIN
  IF p_intents IS NULL OR jsonb_typeof(p_intents) <> 'array' OR jsonb_array_length(p_intents) = 0 THEN
    RAISE EXCEPTION 'intents must be a non-empty array' USING ERRCODE = '22023';
  END IF;
  IF p_checkpoint IS NOT NULL OR p_expected_revision IS NOT NULL THEN
    verdict := _lease_fence(p_run_id, p_owner, p_epoch);
  ELSE
    verdict := _lease_fence_shared(p_run_id, p_owner, p_epoch);
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
    FOR intent IN SELECT * FROM jsonb_array_elements(p_intents) LOOP
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

-- The proxy's hot path: validate the lease, register or find the intent,
-- and claim it, in one transaction. 'claimed' means the caller now holds a
-- claim (dispatch_owner, revision, dispatch_until) and may send; 'exists'
-- returns the operation as it is (settled, in flight under another claim,
-- unknown, cancelled) and the caller must not send.
CREATE FUNCTION operation_register_claim(
  p_run_id uuid, p_owner text, p_epoch bigint, p_intent jsonb,
  p_dispatch_owner text, p_claim_ttl_ms bigint
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict   text;
  v_outcome text;
  v_found   text;
  v_status  text;
BEGIN
  PERFORM _check_claim_args(p_dispatch_owner, p_claim_ttl_ms);
  verdict := _lease_fence_shared(p_run_id, p_owner, p_epoch);
  IF verdict <> 'valid' THEN
    RETURN _op_result(verdict, p_run_id, NULL, NULL);
  END IF;
  SELECT * INTO v_outcome, v_found FROM _op_upsert(p_run_id, p_intent, p_owner, p_epoch);
  IF v_outcome = 'intent_conflict' THEN
    RETURN _op_result('intent_conflict', p_run_id, v_found, NULL);
  END IF;
  SELECT status INTO v_status FROM tool_operations WHERE operation_id = v_found;
  IF v_status <> 'prepared' THEN
    RETURN _op_result('exists', p_run_id, v_found, NULL);
  END IF;
  PERFORM _op_claim(v_found, p_dispatch_owner, p_claim_ttl_ms, 'dispatcher', p_epoch,
                    jsonb_build_object('inline', true, 'worker', p_owner));
  RETURN _op_result('claimed', p_run_id, v_found, NULL);
END
$$;

-- The dispatcher's claim (seed 9.2): up to p_limit prepared operations of
-- live runs, oldest first, skipping rows another claimer holds. The
-- MATERIALIZED CTE fixes the candidate set before the UPDATE, so the planner
-- cannot update more rows than LIMIT claimed.
CREATE FUNCTION operation_claim(p_dispatch_owner text, p_claim_ttl_ms bigint, p_limit integer)
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
           updated_at = clock_timestamp()
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

-- Settle from a verified response (seed 9.3): only the live claim (same
-- dispatch owner and revision, same request digest) may settle. Anything
-- else is stored as evidence of kind 'late_response' and settles nothing:
-- 'stale_claim' (the operation moved on: unknown, re-claimed, settled,
-- cancelled) or 'digest_mismatch'.
CREATE FUNCTION operation_settle(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint,
  p_request_digest text, p_status text, p_remote_id text, p_result jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o  tool_operations;
  ev bigint;
BEGIN
  IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'settle status must be succeeded or failed_final, got %', p_status USING ERRCODE = '22023';
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN _op_result('not_found', NULL, p_operation_id, NULL);
  END IF;
  IF o.status = 'dispatching' AND o.dispatch_owner = p_dispatch_owner
     AND o.revision = p_expected_revision AND o.request_digest = p_request_digest THEN
    UPDATE tool_operations
       SET status = p_status, remote_id = p_remote_id, result = p_result, dispatch_until = NULL,
           revision = revision + 1, updated_at = clock_timestamp()
     WHERE operation_id = p_operation_id;
    INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                               actor, revision, detail)
    VALUES (o.run_id, o.operation_id, 'operation', 'dispatching', p_status, 'dispatcher',
            p_dispatch_owner, o.revision + 1, jsonb_build_object('remote_id', p_remote_id));
    RETURN _op_result('settled', o.run_id, p_operation_id, NULL);
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

-- dispatching -> unknown, guarded by the original dispatch owner and
-- revision (seed 9.2). The reconciler may do it only once the claim has
-- expired ('claim_live' otherwise); the claim holder itself may give up its
-- live claim at once (p_holder: its request timed out or broke after bytes
-- may have left). The evidence (error, timeout) is kept.
CREATE FUNCTION operation_mark_unknown(
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
  IF NOT p_holder AND o.dispatch_until > clock_timestamp() THEN
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
                             actor, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'dispatching', 'unknown',
          CASE WHEN p_holder THEN 'dispatcher' ELSE 'reconciler' END, p_actor, o.revision + 1,
          jsonb_build_object('evidence_id', ev, 'dispatch_owner', o.dispatch_owner,
                             'dispatch_until', o.dispatch_until, 'claim_expired', NOT p_holder));
  RETURN _op_result('marked_unknown', o.run_id, p_operation_id, ev);
END
$$;

-- unknown -> succeeded | failed_final from verified evidence: a query of
-- the remote by operation id, a same-key retry, or an operator's resolution
-- (which needs a note). The evidence is stored and cited by the event.
CREATE FUNCTION operation_converge(
  p_operation_id text, p_expected_revision bigint, p_status text, p_remote_id text,
  p_result jsonb, p_kind text, p_actor text, p_note text, p_evidence jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o  tool_operations;
  ev bigint;
BEGIN
  IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'converge status must be succeeded or failed_final, got %', p_status USING ERRCODE = '22023';
  END IF;
  IF p_kind IS NULL OR p_kind NOT IN ('query_result', 'retry_result', 'operator') THEN
    RAISE EXCEPTION 'converge evidence must be query_result, retry_result or operator, got %', p_kind
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
          COALESCE(p_evidence, '{}'::jsonb) || jsonb_build_object('note', p_note, 'result', p_result))
  RETURNING evidence_id INTO ev;
  UPDATE tool_operations
     SET status = p_status, remote_id = COALESCE(p_remote_id, remote_id),
         result = COALESCE(p_result, result), revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id = p_operation_id;
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, revision, detail)
  VALUES (o.run_id, o.operation_id, 'operation', 'unknown', p_status,
          CASE WHEN p_kind = 'operator' THEN 'operator' ELSE 'reconciler' END, p_actor, o.revision + 1,
          jsonb_build_object('evidence_id', ev, 'kind', p_kind, 'note', p_note, 'remote_id', p_remote_id));
  RETURN _op_result('converged', o.run_id, p_operation_id, ev);
END
$$;

-- Changes a planned intent (seed 9.3): the old prepared row becomes
-- cancelled with superseded_by set, a new row with a higher effect_version
-- of the same step is registered; both kept for audit. Only a prepared
-- intent can change: once claimed, the side effect may be under way
-- ('not_changeable').
CREATE FUNCTION operation_supersede(
  p_run_id uuid, p_owner text, p_epoch bigint, p_old_operation_id text, p_new_intent jsonb
) RETURNS operation_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  verdict   text;
  old       tool_operations;
  v_outcome text;
  v_found   text;
BEGIN
  verdict := _lease_fence_shared(p_run_id, p_owner, p_epoch);
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
  IF p_new_intent->>'step_id' IS DISTINCT FROM old.step_id
     OR (p_new_intent->>'effect_version')::integer <= old.effect_version THEN
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

-- Control-plane cancel, now also for the run's intents (seed 9.3, F):
-- prepared operations become cancelled in the same transaction and can no
-- longer be claimed; dispatching and unknown ones keep their status (their
-- side effect may have happened: query, compensate or resolve them).
CREATE OR REPLACE FUNCTION run_cancel(p_run_id uuid, p_actor text, p_reason text) RETURNS ledger_write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  l worker_leases;
  r agent_runs;
  n integer;
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
  WITH cancelled AS (
    UPDATE tool_operations
       SET status = 'cancelled', revision = revision + 1, updated_at = clock_timestamp()
     WHERE run_id = p_run_id AND status = 'prepared'
    RETURNING operation_id, revision
  )
  INSERT INTO ledger_events (run_id, operation_id, subject, from_status, to_status, actor_kind,
                             actor, revision, detail)
  SELECT p_run_id, c.operation_id, 'operation', 'prepared', 'cancelled', 'operator', p_actor,
         c.revision, jsonb_build_object('reason', p_reason, 'run_cancelled', true)
    FROM cancelled c;
  GET DIAGNOSTICS n = ROW_COUNT;
  INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, revision, detail)
  VALUES (p_run_id, 'run', r.status, 'cancelled', 'operator', p_actor, r.revision + 1,
          jsonb_build_object('reason', p_reason, 'lease_owner', l.owner, 'lease_epoch', l.epoch,
                             'prepared_operations_cancelled', n));
  RETURN _ledger_result('applied', p_run_id);
END
$$;

-- ---------------------------------------------------------------------------
-- Permissions
-- ---------------------------------------------------------------------------

REVOKE ALL ON operation_evidence FROM PUBLIC;
GRANT SELECT ON operation_evidence TO leasegate_app;

REVOKE EXECUTE ON FUNCTION
  _op_result(text, uuid, text, bigint),
  _lease_fence_shared(uuid, text, bigint),
  _op_upsert(uuid, jsonb, text, bigint),
  _op_claim(text, text, bigint, text, bigint, jsonb),
  _check_claim_args(text, bigint),
  operation_register(uuid, text, bigint, jsonb, bigint, jsonb),
  operation_register_claim(uuid, text, bigint, jsonb, text, bigint),
  operation_claim(text, bigint, integer),
  operation_settle(text, text, bigint, text, text, text, jsonb),
  operation_mark_unknown(text, text, bigint, boolean, text, text, jsonb),
  operation_converge(text, bigint, text, text, jsonb, text, text, text, jsonb),
  operation_supersede(uuid, text, bigint, text, jsonb),
  run_cancel(uuid, text, text)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
  operation_register(uuid, text, bigint, jsonb, bigint, jsonb),
  operation_register_claim(uuid, text, bigint, jsonb, text, bigint),
  operation_claim(text, bigint, integer),
  operation_settle(text, text, bigint, text, text, text, jsonb),
  operation_mark_unknown(text, text, bigint, boolean, text, text, jsonb),
  operation_converge(text, bigint, text, text, jsonb, text, text, text, jsonb),
  operation_supersede(uuid, text, bigint, text, jsonb),
  run_cancel(uuid, text, text)
TO leasegate_app;
