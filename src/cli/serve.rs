//! `leasegate serve` and `leasegate stdio`: the config loaded, the ledger's
//! URL resolved, a private PostgreSQL cluster started when none is
//! configured and nothing answers at the default
//! (`crate::app::provide_database`), the proxy started and served until
//! SIGINT, SIGTERM or SIGHUP (or, for `stdio`, the end of stdin). The private cluster is stopped on every way out,
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
    let mut shutdown = Box::pin(shutdown_signal());
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
    let Some(proxy) = start_unless_stopped(config, &mut shutdown).await? else {
        crate::app::stop_private(private).await;
        return Ok(());
    };
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
    let served = crate::app::run(proxy, listeners, shutdown).await;
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
    let mut shutdown = Box::pin(shutdown_signal());
    let started = start_stdio(config, database_url, task, database, &mut shutdown).await;
    let (proxy, private) = match started {
        Ok(Some(started)) => started,
        Ok(None) => return Ok(()),
        Err(error) => {
            // The client hears why too, not only a closed pipe.
            let (message, _) = super::failure::described(&error, database.as_ref());
            crate::mcp::startup::refuse_startup_on_stdio(&message).await;
            return Err(error);
        }
    };
    let served = proxy.serve_stdio(shutdown).await;
    proxy.shutdown().await;
    crate::app::stop_private(private).await;
    served
}

/// Everything `stdio` does before it serves: the started proxy and the
/// private cluster it uses, if any (`None`: a signal came first).
async fn start_stdio(
    config: &std::path::Path,
    database_url: Option<String>,
    task: Option<String>,
    database: &mut Option<DatabaseUrl>,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<(Proxy, Option<crate::embedded::Cluster>)>> {
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
    match start_unless_stopped(config, shutdown).await? {
        Some(proxy) => Ok(Some((proxy, private))),
        None => {
            crate::app::stop_private(private).await;
            Ok(None)
        }
    }
}

/// The proxy, started — or `None` when a signal came first (start-up may
/// wait for a database that does not answer yet).
async fn start_unless_stopped(
    config: Config,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<Proxy>> {
    tokio::select! {
        started = Proxy::start(config) => Ok(Some(started?)),
        () = shutdown => Ok(None),
    }
}

/// Completes on SIGINT (ctrl-c), SIGTERM or SIGHUP: each ends the process
/// as the end of stdin ends `stdio` — no new calls, the ones in flight
/// recorded within a grace period, session leases released, exit 0. The
/// handlers are installed when this is called, before start-up, so a
/// signal that comes while the proxy starts ends it as soon as it serves.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let install = |kind: SignalKind, name: &'static str| match signal(kind) {
        Ok(signal) => Some((signal, name)),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for {name}");
            None
        }
    };
    let mut signals: Vec<(Signal, &'static str)> = [
        install(SignalKind::interrupt(), "SIGINT"),
        install(SignalKind::terminate(), "SIGTERM"),
        install(SignalKind::hangup(), "SIGHUP"),
    ]
    .into_iter()
    .flatten()
    .collect();
    async move {
        let name = if signals.is_empty() {
            std::future::pending::<&'static str>().await
        } else {
            let received = signals.iter_mut().map(|(signal, name)| {
                Box::pin(async move {
                    signal.recv().await;
                    *name
                })
            });
            futures::future::select_all(received).await.0
        };
        tracing::info!(signal = name, "shutting down");
    }
}
