-- leasegate: unforgeable leases (issue 13, item 2).
--
-- Run id, owner and epoch are a lease's public identity (GET /v1/runs,
-- ledger_events); they are no longer its credential. Taking a lease
-- (run_create with an owner, lease_acquire, lease_takeover) stores the
-- SHA-256 of a fresh secret token the holder was shown once; every fenced
-- write presents the token's hash and _lease_fence compares it
-- (sql/common.sql). The token itself never reaches the database.
--
-- Leases that exist when this migration runs have no token (NULL): every
-- fenced write on them is refused ('lease_token_unset') until the lease is
-- acquired again or taken over, which issues a token. A released lease has
-- no token either.

ALTER TABLE worker_leases
  ADD COLUMN token_sha256 bytea
    CONSTRAINT worker_leases_token_sha256_length
    CHECK (token_sha256 IS NULL OR octet_length(token_sha256) = 32);
