//! The run: the databases created and dropped, leasegate and the
//! upstream started, the sweep of cells over callers and repetitions, the
//! counted round trips per call and the idle sessions.

use super::*;

pub(super) fn progress(settings: &Settings, what: impl std::fmt::Display) {
    if settings.verbose {
        eprintln!("bench_gateway: {what}");
    }
}

/// Runs the whole benchmark.
pub async fn run(settings: &Settings) -> anyhow::Result<Report> {
    ensure!(settings.repeat >= 1, "--repeat must be at least 1");
    ensure!(!settings.callers.is_empty(), "no caller counts");
    let pgbench_path = settings
        .pgbench
        .clone()
        .or_else(pgbench_run::find)
        .ok_or_else(|| {
            anyhow!("pgbench not found on PATH nor in /usr/lib/postgresql/*/bin (apt-get install postgresql-contrib, or --pgbench)")
        })?;
    let mut report = Report {
        environment: environment(&settings.admin_url).await?,
        ..Report::default()
    };
    let served_url = with_database(&settings.admin_url, &settings.db_prefix);
    let sql_url = with_database(&settings.admin_url, &format!("{}_sql", settings.db_prefix));
    let ceiling_url = with_database(
        &settings.admin_url,
        &format!("{}_ceiling", settings.db_prefix),
    );
    let scratch = std::env::temp_dir().join(format!(
        "leasegate-bench-gateway-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(scratch.join("state"))?;
    let result = measure(
        settings,
        &pgbench_path,
        &mut report,
        [&served_url, &sql_url, &ceiling_url],
        &scratch,
    )
    .await;
    for url in [&served_url, &sql_url, &ceiling_url] {
        if let Err(error) = database::drop(url).await {
            eprintln!("bench_gateway: could not drop {url}: {error:#}");
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    report.environment.load_end = load_average();
    result.map(|()| report)
}

pub(super) async fn measure(
    settings: &Settings,
    pgbench_path: &Path,
    report: &mut Report,
    [served_url, sql_url, ceiling_url]: [&String; 3],
    scratch: &Path,
) -> anyhow::Result<()> {
    progress(settings, "creating the databases");
    database::recreate(served_url).await?;
    leasegate::ledger::Ledger::migrate(served_url).await?;
    database::recreate(sql_url).await?;
    setup_leasegate_sql(sql_url).await?;
    database::recreate(ceiling_url).await?;
    setup_ceiling(ceiling_url).await?;

    let upstream = upstream_config(settings, &scratch.join("state"))?;
    let environment = &mut report.environment;
    environment.upstream = upstream.tools.description.clone();
    environment.leasegate = settings.leasegate.display().to_string();
    environment.pgbench = pgbench_path.display().to_string();
    report.settings_line = format!(
        "{} s measured per cell after {} s of warm-up, {} repetition(s) (medians), callers {:?}, \
         {RUNS} leased runs, leasegate database_max_connections = {}, group_commit = {}{}",
        settings.duration.as_secs_f64(),
        settings.warmup.as_secs_f64(),
        settings.repeat,
        settings.callers,
        settings.db_pool,
        settings.group_commit,
        settings
            .config_lines
            .iter()
            .map(|line| format!(", {line}"))
            .collect::<String>()
    );

    // The main child: every throughput cell, the renewals, memory under load.
    progress(settings, "starting leasegate serve");
    let main = Served::start(
        settings,
        &upstream,
        ServeOptions {
            name: "main",
            database_url: served_url.clone(),
            control: true,
            http_sessions: false,
        },
    )
    .await?;
    let outcome = sweep(
        settings,
        pgbench_path,
        report,
        &main,
        &upstream,
        [sql_url, ceiling_url],
        scratch,
    )
    .await;
    main.stop().await?;
    outcome?;

    // Round trips: the same configuration with its ledger behind the counting proxy.
    counted(settings, report, &upstream, served_url).await?;

    // Memory per idle MCP session.
    progress(
        settings,
        format!("opening {} idle MCP sessions", settings.sessions),
    );
    let sessions = Served::start(
        settings,
        &upstream,
        ServeOptions {
            name: "sessions",
            database_url: served_url.clone(),
            control: false,
            http_sessions: true,
        },
    )
    .await?;
    let outcome = idle_sessions(settings, &sessions).await;
    sessions.stop().await?;
    let (idle, open) = outcome?;
    report.memory.sessions = settings.sessions;
    report.memory.sessions_idle_kib = idle;
    report.memory.sessions_open_kib = open;
    Ok(())
}

/// The throughput sweep, renewals and growth cells against `main`.
pub(super) async fn sweep(
    settings: &Settings,
    pgbench_path: &Path,
    report: &mut Report,
    main: &Served,
    upstream: &UpstreamConfig,
    [sql_url, ceiling_url]: [&String; 2],
    scratch: &Path,
) -> anyhow::Result<()> {
    // Memory settles after start (upstream handshakes, pool connections).
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.memory.idle_kib = main.rss_kib()?;
    let leases = create_leases(&main.control, "bench", RUNS).await?;
    let batch_hosts = create_batch_leases(
        &main.database_url,
        settings.batch_hosts,
        settings.batch_leases,
    )
    .await?;
    report.batch_shape = (settings.batch_hosts, settings.batch_leases);
    // One pgbench cell of `script` on `url` at `callers`, over the cell window.
    let pgbench_cell = |url: &str, script: &str, callers: usize| {
        pgbench(
            pgbench_path,
            url,
            script,
            callers,
            settings.duration,
            scratch,
        )
    };
    let _keep_alive = KeepAlive::start(&main.control, &leases)?;
    let mut nonce = 0u64;
    let target = |nonce: &mut u64| {
        *nonce += 1;
        Arc::new(Target {
            mcp: main.mcp.clone(),
            tools: upstream.tools.clone(),
            nonce: format!("c{nonce}-{}", uuid::Uuid::new_v4().simple()),
        })
    };
    let mut record = |measure: Measure, callers: usize, cell: Cell| {
        report
            .cells
            .entry((measure, callers))
            .or_default()
            .push(cell);
    };
    for repetition in 1..=settings.repeat {
        for &callers in &settings.callers {
            for kind in [Kind::Gated, Kind::PassThrough, Kind::Replay] {
                progress(
                    settings,
                    format!(
                        "repetition {repetition}: {} at {callers} callers",
                        kind.label()
                    ),
                );
                let measured = cell(
                    &target(&mut nonce),
                    &leases,
                    kind,
                    callers,
                    settings.warmup,
                    settings.duration,
                    Some(main),
                )
                .await?;
                record(Measure::Leasegate(kind), callers, measured);
            }
            progress(
                settings,
                format!("repetition {repetition}: pgbench at {callers} callers"),
            );
            extend_sql_leases(sql_url).await?;
            let theirs = pgbench_cell(sql_url, LEASEGATE_HOTPATH, callers)?;
            record(Measure::PgbenchLeasegate, callers, theirs);
            let ceiling = pgbench_cell(ceiling_url, CEILING_HOTPATH, callers)?;
            record(Measure::PgbenchCeiling, callers, ceiling);
        }
        // Renewal.
        let callers = settings.renew_callers;
        progress(
            settings,
            format!("repetition {repetition}: renewals at {callers} callers"),
        );
        let api = renew_cell(
            &main.control,
            &leases,
            callers,
            settings.warmup,
            settings.duration,
        )
        .await?;
        record(Measure::RenewControlApi, callers, api);
        extend_sql_leases(sql_url).await?;
        let theirs = pgbench_cell(sql_url, LEASEGATE_RENEW, callers)?;
        record(Measure::PgbenchRenewLeasegate, callers, theirs);
        let ceiling = pgbench_cell(ceiling_url, CEILING_RENEW, callers)?;
        record(Measure::PgbenchRenewCeiling, callers, ceiling);
        let mut batch = pgbench_cell(ceiling_url, CEILING_RENEW_BATCH, callers)?;
        batch.rate *= CEILING_BATCH_SIZE;
        record(Measure::PgbenchRenewBatchCeiling, callers, batch);
        if let Some(ours) = batch_renewal_through_leasegate(
            &main.control,
            &batch_hosts,
            settings.warmup,
            settings.duration,
        )
        .await?
        {
            record(Measure::BatchRenewLeasegate, settings.batch_hosts, ours);
        }
    }
    let smallest = *settings.callers.iter().min().expect("callers");
    let largest = *settings.callers.iter().max().expect("callers");
    let rss_at = |callers: usize| {
        report.cells[&(Measure::Leasegate(Kind::Gated), callers)]
            .iter()
            .filter_map(|cell| cell.rss_kib)
            .collect::<Vec<_>>()
    };
    if let (Some(low), Some(high)) = (
        stats::upper_median(&rss_at(smallest)),
        stats::upper_median(&rss_at(largest)),
    ) {
        report.memory.load = Some((smallest, low, largest, high));
    }
    // Steady state: the same gated cell again and again; memory after each.
    for round in 1..=settings.growth_cells {
        progress(
            settings,
            format!("growth cell {round}: gated at {largest} callers"),
        );
        cell(
            &target(&mut nonce),
            &leases,
            Kind::Gated,
            largest,
            settings.warmup,
            settings.duration,
            Some(main),
        )
        .await?;
        report.memory.growth_kib.push(main.rss_kib()?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.memory.idle_after_kib = main.rss_kib()?;
    Ok(())
}

/// Round trips per call through the counting proxy: the background rate
/// while idle, a run's first call, then one cell of each kind.
pub(super) async fn counted(
    settings: &Settings,
    report: &mut Report,
    upstream: &UpstreamConfig,
    served_url: &str,
) -> anyhow::Result<()> {
    let proxy = CountingProxy::start(host_port(&settings.admin_url)?).await?;
    let database = served_url
        .rsplit_once('/')
        .map(|(_, db)| db.split('?').next().unwrap_or(db))
        .unwrap_or(&settings.db_prefix);
    let user = settings
        .admin_url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map_or("postgres".to_owned(), |(user, _)| user.to_owned());
    let proxied = format!(
        "postgres://{user}@127.0.0.1:{}/{database}?sslmode=disable",
        proxy.port
    );
    progress(
        settings,
        "starting leasegate serve behind the counting proxy",
    );
    let served = Served::start(
        settings,
        upstream,
        ServeOptions {
            name: "counted",
            database_url: proxied,
            control: true,
            http_sessions: false,
        },
    )
    .await?;
    let outcome = async {
        // No keep-alive here: this phase is far shorter than a lease ttl,
        // and its renewals would be counted.
        let leases = create_leases(&served.control, "counted", RUNS).await?;
        let fresh =
            create_leases(&served.control, "first-call", settings.first_calls.max(1)).await?;
        // What the background loops cost with no call at all.
        let window = settings.background_window;
        let before = proxy.count();
        tokio::time::sleep(window).await;
        let background_per_s = (proxy.count() - before) as f64 / window.as_secs_f64();
        report.background_per_s = background_per_s;
        let tools = upstream.tools.clone();
        let callers = 1;
        report.round_trip_callers = callers;
        // Enough uncounted calls first that every pooled connection has
        // prepared its statements (sqlx prepares once per connection).
        let warmup_calls = 3 * u64::from(settings.db_pool);
        for kind in [Kind::Gated, Kind::PassThrough, Kind::Replay] {
            progress(settings, format!("counting round trips: {}", kind.label()));
            let target = Arc::new(Target {
                mcp: served.mcp.clone(),
                tools: tools.clone(),
                nonce: format!("rt-{}", uuid::Uuid::new_v4().simple()),
            });
            let caller = Caller {
                client: client()?,
                index: 0,
                lease: leases.first().cloned(),
            };
            let warm_until = Instant::now() + settings.warmup;
            let mut n = 0;
            while n < warmup_calls || Instant::now() < warm_until {
                caller.call(&target, kind, n).await?;
                n += 1;
            }
            let began = Instant::now();
            let before = proxy.count();
            let executed_before = proxy.executions();
            let mut calls = 0;
            while began.elapsed() < settings.duration {
                caller.call(&target, kind, n).await?;
                n += 1;
                calls += 1;
            }
            let raw = proxy.count() - before;
            let mut counted = round_trips(raw, calls, began.elapsed(), background_per_s);
            counted.statements = per_call(&executed_before, &proxy.executions(), calls);
            report.round_trips.insert(Some(kind), counted);
        }
        // One call on each fresh run: the first call of a run (the pool is warm by now).
        let target = Arc::new(Target {
            mcp: served.mcp.clone(),
            tools: tools.clone(),
            nonce: format!("first-{}", uuid::Uuid::new_v4().simple()),
        });
        let callers: Vec<Caller> = fresh
            .iter()
            .enumerate()
            .map(|(index, lease)| {
                Ok(Caller {
                    client: client()?,
                    index,
                    lease: Some(lease.clone()),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let began = Instant::now();
        let before = proxy.count();
        let executed_before = proxy.executions();
        for caller in &callers {
            caller.call(&target, Kind::Gated, 1).await?;
        }
        let calls = fresh.len() as u64;
        let mut counted = round_trips(
            proxy.count() - before,
            calls,
            began.elapsed(),
            background_per_s,
        );
        counted.statements = per_call(&executed_before, &proxy.executions(), calls);
        report.round_trips.insert(None, counted);
        anyhow::Ok(())
    }
    .await;
    served.stop().await?;
    outcome
}

/// Executions per call of each SQL text between two snapshots, most first.
pub(super) fn per_call(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    calls: u64,
) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = after
        .iter()
        .filter_map(|(sql, &count)| {
            let delta = count - before.get(sql).copied().unwrap_or(0);
            (delta > 0).then(|| (sql.clone(), delta as f64 / calls.max(1) as f64))
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

pub(super) fn round_trips(
    raw: u64,
    calls: u64,
    elapsed: Duration,
    background_per_s: f64,
) -> RoundTrips {
    let calls_f = calls.max(1) as f64;
    let background = background_per_s * elapsed.as_secs_f64();
    RoundTrips {
        calls,
        raw,
        raw_per_call: raw as f64 / calls_f,
        per_call: ((raw as f64 - background) / calls_f).max(0.0),
        statements: Vec::new(),
    }
}

/// `VmRSS` idle, then with `settings.sessions` MCP sessions open and idle.
pub(super) async fn idle_sessions(
    settings: &Settings,
    served: &Served,
) -> anyhow::Result<(u64, u64)> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = served.rss_kib()?;
    let client = client()?;
    let mut ids = Vec::with_capacity(settings.sessions);
    for n in 0..settings.sessions {
        let response = client
            .post(&served.mcp)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .body(
                json!({"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {
                    "protocolVersion": PROTOCOL, "capabilities": {},
                    "clientInfo": {"name": "bench-gateway", "version": "0"}}})
                .to_string(),
            )
            .send()
            .await?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let text = response.text().await?;
        let session =
            session.ok_or_else(|| anyhow!("initialize gave no session: {status} {text}"))?;
        let response = client
            .post(&served.mcp)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-session-id", &session)
            .body(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "notifications/initialized: {}",
            response.status()
        );
        ids.push(session);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open = served.rss_kib()?;
    Ok((idle, open))
}
