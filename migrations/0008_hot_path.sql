-- The hot path's indexes (issue 14): a status change of an operation is not
-- a HOT update (status is indexed), so every index of tool_operations gets
-- a new entry on every register, claim and settle. Two of them did work no
-- query needed:
--
-- * tool_operations_reconcile_idx (status, dispatch_until, updated_at)
--   indexed every operation, settled ones included, for the two scans that
--   only look at live ones: claim expiry (status 'dispatching', by
--   dispatch_until) and the reconciler (status 'unknown', by updated_at).
--   Partial indexes serve both and hold only live rows, so a settled
--   operation leaves them (and a settle adds no entry to them), and their
--   size follows the work in flight, not the ledger's age.
-- * tool_operations_run_status_idx (run_id, status): a run's operations are
--   found through the unique (run_id, step_id, effect_version) index's
--   prefix; the status filter is a handful of rows per run.
--
-- Per gated call (insert as dispatching, then settle): 5 index entries
-- instead of 8. Crash: one transaction, as every migration.
DROP INDEX tool_operations_reconcile_idx;
DROP INDEX tool_operations_run_status_idx;
CREATE INDEX tool_operations_dispatching_idx ON tool_operations (dispatch_until)
  WHERE status = 'dispatching';
CREATE INDEX tool_operations_unknown_idx ON tool_operations (updated_at)
  WHERE status = 'unknown';
