//! `leasegate serve` and `leasegate stdio`: the config loaded, the ledger's
//! URL resolved, a private PostgreSQL cluster started when none is
//! configured and nothing answers at the default
//! (`crate::app::provide_database`), the proxy started and served until
//! ctrl-c or SIGTERM. The private cluster is stopped on every way out,
//! including an error return (dropping it stops it).

use crate::app::{Listeners, Proxy};
use crate::config::{Config, DatabaseUrl};

/// `leasegate serve`: MCP over HTTP, and the control API when configured.
/// `database` is set to the ledger's URL once it is known.
pub(super) async fn serve(
    config: &std::path::Path,
    listen: Option<std::net::SocketAddr>,
    database_url: Option<String>,
    database: &mut Option<DatabaseUrl>,
) -> anyhow::Result<()> {
    let mut config = Config::load(config)?;
    config.database.resolve_url(database_url.as_deref());
    *database = Some(config.database.located());
    if let Some(listen) = listen {
        config.http.listen = listen;
        config
            .check_exposure()
            .map_err(|message| anyhow::anyhow!("--listen {listen}: {message}"))?;
    }
    let listen_setting = if listen.is_some() {
        "--listen"
    } else {
        "listen"
    };
    let listeners = Listeners::bind(&config, listen_setting).await?;
    // Dropped on an error return: a private cluster stops then too.
    let private = crate::app::provide_database(&mut config).await?;
    *database = Some(config.database.located());
    let config_auth_required = config.auth_required();
    let proxy = Proxy::start(config).await?;
    // The banner, each address once; tests read the "control API at" and
    // "serving MCP at" lines to find the ephemeral ports.
    if let Some(control) = &listeners.control {
        let control = control.local_addr()?;
        eprintln!("leasegate: control API at http://{control}/v1");
        eprintln!(
            "leasegate: web console at http://{control}/console, metrics at http://{control}/metrics"
        );
    }
    if config_auth_required {
        eprintln!(
            "leasegate: bearer tokens required on both listeners (`leasegate tokens create`)"
        );
    }
    let address = listeners.mcp.local_addr()?;
    eprintln!("leasegate: serving MCP at http://{address}/mcp");
    let served = crate::app::run(proxy, listeners, shutdown_signal()).await;
    crate::app::stop_private(private).await;
    served
}

/// `leasegate stdio`: MCP on stdin/stdout; with `task`, lease mode
/// `session` for that task. `database` is set to the ledger's URL once it
/// is known.
pub(super) async fn stdio(
    config: &std::path::Path,
    database_url: Option<String>,
    task: Option<String>,
    database: &mut Option<DatabaseUrl>,
) -> anyhow::Result<()> {
    let mut config = Config::load(config)?;
    config.database.resolve_url(database_url.as_deref());
    *database = Some(config.database.located());
    if let Some(task) = task {
        config.lease.mode = crate::config::LeaseMode::Session;
        config.session.task = Some(task);
    }
    config.database.max_connections = Some(config.database.connections(true));
    let private = crate::app::provide_database(&mut config).await?;
    *database = Some(config.database.located());
    let proxy = Proxy::start(config).await?;
    let served = proxy.serve_stdio(shutdown_signal()).await;
    proxy.shutdown().await;
    crate::app::stop_private(private).await;
    served
}

/// Completes on ctrl-c (SIGINT) or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}
