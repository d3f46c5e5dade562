//! Opening the ledgers at start-up: the application's pool (creating and
//! migrating the database first when asked) and the control API's operator
//! pool, each failure told apart for `main`'s exit codes; and how a
//! start-up step's ledger failure is reported ([`startup_error`]).
//!
//! Nothing here is durable beyond what the migrations commit: each
//! migration and the function installation is one transaction, so a
//! process that dies (or loses its connection) midway leaves the previous
//! state, and the next attempt carries on.

use crate::config::Config;
use crate::ledger::{Ledger, LedgerError, LedgerOptions, retry_within};

/// The operator routes' ledger: a pool of two sessions as
/// `leasegate_operator`, through `database_operator_url` when set, else the
/// ledger's own URL (whose login must then be a member of both roles).
///
/// * `database_operator_url` set and unusable: start-up fails (exit 6–9,
///   or 15 when its login is not a member of `leasegate_operator`) — a
///   login named for operator acts that cannot do them is a mistake.
/// * not set, and the ledger's login is not a member of
///   `leasegate_operator` (the least-privilege deployment: the proxy's
///   login holds `leasegate_app` only): tool calls and every other route
///   are served; the operator routes answer 503 `role_not_granted` and
///   operators act through `leasegate ops …` as a login of their own.
pub(super) async fn open_operator(
    config: &Config,
    options: LedgerOptions,
) -> anyhow::Result<crate::control::OperatorLedger> {
    use crate::control::OperatorLedger;
    use crate::ledger::{ConnectFailure, LedgerError, OPERATOR_ROLE, redacted_url};
    let options = LedgerOptions {
        session_role: Some(OPERATOR_ROLE.to_owned()),
        max_connections: 2,
        application_name: "leasegate-operator".to_owned(),
        // The operator routes are not the hot path.
        group_commit: None,
        connect_timeout: config.database.connect_timeout,
        ..options
    };
    let (url, explicit) = match &config.database.operator_url {
        Some(url) => (url.as_str(), true),
        None => (config.database.url.as_str(), false),
    };
    let opened = tokio::time::timeout(
        config.database.connect_timeout,
        Ledger::connect(url, options),
    )
    .await;
    match opened {
        Ok(Ok(ledger)) => Ok(OperatorLedger::Ready(ledger)),
        Ok(Err(LedgerError::Connect(error)))
            if !explicit && error.failure == ConnectFailure::RoleNotGranted =>
        {
            tracing::warn!(
                %error,
                "the control API's operator routes (resolve, retry, cancel, failover resolve)                  answer 503 role_not_granted: operators act with `leasegate ops …` as a login                  that is a member of {OPERATOR_ROLE}, or set database_operator_url"
            );
            Ok(OperatorLedger::Unavailable(error.to_string()))
        }
        Ok(Err(error)) => Err(anyhow::Error::new(error).context(format!(
            "opening the operator ledger ({OPERATOR_ROLE}) at {}{}",
            redacted_url(url),
            if explicit {
                " (database_operator_url)"
            } else {
                ""
            }
        ))),
        Err(_) => Err(anyhow::anyhow!(
            "opening the operator ledger ({OPERATOR_ROLE}) at {}: no answer within {:?}              (database_connect_timeout)",
            redacted_url(url),
            config.database.connect_timeout
        )),
    }
}

/// Opens the ledger (creating and migrating it first when `migrate` is
/// on), all of it within `database_connect_timeout`: a server that accepts
/// connections but never answers (or a URL that leads nowhere) is reported
/// as unreachable — which URL, without its password, and what did not
/// answer — instead of a silent hang (`main` exits 6).
pub(super) async fn open_ledger(config: &Config, options: LedgerOptions) -> anyhow::Result<Ledger> {
    use crate::ledger::{ConnectError, ConnectFailure, LedgerError, redacted_url, url_problem};
    let url = &config.database.url;
    let target = redacted_url(url);
    if let Some(why) = url_problem(url) {
        return Err(LedgerError::Connect(ConnectError {
            failure: ConnectFailure::InvalidUrl,
            target,
            detail: why,
        })
        .into());
    }
    let limit = config.database.connect_timeout;
    tracing::info!(database = %target, timeout = ?limit, "opening the ledger");
    // A connection that breaks once the server answered (a backend
    // terminated during the migrations or the schema check) is retried:
    // the migrations and the function installation are transactional and
    // idempotent. Why a first connection fails (nothing answers, the login
    // or the database refused) is reported at once.
    let last_broken = std::sync::Mutex::new(None::<String>);
    // No step gives up before the budget: each may wait a second past it,
    // so the budget's own timeout below ends first, and its message names
    // the wait applied and tells a silent server from none.
    let step_wait = limit + std::time::Duration::from_secs(1);
    let open = retry_within(
        "opening the ledger",
        limit,
        |error| {
            let retry = error.is_transient() && error.connect_failure().is_none();
            if retry {
                *last_broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.to_string());
            }
            retry
        },
        || async {
            if config.database.migrate {
                Ledger::create_database_if_missing_within(url, step_wait).await?;
                Ledger::migrate_within(url, step_wait).await?;
            }
            let options = LedgerOptions {
                connect_timeout: step_wait,
                ..options.clone()
            };
            Ledger::connect(url, options).await
        },
    );
    match tokio::time::timeout(limit, open).await {
        Ok(opened) => Ok(opened?),
        Err(_) if let Some(broken) = last_broken.lock().unwrap_or_else(|e| e.into_inner()).take() => {
            Err(LedgerError::Connect(ConnectError {
                failure: ConnectFailure::Unreachable,
                target,
                detail: format!(
                    "its connections kept breaking for {limit:?} (database_connect_timeout): {broken}"
                ),
            })
            .into())
        }
        Err(_) => {
            // Tell "nothing accepts a connection" from "something accepted
            // and never spoke PostgreSQL".
            let accepts = Ledger::server_answers(url, std::time::Duration::from_secs(1)).await;
            let what = if accepts {
                "the server accepted the connection but did not answer as PostgreSQL"
            } else {
                "nothing accepted a connection"
            };
            Err(LedgerError::Connect(ConnectError {
                failure: ConnectFailure::Unreachable,
                target,
                detail: format!("{what} within {limit:?} (database_connect_timeout)"),
            })
            .into())
        }
    }
}

/// A start-up step's ledger failure, saying whether a retry could have
/// fixed it: `serve` exits only when none can (a refused statement, an
/// answer this build does not understand), or when transient failures
/// outlasted `database_connect_timeout`.
pub(super) fn startup_error(step: &str, error: LedgerError) -> anyhow::Error {
    let why = if error.is_transient() {
        "the ledger kept failing for database_connect_timeout"
    } else {
        "retrying cannot fix this"
    };
    anyhow::Error::new(error).context(format!("{step} ({why})"))
}
