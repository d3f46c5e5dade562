-- Least privilege for operator actions (issue 13, item 7).
--
-- The operator's acts — resolving an unknown operation, starting its retry
-- budget over, cancelling a run, resolving a lossy failover — are SQL
-- functions that only leasegate_operator may execute (their grants live
-- beside them in sql/operation.sql, sql/run.sql, sql/durability.sql), so a
-- compromised proxy, whose sessions run as leasegate_app, cannot settle an
-- operation by decree or lift a failover hold. What an operator acts on it
-- must be able to read: the ledger's tables, read-only, like the app role.
-- Writes still go through the functions alone (no INSERT/UPDATE/DELETE
-- grant on any table, for either role).
--
-- Roles after this migration (README, "Database roles"):
--   leasegate_app       the proxy: every public function but the operator
--                       ones; SELECT on the ledger tables; access_token_verify.
--   leasegate_operator  operator acts (above), token management, re-sealing
--                       bodies; SELECT on the ledger tables and access_tokens.
--   the migrating owner owns tables and functions (migrate only).

GRANT SELECT ON agent_tasks, agent_runs, worker_leases, tool_operations, ledger_events,
                operation_evidence, ledger_failovers, leasegate_processes
   TO leasegate_operator;

-- Evidence stays append-only, with one exception for `leasegate secrets
-- rotate` (issue 13): evidence_reseal (sql/secrets.sql, operator only) may
-- replace a row's body with the same values sealed under the current key.
-- The exception holds only inside that function (it sets
-- leasegate.resealing for its own transaction) and only for the body:
-- every other column, DELETE and TRUNCATE stay refused. Only the owner can
-- UPDATE the table at all (neither role has the privilege).
CREATE FUNCTION operation_evidence_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE'
     AND current_setting('leasegate.resealing', true) = 'on'
     AND (NEW.evidence_id, NEW.operation_id, NEW.at, NEW.kind, NEW.source, NEW.claim_owner,
          NEW.claim_revision, NEW.outcome, NEW.remote_id)
         IS NOT DISTINCT FROM
         (OLD.evidence_id, OLD.operation_id, OLD.at, OLD.kind, OLD.source, OLD.claim_owner,
          OLD.claim_revision, OLD.outcome, OLD.remote_id) THEN
    RETURN NEW;
  END IF;
  RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
$$;
REVOKE EXECUTE ON FUNCTION operation_evidence_refuse_change() FROM PUBLIC;
DROP TRIGGER operation_evidence_append_only ON operation_evidence;
CREATE TRIGGER operation_evidence_append_only BEFORE UPDATE OR DELETE ON operation_evidence
  FOR EACH ROW EXECUTE FUNCTION operation_evidence_refuse_change();
