//! The console's pages that only read: the overview (counts, unknown
//! operations that need an operator, figures from the process's metrics),
//! the run and operation lists and one run's or operation's page (which
//! the forms render again, with their refusal, when they refuse). Every
//! read is of the viewer's tenant only; another tenant's run or operation
//! is "not found".

use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;

use super::page_data::{Asked, OperationQuery, Overview, RunQuery};
use super::pages;
use super::state::{
    ConsoleState, PageResult, Problem, Shared, Viewer, blank, html, operation_id, parse_run,
};
use crate::ledger::{OperationSearch, RunSearch};

// Overview.

/// Sums of Prometheus counters by one label, from the text exposition.
fn counter_by(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let mut sums: std::collections::BTreeMap<String, f64> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => match rest.split_once('}') {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = labels
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| k.trim() == label)
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
            .unwrap_or_default();
        *sums.entry(key).or_default() += value;
    }
    sums.into_iter().collect()
}

pub(super) async fn overview(State(state): Shared, viewer: Viewer) -> PageResult {
    let ledger = &state.sources.ledger;
    let tenant = viewer.tenant();
    let counts = ledger.console_counts(tenant).await?;
    let unknown = ledger.operations_unknown_summary_of(tenant).await?;
    let mut needs_operator = Vec::new();
    if let Some(planner) = &state.sources.planner {
        let unknowns = ledger
            .console_operations(&OperationSearch {
                tenant,
                status: Some("unknown"),
                ..Default::default()
            })
            .await?;
        for row in unknowns.into_iter().take(50) {
            let Some(view) = ledger.operation_get(&row.operation.operation_id).await? else {
                continue;
            };
            let (step, why) = planner(&view.operation, &view.evidence, &view.request_body);
            if step == "needs_operator" {
                needs_operator.push((row.operation, row.age_seconds, why));
            }
        }
    }
    // The process's own state is for its tenant's operators and admins.
    let sees_process = viewer.sees_process();
    let metrics = state
        .sources
        .metrics
        .as_ref()
        .filter(|_| sees_process)
        .map(|render| render());
    let (mut calls_per_second, mut calls_total, mut takeovers_total) = (None, None, None);
    let mut replays = None;
    let (mut rejections, mut refusals) = (Vec::new(), Vec::new());
    if let Some(text) = &metrics {
        // Every agent call, gated or read-only, replays and refusals
        // included (the outbox's own sends are `dispatch_total`).
        let total = counter_by(text, "leasegate_agent_calls_total", "outcome")
            .iter()
            .fold(0.0, |sum, (_, v)| sum + v);
        calls_total = Some(total);
        let replayed = counter_by(text, "leasegate_agent_calls_total", "replayed");
        let of = |value: &str| {
            replayed
                .iter()
                .find(|(v, _)| v == value)
                .map_or(0.0, |(_, n)| *n)
        };
        replays = Some((of("true"), of("waited")));
        let now = Instant::now();
        let mut last = state.last_calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, before)) = *last {
            let seconds = now.duration_since(at).as_secs_f64();
            if seconds > 0.0 {
                calls_per_second = Some(((total - before) / seconds).max(0.0));
            }
        }
        *last = Some((now, total));
        takeovers_total = counter_by(text, "lease_acquire_total", "outcome")
            .into_iter()
            .find(|(outcome, _)| outcome == "taken_over")
            .map(|(_, v)| v)
            .or(Some(0.0));
        rejections = counter_by(text, "protected_write_rejected_total", "reason");
        refusals = counter_by(text, "http_refused_total", "reason");
    }
    let upstreams = state
        .sources
        .upstreams
        .as_ref()
        .filter(|_| sees_process)
        .map(|health| health());
    Ok(html(pages::overview(
        &viewer.banner(&state),
        &Overview {
            counts,
            unknown,
            needs_operator,
            upstreams,
            calls_per_second,
            calls_total,
            replays,
            takeovers_total,
            rejections,
            refusals,
        },
    )))
}

// Runs.

pub(super) async fn runs(
    State(state): Shared,
    viewer: Viewer,
    Query(query): Query<RunQuery>,
) -> PageResult {
    let run_id = blank(&query.run_id).map(parse_run).transpose()?;
    let status = blank(&query.status);
    if let Some(status) = status
        && crate::ledger::RunStatus::parse(status).is_none()
    {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{status:?} is not a run status (pending, running, succeeded, failed, cancelled)"
            ),
        ));
    }
    let rows = state
        .sources
        .ledger
        .console_runs(&RunSearch {
            tenant: viewer.tenant(),
            task: blank(&query.task),
            run_id,
            status,
        })
        .await?;
    Ok(html(pages::runs(&viewer.banner(&state), &query, &rows)))
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct Flash {
    done: Option<String>,
}

pub(super) async fn run_page(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(flash): Query<Flash>,
) -> PageResult {
    run_response(&state, &viewer, &raw, flash.done.as_deref(), None).await
}

pub(super) async fn run_response(
    state: &ConsoleState,
    viewer: &Viewer,
    raw: &str,
    done: Option<&str>,
    refused: Option<(StatusCode, String)>,
) -> PageResult {
    let run = parse_run(raw)?;
    let ledger = &state.sources.ledger;
    let view = ledger
        .run_get(run)
        .await?
        .filter(|view| viewer.tenant().is_none_or(|own| view.tenant_id == own))
        .ok_or_else(|| Problem::not_found("run"))?;
    let events = ledger.run_events(run).await?;
    let operations = ledger.operations_list(run, None).await?;
    let status = refused
        .as_ref()
        .map(|(status, _)| *status)
        .unwrap_or(StatusCode::OK);
    let page = pages::run(
        &viewer.banner(state),
        &view,
        &events,
        &operations,
        &viewer.form_token(&state.form_key),
        done,
        refused.as_ref().map(|(_, message)| message.as_str()),
    );
    Ok((status, html(page)).into_response())
}

// Operations.

pub(super) async fn operations(
    State(state): Shared,
    viewer: Viewer,
    Query(query): Query<OperationQuery>,
) -> PageResult {
    let run_id = blank(&query.run_id).map(parse_run).transpose()?;
    let status = blank(&query.status);
    if let Some(status) = status
        && crate::ledger::OperationStatus::parse(status).is_none()
    {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{status:?} is not an operation status (prepared, dispatching, unknown, succeeded, failed_final, cancelled)"
            ),
        ));
    }
    let older_than_seconds = blank(&query.older_than)
        .map(|text| {
            humantime::parse_duration(text)
                .map(|d| d.as_secs() as i64)
                .map_err(|_| {
                    Problem::new(
                        StatusCode::BAD_REQUEST,
                        format!("{text:?} is not an age (such as 30s, 5m, 2h)"),
                    )
                })
        })
        .transpose()?;
    let rows = state
        .sources
        .ledger
        .console_operations(&OperationSearch {
            tenant: viewer.tenant(),
            status,
            tool: blank(&query.tool),
            upstream: blank(&query.upstream),
            run_id,
            older_than_seconds,
        })
        .await?;
    Ok(html(pages::operations(
        &viewer.banner(&state),
        &query,
        &rows,
    )))
}

pub(super) async fn operation_page(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(flash): Query<Flash>,
) -> PageResult {
    operation_response(&state, &viewer, &raw, flash.done.as_deref(), None, None).await
}

pub(super) async fn operation_response(
    state: &ConsoleState,
    viewer: &Viewer,
    raw: &str,
    done: Option<&str>,
    refused: Option<(StatusCode, String)>,
    asked: Option<Asked>,
) -> PageResult {
    let id = operation_id(raw)?;
    let ledger = &state.sources.ledger;
    if let Some(own) = viewer.tenant()
        && ledger.operation_tenant(&id).await?.as_deref() != Some(own)
    {
        return Err(Problem::not_found("operation"));
    }
    let view = ledger
        .operation_get(&id)
        .await?
        .ok_or_else(|| Problem::not_found("operation"))?;
    let attempts = ledger.console_reconcile_attempts(&id).await?;
    let plan = if view.operation.status == crate::ledger::OperationStatus::Unknown {
        state
            .sources
            .planner
            .as_ref()
            .map(|planner| planner(&view.operation, &view.evidence, &view.request_body))
    } else {
        None
    };
    // The rule `ops retry` refuses by: no retry action where none can
    // follow (not judged without the serving process's tools).
    let no_retry = state.sources.tools.as_deref().and_then(|tools| {
        let tool = crate::dispatch::recorded_tool(tools, &view.operation);
        crate::adapter::retry_budget_matters(tool.as_ref().map(|t| &t.adapter)).err()
    });
    let status = refused
        .as_ref()
        .map(|(status, _)| *status)
        .unwrap_or(StatusCode::OK);
    let page = pages::operation(
        &viewer.banner(state),
        &pages::OperationPage {
            view: &view,
            reconcile_attempts: attempts,
            no_retry,
            plan,
            form_token: viewer.form_token(&state.form_key),
            done,
            refused: refused.as_ref().map(|(_, message)| message.as_str()),
            asked: asked.unwrap_or_default(),
        },
    );
    Ok((status, html(page)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_by_label() {
        let text = "# TYPE x counter\nprotected_write_rejected_total{reason=\"lease_lost\",call=\"a\"} 2\nprotected_write_rejected_total{call=\"b\",reason=\"lease_lost\"} 3\nprotected_write_rejected_total{reason=\"stale_epoch\"} 1\nprotected_write_rejected_totalx 9\n";
        assert_eq!(
            counter_by(text, "protected_write_rejected_total", "reason"),
            vec![("lease_lost".into(), 5.0), ("stale_epoch".into(), 1.0)]
        );
    }
}
