-- Secrets at rest (src/policy/secrets.rs): re-sealing stored bodies under a
-- new key, for `leasegate secrets rotate`.

-- Replaces one operation's stored request body and result with the same
-- values sealed under another key, compare-and-swap on the exact stored
-- values read before (p_old_*): a row that changed since (settled,
-- converged) is left alone ('changed') for the next pass. Neither status nor
-- revision changes (what the row means is the same), so no claim or fence is
-- disturbed. Locks the one operation row and nothing else. Evidence is
-- re-sealed by evidence_reseal; events carry no bodies.
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

-- Replaces one evidence row's body with the same values sealed under
-- another key, compare-and-swap on the exact body read before: a row whose
-- body differs is left alone ('changed'). Evidence is append-only
-- (invariant 8): this is the one change its trigger allows
-- (migrations/0007: the body only, only inside this function), and what
-- the row says stays the same — the caller opened every sealed value and
-- sealed it again, nothing else. Locks the one evidence row.
CREATE OR REPLACE FUNCTION evidence_reseal(p_evidence_id bigint, p_old_body jsonb, p_new_body jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  e operation_evidence;
BEGIN
  IF p_new_body IS NULL THEN
    RAISE EXCEPTION 'an evidence body is required' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO e FROM operation_evidence WHERE evidence_id = p_evidence_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 'not_found';
  END IF;
  IF e.body IS DISTINCT FROM p_old_body THEN
    RETURN 'changed';
  END IF;
  PERFORM set_config('leasegate.resealing', 'on', true);
  UPDATE operation_evidence SET body = p_new_body WHERE evidence_id = p_evidence_id;
  PERFORM set_config('leasegate.resealing', 'off', true);
  RETURN 'resealed';
END
$$;

REVOKE EXECUTE ON FUNCTION evidence_reseal(bigint, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION evidence_reseal(bigint, jsonb, jsonb) TO leasegate_operator;
