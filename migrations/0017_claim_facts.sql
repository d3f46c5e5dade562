-- The claim's facts on the operation row; one event per claim, written
-- when the claim ends.
--
-- A claim (prepared or new -> dispatching: the inline register-claim, the
-- outbox's claim) no longer appends an event of its own. What its event
-- said is kept on the row instead, beside what the row already held
-- (dispatch_owner, dispatch_until, dispatch_count, revision):
--   claimed_at   when the last claim was taken (database clock);
--   claim_epoch  the lease epoch it was taken under (NULL: the outbox's
--                claim, which has no lease);
--   claim_worker the lease owner whose call it was (NULL: the outbox).
-- The event that ends the claim carries the same facts in its detail
-- ("claim": dispatch_owner, worker, at, epoch, dispatch_count, revision,
-- inline) and the claim's epoch in its epoch column: the settle
-- (dispatching -> succeeded | failed_final), the mark unknown (holder or
-- claim expiry), the not-sent release (dispatching -> prepared). So a
-- gated call that is registered, claimed and settled in one breath writes
-- one event, and the history still answers who claimed, when, under which
-- epoch and with which dispatch number. Until its claim ends, the row
-- itself is the record of an in-flight claim, as it was before: a crash
-- at any point leaves either no row, or the row under its claim with
-- these facts, or the row and the ending event, each committed whole.
--
-- Claims taken before this migration keep their own 'dispatching' event
-- (their rows have no claimed_at); the event that ends such a claim
-- carries a claim object with a NULL "at", and readers take the claim's
-- facts from its own event (src/ledger/read.rs).
--
-- Nullable columns without a default: a catalog change, no rewrite.
ALTER TABLE tool_operations
  ADD COLUMN claimed_at   timestamptz,
  ADD COLUMN claim_epoch  bigint,
  ADD COLUMN claim_worker text;
