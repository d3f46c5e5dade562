-- leasegate operations ledger: side-effect intents, claims, settlement,
-- unknown outcomes and their evidence (seed sections 8 and 9).
--
-- State model of an operation (seed 9.3):
--
--   (new) ──register──▶ prepared ──claim──▶ dispatching ──settle──▶ succeeded | failed_final
--                          ▲                    │
--                          └── release_unsent ──┤ (proof that no byte left)
--                          │                    │
--                          │ run cancelled /    │ claim expired / holder gave up
--                          │ plan superseded    ▼
--                          ▼                 unknown ──converge (evidence)──▶ succeeded | failed_final
--                      cancelled
--
-- dispatching goes back to prepared only with proof that no byte of the
-- request left (release_unsent, kept as not_sent evidence); cancelling a run leaves
-- dispatching and unknown operations as they are (the side effect may have
-- happened). Every change appends a ledger_events row; every answer that
-- does not match a live claim is kept in operation_evidence.
--
-- The functions (sql/operation.sql) follow 0001's conventions: one function
-- = one short transaction, lock order lease row -> run row -> operation
-- rows, database clock, SECURITY DEFINER, typed outcomes instead of
-- exceptions.

ALTER TABLE tool_operations
  ADD COLUMN created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- How many times a claim was handed out (inline or by a dispatcher).
  ADD COLUMN dispatch_count integer NOT NULL DEFAULT 0 CHECK (dispatch_count >= 0),
  -- Set when a changed plan replaced this intent (it is then 'cancelled').
  ADD COLUMN superseded_by  text REFERENCES tool_operations (operation_id),
  -- The reconciler's claim on an unknown operation (one reconciler at a
  -- time per operation, no leader): it never changes the status, it bumps
  -- the revision so a converge prepared under an older read fails.
  ADD COLUMN reconcile_owner    text,
  ADD COLUMN reconcile_until    timestamptz,
  -- Retries with the same key (idempotency_key tools) done by reconcilers.
  ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0 CHECK (reconcile_attempts >= 0),
  -- First dispatch time, for key-retention windows.
  ADD COLUMN first_dispatched_at timestamptz,
  -- Where the call goes, beside the exposed (namespaced) tool_name, so that
  -- renaming the namespace cannot orphan planned or unknown operations.
  -- NULL when the registrar did not know it (intents planned through the
  -- control API): resolved by tool_name when sent.
  -- The outbox leaves a prepared operation alone until then: set when a
  -- send was proven not to have left (backoff while the upstream is down).
  ADD COLUMN not_before     timestamptz,
  ADD COLUMN upstream       text,
  ADD COLUMN upstream_tool  text,
  ADD CONSTRAINT tool_operations_route_whole CHECK ((upstream IS NULL) = (upstream_tool IS NULL)),
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

CREATE TRIGGER operation_evidence_append_only BEFORE UPDATE OR DELETE ON operation_evidence
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();
CREATE TRIGGER operation_evidence_no_truncate BEFORE TRUNCATE ON operation_evidence
  FOR EACH STATEMENT EXECUTE FUNCTION ledger_events_refuse_change();

-- An intent as the operation functions take it (register, register_claim,
-- supersede): typed fields instead of a JSON bag.
CREATE TYPE operation_intent AS (
  operation_id   text,
  step_id        text,
  effect_version integer,
  tool_name      text,
  request_digest text,
  request_body   jsonb,
  upstream       text,
  upstream_tool  text
);

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
  evidence_id      bigint,
  upstream         text,
  upstream_tool    text
);


REVOKE ALL ON operation_evidence FROM PUBLIC;
GRANT SELECT ON operation_evidence TO leasegate_app;

