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
