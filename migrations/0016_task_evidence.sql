-- Evidence of kind task: the upstream answered a tools/call with a task
-- handle (MCP Tasks extension, CreateTaskResult) instead of a result. The
-- body names the upstream and the task id, so that the dispatcher that
-- follows the task, or the reconciler after that process is gone, can ask
-- the upstream for the task's status (tasks/get, a pure read) until it is
-- terminal (sql/operation.sql, operation_follow_task). The constraint is
-- replaced NOT VALID and validated apart, as in 0014.
ALTER TABLE operation_evidence DROP CONSTRAINT operation_evidence_kind_check;
ALTER TABLE operation_evidence ADD CONSTRAINT operation_evidence_kind_check
  CHECK (kind IN ('late_response', 'not_sent', 'send_error', 'timeout', 'query_result',
                  'retry_result', 'operator', 'input_round', 'task')) NOT VALID;
ALTER TABLE operation_evidence VALIDATE CONSTRAINT operation_evidence_kind_check;
