-- Flat cost at scale and retention (issue 14, P5).
--
-- 1. The background scans read only live rows: migration 0008 replaced the
--    full index tool_operations_reconcile_idx with partial indexes over
--    'dispatching' (claim expiry) and 'unknown' (the reconciler and the
--    unknown listing); the outbox has its partial index on 'prepared'
--    (0002). Their cost follows the number of live operations, not the
--    size of the table.
-- 2. Retention: settled history of terminal runs older than a window moves
--    to archive tables (or is deleted) in bounded batches
--    (sql/retention.sql, operations_archive; `leasegate ops archive`). Each
--    archived row is kept whole as jsonb (`row`), so a column added to the
--    live table later needs no change here; readers rebuild it with
--    jsonb_populate_record. The fate query (Ledger::operation_get) reads the
--    archive when the live table has no such operation and marks it
--    archived. agent_runs keeps every run (small, and the task/run history
--    stays answerable); archived_at marks the runs whose history moved.
-- 3. The append-only triggers refuse DELETE unless the transaction set
--    leasegate.archiving = 'on' — only operations_archive does, and only the
--    owner role may DELETE at all (the application role may not). UPDATE
--    and TRUNCATE stay refused.
--
-- Creating these indexes (not CONCURRENTLY: migrations run in a
-- transaction) holds a write lock on tool_operations while it runs: on a
-- large ledger apply this migration in a quiet moment.

-- Lease renewals (single and batched, sql/lease.sql) change only
-- expires_at and updated_at, which no index holds: with room left on each
-- page they are HOT updates (no index entry written). Applies to pages
-- written from now on.
ALTER TABLE worker_leases SET (fillfactor = 70);

ALTER TABLE agent_runs ADD COLUMN archived_at timestamptz;
-- The archive's candidates: terminal runs not archived yet, oldest first.
CREATE INDEX agent_runs_archivable_idx ON agent_runs (updated_at)
  WHERE status IN ('succeeded', 'failed', 'cancelled') AND archived_at IS NULL;

CREATE TABLE tool_operations_archive (
  operation_id text PRIMARY KEY,
  run_id       uuid NOT NULL REFERENCES agent_runs (run_id),
  status       text NOT NULL,
  archived_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- The whole tool_operations row as it was (to_jsonb).
  row          jsonb NOT NULL
);
CREATE INDEX tool_operations_archive_run_idx ON tool_operations_archive (run_id);

CREATE TABLE operation_evidence_archive (
  evidence_id  bigint PRIMARY KEY,
  operation_id text NOT NULL,
  archived_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  row          jsonb NOT NULL
);
CREATE INDEX operation_evidence_archive_operation_idx
  ON operation_evidence_archive (operation_id, evidence_id);

CREATE TABLE ledger_events_archive (
  event_id     bigint PRIMARY KEY,
  run_id       uuid NOT NULL,
  operation_id text,
  archived_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  row          jsonb NOT NULL
);
CREATE INDEX ledger_events_archive_run_idx ON ledger_events_archive (run_id, event_id);
CREATE INDEX ledger_events_archive_operation_idx ON ledger_events_archive (operation_id, event_id)
  WHERE operation_id IS NOT NULL;

-- The archives are append-only too (nothing moves back).
CREATE TRIGGER tool_operations_archive_append_only BEFORE UPDATE OR DELETE ON tool_operations_archive
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();
CREATE TRIGGER operation_evidence_archive_append_only BEFORE UPDATE OR DELETE ON operation_evidence_archive
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();
CREATE TRIGGER ledger_events_archive_append_only BEFORE UPDATE OR DELETE ON ledger_events_archive
  FOR EACH ROW EXECUTE FUNCTION ledger_events_refuse_change();

CREATE OR REPLACE FUNCTION ledger_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW'
     AND TG_TABLE_NAME IN ('ledger_events', 'operation_evidence')
     AND current_setting('leasegate.archiving', true) = 'on' THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
$$;
REVOKE EXECUTE ON FUNCTION ledger_events_refuse_change() FROM PUBLIC;

-- operation_evidence's row trigger is operation_evidence_refuse_change since
-- 0007 (the body may be re-sealed in place by evidence_reseal): it lets the
-- archive's DELETE through too, on the same setting, and nothing else.
CREATE OR REPLACE FUNCTION operation_evidence_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW'
     AND current_setting('leasegate.archiving', true) = 'on' THEN
    RETURN OLD;
  END IF;
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

GRANT SELECT ON tool_operations_archive, operation_evidence_archive, ledger_events_archive
  TO leasegate_app, leasegate_operator;
