//! Wiring: configuration → ledger → upstreams → front. `main` stays thin;
//! tests start the same [`Proxy`] on `127.0.0.1:0`.

use std::future::Future;
use std::sync::Arc;

use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::ledger::{Ledger, LedgerOptions};
use crate::mcp::{Front, Upstreams};

/// A started proxy: ledger connected, upstreams connected, catalog built.
pub struct Proxy {
    pub config: Config,
    pub ledger: Ledger,
    pub front: Front,
    upstreams: Arc<Upstreams>,
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
            max_claim_ttl_ms: millis(config.policy.claim_ttl),
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
        let front = Front::new(config.clone(), catalog, upstreams.clone(), dispatcher);
        Ok(Proxy {
            config,
            ledger,
            front,
            upstreams,
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

    /// The control HTTP API over this proxy's ledger.
    pub fn control_router(&self) -> axum::Router {
        crate::control::router(self.ledger.clone(), self.config.policy.integers)
    }

    /// Serves MCP on stdin/stdout until the client closes stdin.
    pub async fn serve_stdio(&self) -> anyhow::Result<()> {
        crate::mcp::serve_stdio(self.front.clone()).await
    }

    /// Stops the upstream clients and child processes.
    pub async fn shutdown(self) {
        self.ledger.close().await;
        if let Ok(upstreams) = Arc::try_unwrap(self.upstreams) {
            upstreams.shutdown().await;
        }
    }
}
