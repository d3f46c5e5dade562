-- leasegate access tokens: the bearer tokens both listeners accept when
-- authentication is on (src/auth/mod.rs; functions in sql/access_token.sql).
--
-- A token is `lgt_<token_id>_<secret>`. Only the SHA-256 of the secret is
-- stored: the secret is shown once, by `leasegate tokens create`, and can
-- never be read back. Each token is bound to one tenant and one scope.
-- Tokens are never deleted (invariant 8): a revoked one keeps its row with
-- who revoked it and when.
--
-- Least privilege: token management belongs to a role of its own,
-- leasegate_operator, which the CLI (`leasegate tokens …`) switches to. The
-- application role (leasegate_app) can only verify a presented token
-- (access_token_verify): it cannot read the table, mint or revoke tokens, so
-- a compromised proxy cannot make itself an admin token.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'leasegate_operator') THEN
    BEGIN
      CREATE ROLE leasegate_operator NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL;
    END;
  END IF;
END
$$;

CREATE TABLE access_tokens (
  -- The public half of the token (16 lowercase hex characters).
  token_id     text PRIMARY KEY CHECK (token_id ~ '^[0-9a-f]{16}$'),
  -- SHA-256 of the secret half; never the secret itself.
  secret_hash  bytea NOT NULL CHECK (length(secret_hash) = 32),
  tenant_id    text NOT NULL CHECK (tenant_id <> '' AND length(tenant_id) <= 128),
  scope        text NOT NULL CHECK (scope IN ('agent', 'operator', 'admin')),
  name         text CHECK (name IS NULL OR (name <> '' AND length(name) <= 200)),
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  created_by   text NOT NULL CHECK (created_by <> '' AND length(created_by) <= 200),
  -- NULL: does not expire.
  expires_at   timestamptz,
  revoked_at   timestamptz,
  revoked_by   text,
  CONSTRAINT access_tokens_revocation_whole CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);
CREATE INDEX access_tokens_tenant_idx ON access_tokens (tenant_id, created_at);

REVOKE ALL ON access_tokens FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO leasegate_operator;
GRANT SELECT ON access_tokens TO leasegate_operator;
