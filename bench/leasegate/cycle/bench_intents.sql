-- Bench only: one pgbench transaction = one CALL of bench_cycle, which
-- builds client c's k intents of id n (as register_claim_settle_batch.sql does).
CREATE OR REPLACE FUNCTION bench_intents(p_client int, p_k int, p_n bigint,
  OUT runs uuid[], OUT owners text[], OUT epochs bigint[], OUT tokens bytea[], OUT intents operation_intent[],
  OUT dos text[], OUT ttls bigint[], OUT tenants text[])
LANGUAGE sql AS $$
  SELECT array_agg(l.run_id ORDER BY g), array_agg('bench-' || (p_client * p_k + g) ORDER BY g),
         array_agg(1::bigint), array_agg(l.token_sha256 ORDER BY g),
         array_agg(ROW('pgbench-' || p_client || '-' || p_n || '-' || g, 'pgbench-' || p_n || '-' || g, 1,
                       'bench__create', 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
                       jsonb_build_object('n', p_n), 'bench', 'create')::operation_intent ORDER BY g),
         array_agg('pgbench-' || p_client), array_agg(60000::bigint), array_agg('bench'::text)
    FROM generate_series(0, p_k - 1) g
    JOIN worker_leases l ON l.run_id = ('00000000-0000-7000-8000-' || lpad((p_client * p_k + g)::text, 12, '0'))::uuid
$$;
