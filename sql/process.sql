-- leasegate processes: liveness of claim holders. Helpers in
-- sql/common.sql.

-- The process p_owner is alive for p_ttl_ms more (database clock). Returns
-- the new alive_until.
CREATE OR REPLACE FUNCTION process_heartbeat(p_owner text, p_ttl_ms bigint) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  until timestamptz;
BEGIN
  IF p_owner IS NULL OR p_owner = '' THEN
    RAISE EXCEPTION 'process owner must not be empty' USING ERRCODE = '22023';
  END IF;
  IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
    RAISE EXCEPTION 'liveness ttl must be > 0 ms, got %', p_ttl_ms USING ERRCODE = '22023';
  END IF;
  until := clock_timestamp() + (p_ttl_ms * interval '1 millisecond');
  INSERT INTO leasegate_processes (owner, alive_until) VALUES (p_owner, until)
  ON CONFLICT (owner) DO UPDATE SET alive_until = EXCLUDED.alive_until;
  RETURN until;
END
$$;

-- The process p_owner stopped: its remaining claims are those of a gone
-- holder from now on.
CREATE OR REPLACE FUNCTION process_retire(p_owner text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
  UPDATE leasegate_processes SET alive_until = clock_timestamp() WHERE owner = p_owner
$$;

-- Whether the holder p_owner is provably gone: it has a row, and its
-- liveness lapsed. No row: not provable (judge by the claim's ttl).
CREATE OR REPLACE FUNCTION _holder_gone(p_owner text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = public, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM leasegate_processes
                  WHERE owner = p_owner AND alive_until <= clock_timestamp())
$$;

REVOKE EXECUTE ON FUNCTION
  process_heartbeat(text, bigint),
  process_retire(text),
  _holder_gone(text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  process_heartbeat(text, bigint),
  process_retire(text)
TO leasegate_app;
