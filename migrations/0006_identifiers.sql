-- Client-chosen identifiers are bounded visible ASCII ('!' to '~': no
-- spaces, no control characters, nothing beyond ASCII), as `ids::
-- check_identifier` enforces at every edge and in the ledger's Rust calls:
-- a row that escaped both (an older binary, a hand-made insert) is refused
-- here too. NOT VALID: rows written before this migration are not
-- re-checked (nothing is rewritten, invariant 8); every new or changed row
-- is. PostgreSQL's regex ranges compare code points, whatever the collation.

ALTER TABLE agent_tasks
  ADD CONSTRAINT agent_tasks_tenant_id_identifier
    CHECK (tenant_id ~ '^[!-~]+$' AND length(tenant_id) <= 128) NOT VALID,
  ADD CONSTRAINT agent_tasks_task_id_identifier
    CHECK (task_id ~ '^[!-~]+$' AND length(task_id) <= 256) NOT VALID;

ALTER TABLE worker_leases
  ADD CONSTRAINT worker_leases_owner_identifier
    CHECK (owner IS NULL OR (owner ~ '^[!-~]+$' AND length(owner) <= 200)) NOT VALID;
