//! Wiring: configuration → ledger → upstreams → front. `main` stays thin;
//! tests start the same [`Proxy`] on `127.0.0.1:0`.

use std::future::Future;
use std::sync::Arc;

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::ledger::{Ledger, LedgerOptions};
use crate::mcp::{Front, Upstreams};
use crate::reconcile::{Background, Signals};

/// The process-wide Prometheus recorder (installed once; `metrics` is a
/// global facade), with its upkeep task.
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
    pub front: Front,
    upstreams: Arc<Upstreams>,
    /// The background loops, when the policy runs them.
    background: Option<Arc<Background<Upstreams>>>,
    stop: CancellationToken,
}

impl Proxy {
    pub async fn start(config: Config) -> anyhow::Result<Proxy> {
        if config.migrate {
            Ledger::create_database_if_missing(&config.database_url).await?;
            Ledger::migrate(&config.database_url).await?;
        }
        let millis = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let options = LedgerOptions {
            max_lease_ttl_ms: millis(config.policy.lease_ttl_ceiling),
            max_claim_ttl_ms: millis(
                config
                    .policy
                    .claim_ttl
                    .max(config.policy.reconcile_claim_ttl),
            ),
            max_connections: config.database_max_connections,
            ..LedgerOptions::default()
        };
        let ledger = Ledger::connect(&config.database_url, options).await?;
        let upstreams = Arc::new(Upstreams::connect(&config).await?);
        let catalog = upstreams
            .catalog(&config.namespace_separator, &config.unprefixed)
            .await?;
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
        );
        let directory = Arc::new(crate::adapter::SharedDirectory::new(
            crate::mcp::upstream::directory(&catalog, &config),
        ));
        let front = Front::new(
            catalog,
            directory.clone(),
            Arc::new(config.clone()),
            upstreams.clone(),
            dispatcher,
            Arc::default(),
        );
        let stop = CancellationToken::new();
        let handle = metrics_handle();
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
        let background = config.policy.background.then(|| {
            let background = Arc::new(Background::new(
                ledger.clone(),
                upstreams.clone(),
                directory,
                config.policy.clone(),
            ));
            background.clone().spawn(stop.child_token());
            background
        });
        Ok(Proxy {
            config,
            ledger,
            front,
            upstreams,
            background,
            stop,
        })
    }

    /// Serves MCP over HTTP at `/mcp` on `listener` until `shutdown`.
    pub async fn serve_http(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        crate::mcp::serve_http(
            self.front.clone(),
            listener,
            self.config.http_sessions,
            shutdown,
        )
        .await?;
        Ok(())
    }

    /// The control HTTP API over this proxy's ledger, with `/metrics`.
    pub fn control_router(&self) -> axum::Router {
        crate::control::with_metrics(
            crate::control::router(self.ledger.clone(), self.config.policy.integers),
            metrics_handle(),
        )
    }

    /// The background loops' progress counters (test signals).
    pub fn background_signals(&self) -> Option<Arc<Signals>> {
        self.background.as_ref().map(|b| b.signals.clone())
    }

    /// Serves MCP on stdin/stdout until the client closes stdin.
    pub async fn serve_stdio(&self) -> anyhow::Result<()> {
        crate::mcp::serve_stdio(self.front.clone()).await
    }

    /// Stops the upstream clients and child processes.
    pub async fn shutdown(self) {
        self.stop.cancel();
        drop(self.background);
        self.ledger.close().await;
        if let Ok(upstreams) = Arc::try_unwrap(self.upstreams) {
            upstreams.shutdown().await;
        }
    }
}
