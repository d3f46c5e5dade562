-- Retention: the settled history of terminal runs older than
-- a window leaves the live tables in bounded batches. Tables and triggers:
-- migrations/0009_scale.sql.

-- One batch: up to p_batch runs that are terminal (succeeded, failed,
-- cancelled), not archived yet, last changed before now - p_older_than_ms,
-- and whose every operation is settled (succeeded, failed_final,
-- cancelled) and unchanged since that cutoff — a run with an operation
-- prepared, dispatching or unknown keeps all of its history live. Of those
-- runs, every event, every operation and their evidence move to the
-- archive tables (p_delete: are deleted), and the run is marked
-- archived_at. p_tenant (NULL: any) limits it to one tenant's runs.
-- Returns how many runs, operations, evidence rows and events moved; 0 runs
-- means nothing is left to do.
--
-- Runs are taken FOR UPDATE SKIP LOCKED, so two archivers share the work;
-- a terminal run is never leased or changed again, and the operations of
-- these runs are settled, so no protected write of the proxy touches them
-- (a late settle of an archived operation finds it gone: 'not_found'; its
-- answer is then kept nowhere). One transaction: a crash leaves the batch
-- wholly moved or not at all.
CREATE OR REPLACE FUNCTION operations_archive(p_older_than_ms bigint, p_batch integer, p_delete boolean,
                                              p_tenant text)
RETURNS TABLE (runs bigint, operations bigint, evidence bigint, events bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  cutoff timestamptz;
  ids    uuid[];
  n_ops  bigint;
  n_evi  bigint;
  n_evt  bigint;
BEGIN
  IF p_older_than_ms IS NULL OR p_older_than_ms <= 0 THEN
    RAISE EXCEPTION 'archive window must be > 0 ms, got %', p_older_than_ms USING ERRCODE = '22023';
  END IF;
  IF p_batch IS NULL OR p_batch <= 0 OR p_batch > 10000 THEN
    RAISE EXCEPTION 'archive batch must be 1..10000 runs, got %', p_batch USING ERRCODE = '22023';
  END IF;
  cutoff := clock_timestamp() - p_older_than_ms * interval '1 millisecond';
  SELECT coalesce(array_agg(c.run_id), '{}') INTO ids FROM (
    SELECT r.run_id
      FROM agent_runs r
     WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.archived_at IS NULL
       AND r.updated_at < cutoff
       AND (p_tenant IS NULL OR r.tenant_id = p_tenant)
       AND NOT EXISTS (SELECT 1 FROM tool_operations o
                        WHERE o.run_id = r.run_id
                          AND (o.status NOT IN ('succeeded', 'failed_final', 'cancelled')
                               OR o.updated_at >= cutoff))
     ORDER BY r.updated_at
     LIMIT p_batch
       FOR UPDATE OF r SKIP LOCKED) c;
  IF cardinality(ids) = 0 THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  PERFORM set_config('leasegate.archiving', 'on', true);

  WITH gone AS (DELETE FROM ledger_events e WHERE e.run_id = ANY (ids) RETURNING e.*),
       kept AS (INSERT INTO ledger_events_archive (event_id, run_id, operation_id, row)
                SELECT g.event_id, g.run_id, g.operation_id, to_jsonb(g) FROM gone g WHERE NOT p_delete)
  SELECT count(*) INTO n_evt FROM gone;

  WITH gone AS (DELETE FROM operation_evidence v USING tool_operations o
                 WHERE v.operation_id = o.operation_id AND o.run_id = ANY (ids) RETURNING v.*),
       kept AS (INSERT INTO operation_evidence_archive (evidence_id, operation_id, row)
                SELECT g.evidence_id, g.operation_id, to_jsonb(g) FROM gone g WHERE NOT p_delete)
  SELECT count(*) INTO n_evi FROM gone;

  WITH gone AS (DELETE FROM tool_operations o WHERE o.run_id = ANY (ids) RETURNING o.*),
       kept AS (INSERT INTO tool_operations_archive (operation_id, run_id, status, row)
                SELECT g.operation_id, g.run_id, g.status, to_jsonb(g) FROM gone g WHERE NOT p_delete)
  SELECT count(*) INTO n_ops FROM gone;

  UPDATE agent_runs SET archived_at = clock_timestamp() WHERE run_id = ANY (ids);
  PERFORM set_config('leasegate.archiving', 'off', true);
  RETURN QUERY SELECT cardinality(ids)::bigint, n_ops, n_evi, n_evt;
END
$$;
REVOKE EXECUTE ON FUNCTION operations_archive(bigint, integer, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION operations_archive(bigint, integer, boolean, text) TO leasegate_operator;
