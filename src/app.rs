//! Wiring: configuration → ledger → upstreams → front, and [`run`], the one
//! seam through which `leasegate serve` and the tests serve a started
//! [`Proxy`] on listeners they bound themselves (`main` binds the configured
//! addresses, tests bind `127.0.0.1:0`) until a shutdown future completes
//! (`main`: ctrl-c or SIGTERM; tests: a `CancellationToken`), as
//! tokio-rs/mini-redis `server::run(listener, shutdown)`.
//!
//! # Shutdown
//!
//! When `shutdown` completes (or either listener's server fails), both
//! listeners stop accepting, connections in flight are answered, then the
//! background loops are cancelled and awaited, tool answers the ledger could
//! not take yet get a bounded last chance, the ledger pool is closed and
//! the upstream clients are stopped (their stdio children end).

mod open;

use std::future::Future;
use std::sync::Arc;

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, DatabaseUrl, DatabaseUrlSource};
use crate::dispatch::Dispatcher;
use crate::durability::{DurabilityGate, liveness};
use crate::embedded::Cluster;
use crate::ledger::{Ledger, LedgerError, LedgerOptions, retry_within};

use crate::mcp::{Front, Upstreams};
use crate::policy::Durability;
use crate::reconcile::{Background, Signals};
use open::{open_ledger, open_operator, startup_error};

/// What the web console reads besides the ledger: this process's tenant,
/// upstream health, metrics, and the reconciler's plan for an unknown
/// operation (`reconcile::plan`, read-only: described, never executed).
fn console_sources(proxy: &Proxy) -> crate::control::console::Sources {
    let upstreams = proxy.upstreams.clone();
    let directory = proxy.directory.clone();
    let tools = Some(proxy.directory.clone());
    crate::control::console::Sources {
        ledger: proxy.ledger.clone(),
        operator: proxy.operator.clone(),
        tenant: Some(proxy.config.tenant.clone()),
        auth_required: proxy.config.auth_required(),
        upstreams: Some(Arc::new(move || serde_json::json!(upstreams.health()))),
        metrics: Some(Arc::new(|| metrics_handle().render())),
        planner: Some(Arc::new(move |operation, evidence, body| {
            let tool = directory.resolve(
                &operation.tool_name,
                operation
                    .route
                    .as_ref()
                    .map(|route| (route.upstream.as_str(), route.tool.as_str())),
            );
            crate::reconcile::plan::plan(
                operation,
                tool.as_ref().map(|t| &t.adapter),
                evidence,
                body,
            )
            .describe()
        })),
        tools,
    }
}

/// The process-wide Prometheus recorder (installed once; `metrics` is a
/// global facade).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0,
            ];
            let recorder = PrometheusBuilder::new()
                .set_buckets(&buckets)
                .expect("static buckets are valid")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may be installed already (tests); keep ours for rendering.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// A started proxy: ledger connected, upstreams connected, catalog built.
pub struct Proxy {
    pub config: Config,
    pub ledger: Ledger,
    /// The control API's operator routes run as `leasegate_operator`
    /// through this small pool ([`open_operator`]).
    pub operator: crate::control::OperatorLedger,
    pub front: Front,
    upstreams: Arc<Upstreams>,
    /// The background loops, when the policy runs them.
    background: Option<Arc<Background<Upstreams>>>,
    /// Stops the background loops and the metrics upkeep.
    stop: CancellationToken,
    /// The background loops' task, awaited at shutdown so that no pass is
    /// still using the ledger or an upstream when they close.
    loops: Option<tokio::task::JoinHandle<()>>,
    /// This process's identity: its claims carry it, its liveness is
    /// renewed under it.
    owner: String,
    /// The durability contract's gate (checked with every renewal).
    gate: Arc<DurabilityGate>,
    /// The tools the upstreams list (the front's and the outbox's
    /// directory): the control API judges planned intents by it.
    directory: Arc<crate::adapter::SharedDirectory>,
}

/// The listeners [`run`] serves, bound by the caller.
pub struct Listeners {
    /// MCP over Streamable HTTP at `/mcp`.
    pub mcp: tokio::net::TcpListener,
    /// The control API and `/metrics`; `None` when `control_listen = "off"`.
    pub control: Option<tokio::net::TcpListener>,
}

/// A listener that could not be bound: the address, the setting that
/// chose it, and why in words.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address} ({setting}): {reason}")]
pub struct BindError {
    pub address: std::net::SocketAddr,
    /// `listen`, `--listen` or `control_listen`: what to change.
    pub setting: &'static str,
    pub reason: String,
}

impl Listeners {
    /// Binds the configured addresses (`listen`, `control_listen`);
    /// `listen_setting` names where the MCP address came from (`listen`, or
    /// `--listen` when the command line chose it).
    pub async fn bind(
        config: &Config,
        listen_setting: &'static str,
    ) -> Result<Listeners, BindError> {
        let mcp = bind_one(config.http.listen, listen_setting).await?;
        let control = match config.http.control_listen {
            Some(address) => Some(bind_one(address, "control_listen").await?),
            None => None,
        };
        Ok(Listeners { mcp, control })
    }
}

async fn bind_one(
    address: std::net::SocketAddr,
    setting: &'static str,
) -> Result<tokio::net::TcpListener, BindError> {
    use std::io::ErrorKind;
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| BindError {
            address,
            setting,
            reason: match error.kind() {
                ErrorKind::AddrInUse => "address already in use".to_owned(),
                ErrorKind::PermissionDenied => "permission denied".to_owned(),
                ErrorKind::AddrNotAvailable => "not an address of this machine".to_owned(),
                _ => error.to_string(),
            },
        })
}

/// How often freed heap is handed back while connections or sessions end
/// (`http_server::spawn_memory_upkeep`).
const MEMORY_UPKEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Descriptors this process needs besides its listeners' connections: the
/// ledger pool, three pipes per stdio upstream, connections to HTTP
/// upstreams, the listeners, logs and the runtime.
fn reserved_descriptors(config: &Config) -> u64 {
    u64::from(config.database.connections(false)) + 8 * config.upstreams.len() as u64 + 128
}

/// `limits.max_connections` per listener, lowered to what the open-file
/// limit holds (raised towards its hard limit first), so that accepting
/// never runs the process out of descriptors (`http_server` invariant 3).
fn connection_room(config: &Config, control: bool) -> usize {
    let listeners = if control { 2 } else { 1 };
    let wanted = config.limits.max_connections as u64;
    let reserved = reserved_descriptors(config);
    let needed = wanted * listeners + reserved;
    match crate::http_server::raise_fd_limit(needed) {
        Ok(soft) if soft >= needed => config.limits.max_connections,
        Ok(soft) => {
            let room = (soft.saturating_sub(reserved) / listeners).max(1);
            tracing::warn!(
                open_file_limit = soft,
                max_connections = wanted,
                serving = room,
                "the open-file limit cannot hold limits.max_connections on every listener; \
                 serving at most {room} connections per listener (raise `ulimit -n`)"
            );
            usize::try_from(room).unwrap_or(usize::MAX)
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read or raise the open-file limit");
            config.limits.max_connections
        }
    }
}

/// Serves `proxy` on `listeners` until `shutdown` completes, then shuts it
/// down (see the module docs). An error of either server stops both.
pub async fn run(
    proxy: Proxy,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    // Bearer tokens on both listeners when `[auth]` requires them:
    // leasegate's own, and JWTs of the `[auth.jwt]` issuer.
    let mut authenticator = crate::auth::Authenticator::new(proxy.ledger.clone())
        .with_cache(proxy.config.auth.token_cache_ttl);
    if let Some(jwt) = &proxy.config.auth.jwt {
        let validator = crate::auth::jwt::JwtValidator::new(crate::auth::jwt::JwtSettings {
            issuer: jwt.issuer.clone(),
            audience: jwt.audience.clone(),
            jwks: jwt.jwks.clone(),
            tenant_claim: jwt.tenant_claim.clone(),
            scope_claim: jwt.scope_claim.clone(),
        });
        match validator {
            Ok(validator) => authenticator = authenticator.with_jwt(validator),
            Err(error) => {
                proxy.shutdown().await;
                anyhow::bail!("auth.jwt.jwks_file: {error}");
            }
        }
    }
    let gate = |listener| {
        proxy
            .config
            .auth_required()
            .then(|| crate::control::auth::AuthGate {
                authenticator: authenticator.clone(),
                listener,
                resource_url: proxy.config.auth.resource_url.clone(),
                issuers: proxy
                    .config
                    .auth
                    .jwt
                    .iter()
                    .map(|j| j.issuer.clone())
                    .collect(),
                served_tenant: (listener == crate::control::auth::Listener::Mcp)
                    .then(|| proxy.config.tenant.clone()),
            })
    };
    let (mcp_gate, control_gate) = (
        gate(crate::control::auth::Listener::Mcp),
        gate(crate::control::auth::Listener::Control),
    );
    let limits = proxy
        .config
        .limits
        .for_serving(proxy.config.auth_required());
    let max_connections = connection_room(&proxy.config, listeners.control.is_some());
    crate::http_server::spawn_memory_upkeep(MEMORY_UPKEEP, stop.clone());
    let mcp_allowed = Arc::new(crate::control::guard::Allowed {
        hosts: proxy.config.http.allowed_hosts.clone(),
        origins: proxy.config.http.allowed_origins.clone(),
        mcp: true,
    });
    let mcp = {
        let stop = stop.clone();
        let served = crate::mcp::serve_http(
            proxy.front.clone(),
            listeners.mcp,
            crate::mcp::HttpServing {
                sessions: proxy.config.http.sessions,
                // The arguments' limit plus room for the envelope.
                body_limit: proxy.config.policy.max_arguments_bytes + 64 * 1024,
                allowed_hosts: proxy.config.http.allowed_hosts.clone(),
                allowed_origins: proxy.config.http.allowed_origins.clone(),
                limits: limits.clone(),
                max_connections,
            },
            move |router| {
                let router = match mcp_gate {
                    Some(gate) => crate::control::auth::authenticated(router, gate),
                    None => router,
                };
                // Host and Origin first, as on the control listener: a
                // rebinding page is 403 before it is asked for a token, and
                // the metadata never echoes a foreign Host. (rmcp checks
                // the same lists again inside.)
                crate::control::guarded(router, mcp_allowed)
            },
            stop.clone().cancelled_owned(),
        );
        async move {
            let result = served.await;
            // One server down stops the other.
            stop.cancel();
            result
        }
    };
    let control = {
        let stop = stop.clone();
        let api = listeners.control.map(|listener| {
            let upstreams = proxy.upstreams.clone();
            let allowed = Arc::new(crate::control::guard::Allowed {
                hosts: proxy.config.http.allowed_hosts.clone(),
                origins: proxy.config.http.allowed_origins.clone(),
                mcp: false,
            });
            let api = crate::control::with_durability(
                crate::control::with_upstream_health(
                    crate::control::router_with_metrics(
                        proxy.ledger.clone(),
                        proxy.operator.clone(),
                        proxy.config.policy.integers,
                        proxy.config.tenant.clone(),
                        proxy.directory.clone(),
                        metrics_handle(),
                    ),
                    Arc::new(move || serde_json::json!(upstreams.health())),
                ),
                proxy.gate.clone(),
            );
            let api = crate::control::process_views_for(api, proxy.config.tenant.clone());
            let api = crate::control::console::with_console(api, console_sources(&proxy));
            let api = match control_gate {
                Some(gate) => crate::control::auth::authenticated(api, gate),
                None => api,
            };
            crate::control::serve(
                // Host and Origin first: a rebinding page is 403 before it
                // is asked for a token.
                crate::control::guarded(api, allowed),
                listener,
                &limits,
                max_connections,
                stop.clone().cancelled_owned(),
            )
        });
        async move {
            match api {
                Some(api) => {
                    let result = api.await;
                    stop.cancel();
                    result
                }
                // No control listener: nothing to stop the MCP front for.
                None => Ok(()),
            }
        }
    };
    let serving = async { tokio::join!(mcp, control) };
    tokio::pin!(serving);
    let (mcp, control) = tokio::select! {
        results = &mut serving => results,
        () = shutdown => {
            stop.cancel();
            serving.await
        }
    };
    proxy.shutdown().await;
    mcp.map_err(|e| anyhow::anyhow!("MCP listener: {e}"))?;
    control.map_err(|e| anyhow::anyhow!("control listener: {e}"))?;
    Ok(())
}

impl Proxy {
    pub async fn start(config: Config) -> anyhow::Result<Proxy> {
        // Installed first, so that what connecting records (the upstreams'
        // `upstream_up`) is kept.
        let handle = metrics_handle();
        crate::logfield::set_max_bytes(config.limits.log_field_max_bytes);
        let millis = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let options = LedgerOptions {
            max_lease_ttl_ms: millis(config.policy.lease_ttl_ceiling),
            max_claim_ttl_ms: millis(
                config
                    .policy
                    .claim_ttl
                    .max(config.policy.reconcile_claim_ttl),
            ),
            max_connections: config.database.connections(false),
            statement_timeout: config.database.statement_timeout,
            synchronous_commit_at_least_on: config.policy.durability == Durability::SyncReplica,
            bodies: config.policy.bodies(),
            group_commit: config.database.group_commit,
            ..LedgerOptions::default()
        };
        let ledger = open_ledger(&config, options.clone()).await?;
        let operator = match config.http.control_listen {
            Some(_) => match open_operator(&config, options).await {
                Ok(operator) => operator,
                Err(error) => {
                    ledger.close().await;
                    return Err(error);
                }
            },
            None => {
                crate::control::OperatorLedger::Unavailable("no control API in this process".into())
            }
        };
        let owner = crate::dispatch::process_owner();
        // The durability contract, before anything is served: sync_replica
        // refuses to start without what it claims; local starts, holding
        // dispatch while the server is a standby or a lossy failover is
        // unresolved.
        let gate = Arc::new(DurabilityGate::new(config.policy.durability, owner.clone()));
        let budget = config.database.connect_timeout;
        let checked = || gate.check(&ledger);
        let report = match retry_within(
            "durability check",
            budget,
            LedgerError::is_transient,
            checked,
        )
        .await
        {
            Ok(report) => report,
            Err(error) => {
                ledger.close().await;
                return Err(startup_error("checking the durability contract", error));
            }
        };
        if config.policy.durability == Durability::SyncReplica && !report.ok {
            ledger.close().await;
            anyhow::bail!(
                "policy durability = \"sync_replica\" is not met by the ledger's server, refusing \
                 to start: {}",
                report.reasons.join("; ")
            );
        }
        if !report.ok {
            tracing::error!(reasons = %report.reasons.join("; "), "starting with dispatch held");
        }
        let upstreams = Arc::new(Upstreams::connect(&config).await?);
        let mut catalog = upstreams
            .catalog(&config.naming.separator, &config.naming.unprefixed)
            .await?;
        let tool_directory = crate::mcp::upstream::directory(&catalog, &config);
        crate::mcp::upstream::hide_filled_arguments(&mut catalog, &tool_directory);
        tracing::info!(
            tools = catalog.len(),
            upstreams = config.upstreams.len(),
            "upstreams connected"
        );
        let dispatcher = Dispatcher::new(
            ledger.clone(),
            upstreams.clone(),
            config.policy.clone(),
            config.tenant.clone(),
            owner.clone(),
        )
        .with_gate(gate.clone());
        let directory = Arc::new(crate::adapter::SharedDirectory::new(tool_directory));
        let front = Front::new(
            catalog,
            directory.clone(),
            Arc::new(config.clone()),
            upstreams.clone(),
            dispatcher,
            Arc::default(),
        );
        let stop = CancellationToken::new();
        let upkeep = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = upkeep.cancelled() => return,
                    _ = tick.tick() => handle.run_upkeep(),
                }
            }
        });
        // Liveness of this process's claims: renewed while it runs, so a
        // claim it holds expires as soon as the process is provably gone
        // (killed, frozen, cut off) instead of after the whole claim ttl.
        // A connection that breaks meanwhile is retried, not fatal.
        liveness::first_renewal(&ledger, &owner, &gate, budget)
            .await
            .map_err(|error| startup_error("renewing this process's liveness", error))?;
        metrics::gauge!("leasegate_runtime_worker_threads")
            .set(tokio::runtime::Handle::current().metrics().num_workers() as f64);
        // The durability check rides along with every renewal, and runs at
        // once when a call saw the ledger fail (`DurabilityGate::suspect`).
        liveness::spawn(ledger.clone(), owner.clone(), gate.clone(), stop.clone());
        let mut loops = None;
        let background = config.policy.background.then(|| {
            let background = Arc::new(Background::gated(
                ledger.clone(),
                upstreams.clone(),
                directory.clone(),
                config.policy.clone(),
                &config.tenant,
                owner.clone(),
                gate.clone(),
            ));
            loops = Some(background.clone().spawn(stop.child_token()));
            background
        });
        Ok(Proxy {
            config,
            ledger,
            operator,
            front,
            upstreams,
            background,
            stop,
            loops,
            owner,
            gate,
            directory,
        })
    }

    /// The durability gate: what `GET /v1/durability` reports.
    pub fn durability(&self) -> Arc<DurabilityGate> {
        self.gate.clone()
    }

    /// The upstream clients: their health (`Upstreams::health`).
    pub fn upstreams(&self) -> Arc<Upstreams> {
        self.upstreams.clone()
    }

    /// The background loops' progress counters (test signals).
    pub fn background_signals(&self) -> Option<Arc<Signals>> {
        self.background.as_ref().map(|b| b.signals.clone())
    }

    /// Serves MCP on stdin/stdout until the client closes stdin or
    /// `shutdown` completes (SIGTERM: what some clients send to close a
    /// stdio server).
    ///
    /// With lease mode `session`, the configured task's run is this
    /// process's for as long as it serves (`agent_leases`): taken over
    /// from any earlier session first, released when stdin closes.
    pub async fn serve_stdio(&self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let session = match self.config.lease.mode {
            crate::config::LeaseMode::Explicit | crate::config::LeaseMode::Key => None,
            crate::config::LeaseMode::Session => {
                let task = self.config.session.task.as_deref().ok_or_else(|| {
                    anyhow::anyhow!(
                        "lease_mode = \"session\" needs a task key: `leasegate stdio --task KEY`, \
                         the LEASEGATE_TASK environment variable, or [session] task in the config"
                    )
                })?;
                // Joined before serving: the task is held from the start.
                let lease = self
                    .front
                    .session_leases()
                    .get(
                        crate::agent_leases::ANONYMOUS,
                        task,
                        std::time::Instant::now(),
                    )
                    .await?;
                self.front.set_session_lease(lease.clone());
                Some(lease)
            }
        };
        let served = tokio::select! {
            served = crate::mcp::serve_stdio(self.front.clone()) => served,
            // Calls in flight go on in their own tasks until the shutdown
            // that follows; each claim expires if its answer is not recorded.
            () = shutdown => {
                tracing::info!("stopping: the stdio session ends");
                Ok(())
            }
        };
        // Leaving at once: the task's next session need not wait for this
        // process's share of the lease to lapse.
        if let Some(session) = session {
            session.end().await;
        }
        served
    }

    /// Stops the background loops (and waits for them), closes the ledger
    /// pool, and stops the upstream clients and child processes.
    pub async fn shutdown(self) {
        let Proxy {
            ledger,
            operator,
            front,
            upstreams,
            background,
            stop,
            loops,
            owner,
            ..
        } = self;
        // No new call arrives now: the ones in flight get a grace period to
        // record their outcomes. If we are killed during it (or it runs
        // out), their claims expire into unknown, as after a crash.
        let left = front.calls_settled(CALLS_GRACE).await;
        if left > 0 {
            tracing::warn!(
                left,
                "calls still in flight after {CALLS_GRACE:?}: their claims expire into unknown"
            );
        }
        stop.cancel();
        // A pass checks the token between passes; one in the middle of an
        // upstream call ends within that call's timeout.
        if let Some(loops) = loops {
            match tokio::time::timeout(LOOPS_GRACE, loops).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "the background loops ended abnormally"),
                Err(_) => tracing::warn!(
                    "the background loops did not stop within {LOOPS_GRACE:?}; leaving them"
                ),
            }
        }
        // Session-mode memberships end with the process (the last member
        // out frees the lease for the task's next session).
        front.session_leases().end_all().await;
        // The front and the loops hold the upstream clients too.
        drop(background);
        drop(front);
        // Answers the ledger could not take yet get a last chance (their
        // calls' tasks have ended: every fact they learned is kept by now).
        crate::dispatch::drain_kept_facts(KEPT_FACTS_GRACE).await;
        // Claims still held now will not be settled by this process.
        if let Err(error) = ledger.process_retire(&owner).await {
            tracing::warn!(%error, "could not record this process as stopped");
        }
        ledger.close().await;
        if let crate::control::OperatorLedger::Ready(operator) = operator {
            operator.close().await;
        }
        // Stops the supervisors and ends the children, whoever still holds
        // the clients.
        upstreams.shutdown().await;
    }
}

/// How long the default URL's server has to accept a connection before the
/// embedded default starts a private cluster.
const DEFAULT_PROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// The private PostgreSQL cluster (`crate::embedded`), for `serve` and
/// `stdio`: when the ledger's URL is `"embedded"` (from any source), or
/// when it is the default (no `--database-url`, `LEASEGATE_DATABASE_URL`
/// or config `database_url`) and nothing accepts a connection there,
/// starts (or reuses) the private cluster in the state directory, points
/// `config` at its socket (source [`DatabaseUrlSource::Private`]) with
/// `migrate` on, and returns it: the caller stops it on exit
/// ([`stop_private`]; dropping it stops it too). `None`: the configured or
/// default server is used as before.
pub async fn provide_database(config: &mut Config) -> anyhow::Result<Option<Cluster>> {
    let asked = config.database.located();
    if !asked.is_embedded()
        && (asked.source != DatabaseUrlSource::Default
            || Ledger::server_answers(&asked.url, DEFAULT_PROBE).await)
    {
        return Ok(None);
    }
    let (dir, chosen) = crate::embedded::state_dir()?;
    if asked.is_embedded() {
        tracing::info!(asked_by = %asked.source, dir = %dir.display(), chosen_by = chosen,
            "database_url = \"embedded\": starting a private PostgreSQL");
    } else {
        tracing::info!(
            default = %asked.url,
            dir = %dir.display(),
            chosen_by = chosen,
            "no database configured and nothing answers at the default: starting a private PostgreSQL"
        );
    }
    let cluster = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || Cluster::start(&dir)).await??
    };
    if cluster.created {
        tracing::info!(dir = %dir.display(), "created the private PostgreSQL cluster (initdb)");
    }
    if cluster.was_running {
        tracing::info!(dir = %dir.display(), "reusing the private PostgreSQL server already running");
    }
    config.database.url = cluster.url(crate::embedded::DATABASE);
    config.database.url_source = DatabaseUrlSource::Private(dir.clone());
    // The cluster is leasegate's own: its database and ledger are made here.
    config.database.migrate = true;
    if cluster.owned() {
        eprintln!(
            "leasegate: private PostgreSQL at {} (socket), stopped on exit",
            dir.display()
        );
    } else {
        eprintln!(
            "leasegate: private PostgreSQL at {} (socket), shared with the leasegate process \
             that started it",
            dir.display()
        );
    }
    eprintln!(
        "leasegate: ledger URL {} (for --database-url)",
        config.database.url
    );
    Ok(Some(cluster))
}

/// The ledger's URL for a command that connects to the ledger without
/// starting it (the operator commands, `migrate`, `secrets rotate`):
/// `"embedded"` becomes the socket URL of the private cluster in the state
/// directory, which a running `serve` or `stdio` keeps up.
pub fn client_database(database: DatabaseUrl) -> anyhow::Result<DatabaseUrl> {
    if !database.is_embedded() {
        return Ok(database);
    }
    let (dir, _) = crate::embedded::state_dir()?;
    Ok(DatabaseUrl {
        url: crate::embedded::socket_url(&dir, crate::embedded::DATABASE),
        source: DatabaseUrlSource::Private(dir),
    })
}

/// Stops the private cluster [`provide_database`] started (`pg_ctl stop -m
/// fast`), if this process owns it.
pub async fn stop_private(cluster: Option<Cluster>) {
    let Some(cluster) = cluster else { return };
    match tokio::task::spawn_blocking(move || cluster.stop()).await {
        Ok(Ok(())) => tracing::info!("private PostgreSQL stopped"),
        Ok(Err(error)) => tracing::error!(%error, "could not stop the private PostgreSQL"),
        Err(error) => tracing::error!(%error, "could not stop the private PostgreSQL"),
    }
}

/// How long [`Proxy::shutdown`] lets the side-effecting calls in flight
/// finish and record their outcomes (a tool's answer settled, a timeout
/// marked unknown) before it stops the rest.
const CALLS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long [`Proxy::shutdown`] waits for kept tool answers to reach the
/// ledger (`dispatch::keeper`).
const KEPT_FACTS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long [`Proxy::shutdown`] waits for a background pass in progress.
const LOOPS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
