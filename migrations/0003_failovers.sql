-- leasegate durability: the failovers a leasegate process detected (seed
-- section 10, "WAL ≠ token never rolls back").
--
-- A process keeps in memory the highest WAL position it saw acknowledged on
-- the ledger's server (system identifier, timeline, LSN). When the same
-- system comes back on a higher timeline whose switch point lies below that
-- high-water, acknowledged writes in (switch_lsn, acknowledged_lsn] may be
-- lost: the process records a row here and every process holds dispatch
-- while a row is unresolved, until an operator resolves it
-- (failover_resolve in sql/durability.sql). A failover with nothing
-- acknowledged beyond the switch point is recorded already resolved.
-- Functions in sql/durability.sql.

CREATE TABLE ledger_failovers (
  failover_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  detected_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- The leasegate process (its claim owner name) that saw it.
  detected_by       text NOT NULL CHECK (detected_by <> '' AND length(detected_by) <= 200),
  -- pg_control_system().system_identifier, as text (an unsigned 64-bit value).
  system_identifier text NOT NULL,
  -- The system identifier the process saw before, when it changed (a
  -- different cluster, such as a restore from a logical dump).
  old_system_identifier text,
  old_timeline      bigint NOT NULL,
  new_timeline      bigint NOT NULL,
  -- Where the old timeline ended on the new primary (its history file);
  -- NULL when it could not be read: then the loss is not bounded.
  switch_lsn        pg_lsn,
  -- The highest position the detecting process saw acknowledged.
  acknowledged_lsn  pg_lsn NOT NULL,
  -- Acknowledged writes may be lost: switch_lsn unknown or below acknowledged_lsn.
  lossy             boolean NOT NULL,
  resolved_at       timestamptz,
  resolved_by       text,
  resolved_reason   text,
  CONSTRAINT ledger_failovers_resolution_whole
    CHECK ((resolved_at IS NULL) = (resolved_by IS NULL) AND (resolved_at IS NULL) = (resolved_reason IS NULL)),
  CONSTRAINT ledger_failovers_once_per_process UNIQUE (system_identifier, new_timeline, detected_by)
);
CREATE INDEX ledger_failovers_unresolved_idx ON ledger_failovers (failover_id) WHERE resolved_at IS NULL;

REVOKE ALL ON ledger_failovers FROM PUBLIC;
GRANT SELECT ON ledger_failovers TO leasegate_app;
