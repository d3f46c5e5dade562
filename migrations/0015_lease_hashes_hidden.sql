-- The application role reads worker_leases without token_sha256: a lease
-- token's hash is what the fenced functions compare (inside SECURITY
-- DEFINER functions, which read it as their owner), so a role that could
-- read it could present it for a lease it does not hold. The console and
-- the control API read owner, epoch and expiry only.
REVOKE SELECT ON worker_leases FROM leasegate_app;
GRANT SELECT (run_id, owner, epoch, expires_at, updated_at, held_by_members)
  ON worker_leases TO leasegate_app;
