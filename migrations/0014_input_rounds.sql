-- Evidence of kind input_round: one round of a call that asked its agent
-- something (sampling, elicitation, roots; input_required and the agent's
-- retry under MCP 2026-07-28) before it answered, recorded under the call's
-- dispatch claim (sql/operation.sql, operation_note_round). The constraint
-- is replaced NOT VALID and validated apart, so existing rows are checked
-- without holding the table's exclusive lock for the scan.
ALTER TABLE operation_evidence DROP CONSTRAINT operation_evidence_kind_check;
ALTER TABLE operation_evidence ADD CONSTRAINT operation_evidence_kind_check
  CHECK (kind IN ('late_response', 'not_sent', 'send_error', 'timeout', 'query_result',
                  'retry_result', 'operator', 'input_round')) NOT VALID;
ALTER TABLE operation_evidence VALIDATE CONSTRAINT operation_evidence_kind_check;
