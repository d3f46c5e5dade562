//! The operator commands `runs`, `lease` and `ops` run: each is one request
//! to the control API in-process (`crate::control::in_process`), against a
//! ledger this command connects to itself, never through a `leasegate
//! serve`. Operator acts ([`OperatorCommand::is_operator_act`]) connect as
//! the role `leasegate_operator`, the rest as `leasegate_app`, so that in a
//! least-privilege deployment the operator's own login (a member of
//! `leasegate_operator` only) does them. `ops archive` has no route: it is
//! `super::archive`, on the ledger directly.
//!
//! The ledger's URL is found as every command finds it
//! ([`DatabaseUrl::resolve`]: `--database-url`, `LEASEGATE_DATABASE_URL`,
//! `database_url` of `--config`, the default). With `--config`, the commands
//! act for that config's tenant, as its `leasegate serve` would.

use std::collections::BTreeMap;

use http::Method;

use super::archive::archive;
use super::failure::ledger_refusal;
use super::operator_args::{OperatorCommand, OpsCommand};
use super::operator_request::ApiRequest;
use super::output::{exit_code, render, report};
use super::target::Target;
use crate::adapter::Adapter;
use crate::config::DatabaseUrl;
use crate::control::{ErrorCode, OperatorLedger, exit};
use crate::ledger::{ConnectError, ConnectFailure, Ledger, LedgerError, LedgerOptions};
use crate::policy::Bodies;

impl OperatorCommand {
    /// Runs the command against the ledger at `--database-url`: prints the
    /// answer (stdout) or the error (stderr, or stdout with `--json`) and
    /// returns the process exit code.
    pub async fn run(&self) -> u8 {
        let common = self.common();
        if let OperatorCommand::Ops {
            command:
                OpsCommand::Archive {
                    older_than,
                    delete,
                    batch,
                    max_batches,
                },
            ..
        } = self
        {
            return archive(common, older_than, *delete, *batch, *max_batches).await;
        }
        let Target {
            database,
            tenant,
            bodies,
            adapters,
        } = match Target::of(common) {
            Ok(target) => target,
            Err(code) => return code,
        };
        let operator_act = self.is_operator_act();
        let ApiRequest { method, path, body } = self.request();
        let read_only = method == Method::GET;
        let ledger = match connect(&database, bodies, operator_act, read_only).await {
            Ok(ledger) => ledger,
            Err(error) => {
                let (code, message) = ledger_refusal(&error, &database);
                return report(common.json, code, &message);
            }
        };
        if let OperatorCommand::Ops {
            command: OpsCommand::Retry { operation_id, .. },
            ..
        } = self
            && let Some(why) =
                retry_refusal(&ledger, tenant.as_deref(), &adapters, operation_id).await
        {
            ledger.close().await;
            return report(common.json, ErrorCode::NothingToRetry, &why);
        }
        let operator = if operator_act {
            OperatorLedger::Ready(ledger.clone())
        } else {
            OperatorLedger::Unavailable("not an operator command".into())
        };
        let (status, answer) = crate::control::in_process::execute(
            ledger.clone(),
            operator.clone(),
            tenant.clone(),
            method,
            &path,
            body,
        )
        .await;
        // A resolution is shown as it now stands: the row it wrote and its
        // history, the resolution last (read back as `ops show` reads it).
        let shown = match self {
            OperatorCommand::Ops {
                command: OpsCommand::Resolve { operation_id, .. },
                ..
            } if status.is_success() && !common.json => {
                let show = OpsCommand::Show {
                    operation_id: operation_id.clone(),
                };
                let ApiRequest { method, path, body } = show.request();
                let (read, row) = crate::control::in_process::execute(
                    ledger.clone(),
                    operator,
                    tenant,
                    method,
                    &path,
                    body,
                )
                .await;
                read.is_success().then(|| {
                    format!(
                        "resolved {operation_id} (evidence {})\n{}",
                        super::output::text(&answer["evidence_id"]),
                        render(&row)
                    )
                })
            }
            _ => None,
        };
        ledger.close().await;
        if status.is_success() {
            println!(
                "{}",
                if common.json {
                    answer.to_string()
                } else {
                    shown.unwrap_or_else(|| render(&answer))
                }
            );
            return exit::OK;
        }
        let code = answer["code"].as_str().unwrap_or("error");
        if common.json {
            println!("{answer}");
        } else {
            eprintln!(
                "leasegate: {} ({code})",
                answer["message"].as_str().unwrap_or("request failed")
            );
        }
        exit_code(code)
    }
}

/// The ledger an operator command runs on: as `leasegate_operator` for an
/// operator act, else as `leasegate_app`.
async fn connect(
    database: &DatabaseUrl,
    bodies: Bodies,
    operator_act: bool,
    read_only: bool,
) -> Result<Ledger, LedgerError> {
    let options = LedgerOptions {
        max_connections: 2,
        bodies,
        session_role: Some(
            if operator_act {
                crate::ledger::OPERATOR_ROLE
            } else {
                crate::ledger::APP_ROLE
            }
            .to_owned(),
        ),
        ..Default::default()
    };
    let connected = Ledger::connect(&database.url, options.clone()).await;
    // A read by a login that is a member of leasegate_operator only (the
    // least-privilege operator's): that role reads every ledger table
    // too, so the read runs as it.
    if read_only
        && !operator_act
        && matches!(
            &connected,
            Err(LedgerError::Connect(ConnectError {
                failure: ConnectFailure::RoleNotGranted,
                ..
            }))
        )
    {
        let as_operator = LedgerOptions {
            session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
            ..options
        };
        return Ledger::connect(&database.url, as_operator).await;
    }
    connected
}

/// Why `ops retry` cannot lead to a retry of `operation_id`, judged by the
/// adapter file of its recorded upstream in `--config` (as `leasegate
/// serve` judges it by its live directory); `None`: a retry can follow, or
/// nothing here says otherwise (no config, an upstream it does not list,
/// an operation not unknown or not this tenant's — the route's answer
/// says so).
async fn retry_refusal(
    ledger: &Ledger,
    tenant: Option<&str>,
    adapters: &BTreeMap<String, Adapter>,
    operation_id: &str,
) -> Option<String> {
    let id = crate::intent::OperationId::from_string(operation_id.to_owned());
    // Another tenant's operation is "not found" for this config: the
    // route says so.
    if let Some(tenant) = tenant
        && ledger.operation_tenant(&id).await.ok().flatten().as_deref() != Some(tenant)
    {
        return None;
    }
    let operation = ledger.operation_record(&id).await.ok().flatten()?;
    if operation.status != crate::ledger::OperationStatus::Unknown {
        return None;
    }
    let route = operation.route.as_ref()?;
    let adapter = adapters.get(&route.upstream)?.tool(&route.tool, None);
    crate::adapter::retry_budget_matters(Some(&adapter))
        .err()
        .map(|why| {
            format!("operation {operation_id} cannot be retried: {why}. Nothing was written")
        })
}
