-- Secrets at rest (src/policy/secrets.rs): re-sealing stored bodies under a
-- new key, for `leasegate secrets rotate`.

-- Replaces one operation's stored request body and result with the same
-- values sealed under another key, compare-and-swap on the exact stored
-- values read before (p_old_*): a row that changed since (settled,
-- converged) is left alone ('changed') for the next pass. Neither status nor
-- revision changes (what the row means is the same), so no claim or fence is
-- disturbed. Locks the one operation row and nothing else. Evidence and
-- events are append-only (invariant 8): they keep the key they were sealed
-- under.
CREATE OR REPLACE FUNCTION operation_reseal(
  p_operation_id text, p_old_request jsonb, p_new_request jsonb,
  p_old_result jsonb, p_new_result jsonb
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  o tool_operations;
BEGIN
  IF p_new_request IS NULL THEN
    RAISE EXCEPTION 'a request body is required' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO o FROM tool_operations WHERE operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 'not_found';
  END IF;
  IF o.request_body IS DISTINCT FROM p_old_request OR o.result IS DISTINCT FROM p_old_result THEN
    RETURN 'changed';
  END IF;
  UPDATE tool_operations SET request_body = p_new_request, result = p_new_result
   WHERE operation_id = p_operation_id;
  RETURN 'resealed';
END
$$;

REVOKE EXECUTE ON FUNCTION operation_reseal(text, jsonb, jsonb, jsonb, jsonb) FROM PUBLIC;
-- Re-sealing is an operator's act (`leasegate secrets rotate`, as
-- leasegate_operator): the proxy's role cannot rewrite stored bodies.
REVOKE EXECUTE ON FUNCTION operation_reseal(text, jsonb, jsonb, jsonb, jsonb) FROM leasegate_app;
GRANT EXECUTE ON FUNCTION operation_reseal(text, jsonb, jsonb, jsonb, jsonb) TO leasegate_operator;
-- What rotation reads to find the rows to re-seal and to count evidence.
GRANT SELECT ON tool_operations, operation_evidence TO leasegate_operator;
