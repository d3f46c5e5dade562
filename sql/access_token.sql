-- leasegate access tokens (table and roles in migrations/0004_access_tokens.sql;
-- format and scopes in src/auth/mod.rs).
--
-- access_token_verify is the only token function the application role may
-- run: it answers whether a presented (id, secret hash) pair is a live
-- token, and for which tenant and scope. Minting, listing and revoking are
-- leasegate_operator's (`leasegate tokens …`).

-- Whether a presented token is valid. outcome: valid | unknown (no such id,
-- or the secret does not match: the two are not told apart) | revoked |
-- expired. tenant_id and scope only when valid. Reads only.
CREATE OR REPLACE FUNCTION access_token_verify(p_token_id text, p_secret_hash bytea,
                                               OUT outcome text, OUT tenant_id text,
                                               OUT scope text, OUT expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  t access_tokens;
BEGIN
  SELECT * INTO t FROM access_tokens a WHERE a.token_id = p_token_id;
  IF NOT FOUND OR t.secret_hash <> p_secret_hash THEN
    outcome := 'unknown';
    RETURN;
  END IF;
  IF t.revoked_at IS NOT NULL THEN
    outcome := 'revoked';
    RETURN;
  END IF;
  IF t.expires_at IS NOT NULL AND t.expires_at <= clock_timestamp() THEN
    outcome := 'expired';
    RETURN;
  END IF;
  outcome := 'valid';
  tenant_id := t.tenant_id;
  scope := t.scope;
  expires_at := t.expires_at;
END
$$;

-- Records a new token (the caller generated id and secret and sends the
-- secret's hash). p_expires_in_ms NULL: never expires.
-- outcome: created | id_taken.
CREATE OR REPLACE FUNCTION access_token_create(p_token_id text, p_secret_hash bytea,
                                               p_tenant_id text, p_scope text, p_name text,
                                               p_created_by text, p_expires_in_ms bigint,
                                               OUT outcome text, OUT created_at timestamptz,
                                               OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  IF p_expires_in_ms IS NOT NULL AND p_expires_in_ms <= 0 THEN
    RAISE EXCEPTION 'a token expiry must be > 0 ms, got %', p_expires_in_ms USING ERRCODE = '22023';
  END IF;
  created_at := clock_timestamp();
  expires_at := CASE WHEN p_expires_in_ms IS NULL THEN NULL
                     ELSE created_at + p_expires_in_ms * interval '1 millisecond' END;
  INSERT INTO access_tokens (token_id, secret_hash, tenant_id, scope, name, created_at, created_by, expires_at)
  VALUES (p_token_id, p_secret_hash, p_tenant_id, p_scope, p_name, created_at, p_created_by, expires_at)
  ON CONFLICT (token_id) DO NOTHING;
  outcome := CASE WHEN FOUND THEN 'created' ELSE 'id_taken' END;
END
$$;

-- Revokes a token for good. outcome: revoked | already_revoked | not_found.
CREATE OR REPLACE FUNCTION access_token_revoke(p_token_id text, p_by text, OUT outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  t access_tokens;
BEGIN
  IF p_by IS NULL OR btrim(p_by) = '' THEN
    RAISE EXCEPTION 'a revocation needs who revokes it' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO t FROM access_tokens WHERE token_id = p_token_id FOR UPDATE;
  IF NOT FOUND THEN
    outcome := 'not_found';
    RETURN;
  END IF;
  IF t.revoked_at IS NOT NULL THEN
    outcome := 'already_revoked';
    RETURN;
  END IF;
  UPDATE access_tokens SET revoked_at = clock_timestamp(), revoked_by = p_by
   WHERE token_id = p_token_id;
  outcome := 'revoked';
END
$$;

REVOKE EXECUTE ON FUNCTION
  access_token_verify(text, bytea),
  access_token_create(text, bytea, text, text, text, text, bigint),
  access_token_revoke(text, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION access_token_verify(text, bytea) TO leasegate_app;
GRANT EXECUTE ON FUNCTION
  access_token_create(text, bytea, text, text, text, text, bigint),
  access_token_revoke(text, text)
TO leasegate_operator;
