-- B: settle the previous batch and register the next in one transaction, then the WAL sample.
CREATE OR REPLACE PROCEDURE bench_cycle(p_client int, p_k int, p_n bigint, p_prev_ops text[], p_prev_dgs text[],
  INOUT ops text[] DEFAULT NULL, INOUT dgs text[] DEFAULT NULL, INOUT wal_lsn bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE a record; v jsonb;
BEGIN
  IF cardinality(p_prev_ops) > 0 THEN
    v := public.operation_settle_batch(p_prev_ops, array_fill('pgbench-' || p_client, ARRAY[p_k]), array_fill(1::bigint, ARRAY[p_k]),
          p_prev_dgs, array_fill('succeeded'::text, ARRAY[p_k]), array_fill(NULL::text, ARRAY[p_k]), array_fill('{"ok": true}'::jsonb, ARRAY[p_k]));
  END IF;
  SELECT * INTO a FROM public.bench_intents(p_client, p_k, p_n);
  SELECT array_agg(b.operation_id ORDER BY b.item), array_agg(b.request_digest ORDER BY b.item) INTO ops, dgs
    FROM public.operation_register_claim_batch(a.runs, a.owners, a.epochs, a.tokens, a.intents, a.dos, a.ttls, a.tenants) b;
  COMMIT;
  SELECT w.wal_lsn INTO wal_lsn FROM public.ledger_wal_position() w;
END $$;
