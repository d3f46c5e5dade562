-- leasegate durability: what the ledger's server promises about an
-- acknowledged commit, where its WAL stands, and the failovers leasegate
-- detected (table in migrations/0003_failovers.sql; contract in
-- src/durability/mod.rs).
--
-- SECURITY DEFINER so that the application role sees what only privileged
-- roles may (pg_stat_replication's sync_state, pg_control_system(), the
-- timeline history files), all but ledger_wal_position, which needs none
-- of it (see there); the functions only read, except failover_record and
-- failover_resolve.

-- The facts leasegate judges its durability policy by, in one snapshot.
-- synchronous_commit is the calling session's (what its commits wait for).
-- timeline and wal_lsn are NULL on a standby (no WAL is written there).
-- wal_lsn is at or beyond every commit acknowledged before this call, on
-- any session that waits for its commits to be flushed: the flush position
-- (under synchronous_commit = off, the insert position, since a commit is
-- then acknowledged before its flush). Never the insert position otherwise:
-- WAL inserted but not yet flushed is lost by a crash-restart that loses no
-- acknowledged commit, and a high-water above it would read as a loss.
CREATE OR REPLACE FUNCTION ledger_durability(
  OUT in_recovery boolean,
  OUT synchronous_commit text,
  OUT synchronous_standby_names text,
  OUT sync_standbys integer,
  OUT streaming_standbys integer,
  OUT system_identifier text,
  OUT timeline bigint,
  OUT wal_lsn pg_lsn)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  in_recovery := pg_is_in_recovery();
  synchronous_commit := current_setting('synchronous_commit');
  synchronous_standby_names := current_setting('synchronous_standby_names');
  SELECT count(*) FILTER (WHERE s.state = 'streaming' AND s.sync_state IN ('sync', 'quorum')),
         count(*) FILTER (WHERE s.state = 'streaming')
    INTO sync_standbys, streaming_standbys
    FROM pg_stat_replication s;
  system_identifier := (SELECT c.system_identifier::text FROM pg_control_system() c);
  IF NOT in_recovery THEN
    wal_lsn := CASE WHEN current_setting('synchronous_commit') = 'off' THEN pg_current_wal_insert_lsn()
                    ELSE pg_current_wal_flush_lsn() END;
    -- The WAL file name starts with the current timeline (pg_control_checkpoint()
    -- lags until the first checkpoint after a promotion).
    timeline := ('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint;
  END IF;
  RETURN;
END
$$;

-- Where this server's WAL stands, for the acknowledged high-water of one
-- call (src/durability): the system identifier, the current timeline (as
-- ledger_durability reads it) and the WAL position ledger_durability
-- reads (flushed, or inserted under synchronous_commit = off), which is at
-- or beyond the end of every commit acknowledged before this call, on any
-- session. timeline and wal_lsn are NULL on a standby. Read by the hot
-- path's own statements (operation_settle_acknowledged after its commit,
-- operation_register_claim on a replay), so the sample costs no round trip.
-- The system identifier is read once per session, through
-- ledger_durability (which reads the control file), and kept in the
-- session setting leasegate.system_identifier: a session belongs to one
-- server for its life, and a server's identifier never changes (a
-- promoted standby has its primary's), so the kept value is the one the
-- file holds. A RESET or DISCARD only makes the next call read it again.
-- Not SECURITY DEFINER, and no SET clause: it writes no table, and what it
-- reads after the first call (the session setting, the recovery state,
-- the WAL positions and file name) every role may read; the functions it
-- calls are pg_catalog's and ledger_durability, schema-qualified. Running
-- as its caller, in the caller's search_path, it can mislead no one but
-- the caller, whose own high-water it is. So the settle's sample after its
-- commit sets and restores no search_path of its own.
CREATE OR REPLACE FUNCTION ledger_wal_position(OUT system_identifier text, OUT timeline bigint,
                                               OUT wal_lsn bigint)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
  system_identifier := current_setting('leasegate.system_identifier', true);
  IF system_identifier IS NULL OR system_identifier = '' THEN
    system_identifier := (SELECT d.system_identifier FROM public.ledger_durability() d);
    PERFORM set_config('leasegate.system_identifier', system_identifier, false);
  END IF;
  IF NOT pg_is_in_recovery() THEN
    wal_lsn := (CASE WHEN current_setting('synchronous_commit') = 'off' THEN pg_current_wal_insert_lsn()
                     ELSE pg_current_wal_flush_lsn() END - '0/0'::pg_lsn)::bigint;
    timeline := ('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint;
  END IF;
END
$$;

-- Where timeline p_old_timeline ended, from the history file of
-- p_new_timeline (lines "parent_tli <tab> switch_lsn <tab> reason"). NULL
-- when the file cannot be read (privileges, missing file) or names no such
-- parent.
CREATE OR REPLACE FUNCTION ledger_timeline_switch(p_old_timeline bigint, p_new_timeline bigint)
RETURNS pg_lsn
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  history text;
  line    text;
  fields  text[];
BEGIN
  IF p_new_timeline IS NULL OR p_new_timeline < 2 OR p_new_timeline > 4294967295 THEN
    RETURN NULL;
  END IF;
  BEGIN
    history := pg_read_file('pg_wal/' || upper(lpad(to_hex(p_new_timeline), 8, '0')) || '.history');
  EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
  END;
  FOREACH line IN ARRAY regexp_split_to_array(history, '\n') LOOP
    fields := regexp_split_to_array(btrim(line), '\s+');
    IF array_length(fields, 1) >= 2 AND fields[1] ~ '^[0-9]+$' AND fields[1]::bigint = p_old_timeline
       AND fields[2] ~ '^[0-9A-Fa-f]+/[0-9A-Fa-f]+$' THEN
      RETURN fields[2]::pg_lsn;
    END IF;
  END LOOP;
  RETURN NULL;
END
$$;

-- Records a failover seen by p_detected_by (once per process and new
-- timeline): lossy when the switch point is unknown or below what the
-- process saw acknowledged; a clean one is recorded resolved. Returns the
-- row (the existing one when this process recorded it before).
CREATE OR REPLACE FUNCTION failover_record(
  p_detected_by text, p_system_identifier text, p_old_system_identifier text,
  p_old_timeline bigint, p_new_timeline bigint, p_switch_lsn pg_lsn, p_acknowledged_lsn pg_lsn)
RETURNS ledger_failovers
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  f     ledger_failovers;
  lossy boolean := p_switch_lsn IS NULL OR p_acknowledged_lsn > p_switch_lsn;
BEGIN
  IF p_detected_by IS NULL OR p_detected_by = '' THEN
    RAISE EXCEPTION 'a failover needs its detector' USING ERRCODE = '22023';
  END IF;
  INSERT INTO ledger_failovers (detected_by, system_identifier, old_system_identifier, old_timeline,
                                new_timeline, switch_lsn, acknowledged_lsn, lossy,
                                resolved_at, resolved_by, resolved_reason)
  VALUES (p_detected_by, p_system_identifier, p_old_system_identifier, p_old_timeline,
          p_new_timeline, p_switch_lsn, p_acknowledged_lsn, lossy,
          CASE WHEN lossy THEN NULL ELSE clock_timestamp() END,
          CASE WHEN lossy THEN NULL ELSE p_detected_by END,
          CASE WHEN lossy THEN NULL
               ELSE 'clean failover: nothing acknowledged beyond the switch point' END)
  ON CONFLICT ON CONSTRAINT ledger_failovers_once_per_process DO NOTHING
  RETURNING * INTO f;
  IF NOT FOUND THEN
    SELECT * INTO f FROM ledger_failovers
     WHERE system_identifier = p_system_identifier AND new_timeline = p_new_timeline
       AND detected_by = p_detected_by;
  END IF;
  RETURN f;
END
$$;

-- An operator resolves a lossy failover: the ledger, the workers' epochs and
-- the remote systems were compared and dispatch may resume. Who and why are
-- kept. outcome: resolved | already_resolved | not_found.
CREATE OR REPLACE FUNCTION failover_resolve(p_failover_id bigint, p_by text, p_reason text,
                                            OUT outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  f ledger_failovers;
BEGIN
  IF p_by IS NULL OR btrim(p_by) = '' THEN
    RAISE EXCEPTION 'a resolution needs who resolves it' USING ERRCODE = '22023';
  END IF;
  IF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION 'a resolution needs a reason' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO f FROM ledger_failovers WHERE failover_id = p_failover_id FOR UPDATE;
  IF NOT FOUND THEN
    outcome := 'not_found';
    RETURN;
  END IF;
  IF f.resolved_at IS NOT NULL THEN
    outcome := 'already_resolved';
    RETURN;
  END IF;
  UPDATE ledger_failovers
     SET resolved_at = clock_timestamp(), resolved_by = p_by, resolved_reason = p_reason
   WHERE failover_id = p_failover_id;
  outcome := 'resolved';
END
$$;

REVOKE EXECUTE ON FUNCTION
  ledger_wal_position(),
  ledger_durability(),
  ledger_timeline_switch(bigint, bigint),
  failover_record(text, text, text, bigint, bigint, pg_lsn, pg_lsn),
  failover_resolve(bigint, text, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  ledger_wal_position(),
  ledger_durability(),
  ledger_timeline_switch(bigint, bigint),
  failover_record(text, text, text, bigint, bigint, pg_lsn, pg_lsn)
TO leasegate_app;
-- Resolving a lossy failover resumes dispatch: an operator act
-- (migrations/0007), revoked from the app role explicitly, since a
-- database migrated before kept that grant.
REVOKE EXECUTE ON FUNCTION failover_resolve(bigint, text, text) FROM leasegate_app;
GRANT EXECUTE ON FUNCTION failover_resolve(bigint, text, text) TO leasegate_operator;
