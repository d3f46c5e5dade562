-- Column rules of tool_operations and ledger_events as domain types
-- (issue 14, P1 and P6).
--
-- A table CHECK constraint is evaluated for every row an INSERT or UPDATE
-- writes, whichever columns the statement changed, and each statement
-- execution first rebuilds every CHECK expression of the table from its
-- stored text (ExecRelCheck: stringToNode, then expression setup). A
-- gated call runs one INSERT and one settle UPDATE of tool_operations,
-- and two INSERTs of ledger_events, so every rule of those tables was
-- parsed and checked four times per call, most of them on columns the
-- statement never touched (a settle sets status, result and revision; it
-- re-checked the digest's regular expression, the step id's length, the
-- effect version...). Profiled on the gateway benchmark: ExecConstraints
-- was 13 % of a backend's time on a gated call, stringToNode almost half
-- of it.
--
-- A domain's rule is checked when a value is converted to the domain,
-- that is, when a statement writes that column, and its expression is
-- kept ready in the backend's type cache. So the rules below say exactly
-- what the table CHECKs said, for every value ever written, and cost
-- nothing on the columns a statement leaves alone.
--
-- Kept as table CHECKs:
-- * tool_operations.status: its column is in the predicates of the
--   partial indexes the background scans read (0008, 0009); changing the
--   column's type would rebuild them, one full scan of the table each
--   under this migration's ACCESS EXCLUSIVE lock. Every settle changes
--   status anyway, so a domain would save only the rule's parsing.
-- * tool_operations.operation_id: the primary key, referenced by foreign
--   keys (superseded_by, operation_evidence); changing its type would
--   re-validate those keys (a scan of each referencing table).
-- * tool_operations_route_whole: a rule over two columns.
--
-- No table is rewritten or scanned: a domain over text (or integer)
-- without a rule is binary-compatible with its base type, so the ALTER
-- COLUMN ... TYPE below only changes the catalog, and the unique index
-- on (run_id, step_id, effect_version) keeps its storage (same operator
-- classes). The rules are then added to the domains NOT VALID: every
-- existing value already satisfied the identical table CHECK dropped in
-- the same transaction (those were validated), and ALTER DOMAIN ...
-- VALIDATE CONSTRAINT would scan both tables, the largest of the ledger,
-- under the lock the ALTER TABLE holds until commit, for nothing. New
-- values are checked either way. The statement takes an ACCESS EXCLUSIVE
-- lock on both tables for the moment of the catalog change.
--
-- What a client sees: a value that breaks a rule fails with the same
-- SQLSTATE as before (23514, check_violation); the message names the
-- domain ("value for domain ledger_request_digest violates check
-- constraint ...") instead of the table's constraint. Reading the
-- columns gives the same text and integers (the wire reports the
-- domain's type; sqlx matches a domain by its base type).
CREATE DOMAIN ledger_step_id AS text;
CREATE DOMAIN ledger_effect_version AS integer;
CREATE DOMAIN ledger_request_digest AS text;
CREATE DOMAIN ledger_count AS integer;
CREATE DOMAIN ledger_event_subject AS text;
CREATE DOMAIN ledger_actor_kind AS text;

ALTER TABLE tool_operations
  ALTER COLUMN step_id TYPE ledger_step_id,
  ALTER COLUMN effect_version TYPE ledger_effect_version,
  ALTER COLUMN request_digest TYPE ledger_request_digest,
  ALTER COLUMN dispatch_count TYPE ledger_count,
  ALTER COLUMN reconcile_attempts TYPE ledger_count,
  DROP CONSTRAINT tool_operations_step_id_shape,
  DROP CONSTRAINT tool_operations_effect_version_check,
  DROP CONSTRAINT tool_operations_digest_shape,
  DROP CONSTRAINT tool_operations_dispatch_count_check,
  DROP CONSTRAINT tool_operations_reconcile_attempts_check;

ALTER TABLE ledger_events
  ALTER COLUMN subject TYPE ledger_event_subject,
  ALTER COLUMN actor_kind TYPE ledger_actor_kind,
  DROP CONSTRAINT ledger_events_subject_check,
  DROP CONSTRAINT ledger_events_actor_kind_check;

-- The same rules, word for word (0001, 0002).
ALTER DOMAIN ledger_step_id
  ADD CONSTRAINT ledger_step_id_shape CHECK (VALUE <> '' AND length(VALUE) <= 512) NOT VALID;
ALTER DOMAIN ledger_effect_version
  ADD CONSTRAINT ledger_effect_version_positive CHECK (VALUE > 0) NOT VALID;
ALTER DOMAIN ledger_request_digest
  ADD CONSTRAINT ledger_request_digest_shape CHECK (VALUE ~ '^[0-9a-f]{64}$') NOT VALID;
ALTER DOMAIN ledger_count
  ADD CONSTRAINT ledger_count_not_negative CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN ledger_event_subject
  ADD CONSTRAINT ledger_event_subject_known CHECK (VALUE IN ('run','lease','operation')) NOT VALID;
ALTER DOMAIN ledger_actor_kind
  ADD CONSTRAINT ledger_actor_kind_known
  CHECK (VALUE IN ('worker','operator','dispatcher','reconciler','system')) NOT VALID;
