//! The console's action forms — cancel a run, resolve an unknown
//! operation, start its retries over: each form parsed, its per-form token
//! (CSRF) and the revision its page was rendered at checked, then the act
//! of `control::acts` run and its outcome shown (a redirect with `done`, or
//! the page again with the refusal and what was asked). The acts and their
//! ledger calls are the JSON API's; only the checks of the form and the
//! words of the pages are the console's.

use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use serde::Deserialize;

use super::page_data::Asked;
use super::pages;
use super::state::{
    ConsoleState, PageResult, Problem, Shared, Viewer, blank, operation_id, parse_run,
};
use super::views::{operation_response, run_response};
use crate::control::acts::{self, ActError};
use crate::ledger::{ConvergeOutcome, LedgerError, RetryResetOutcome, Settlement};

#[derive(Debug, Deserialize)]
pub(crate) struct CancelForm {
    revision: Option<String>,
    note: Option<String>,
    form_token: Option<String>,
}

fn check_form_token(
    state: &ConsoleState,
    viewer: &Viewer,
    token: Option<&str>,
) -> Result<(), String> {
    match token {
        Some(token) if token == viewer.form_token(&state.form_key) => Ok(()),
        Some(_) => Err("refused: the form's token is not this session's (the page is from another login or an earlier leasegate process); reload the page. Nothing was written".to_owned()),
        None => Err("refused: the form carries no form token; reload the page. Nothing was written".to_owned()),
    }
}

/// What every action form is checked for first: its per-form token (403),
/// then the revision it was rendered at (422); the revision, or the refusal.
fn form_revision(
    state: &ConsoleState,
    viewer: &Viewer,
    token: Option<&str>,
    revision: Option<&str>,
) -> Result<i64, (StatusCode, String)> {
    check_form_token(state, viewer, token).map_err(|message| (StatusCode::FORBIDDEN, message))?;
    expected_revision(revision).map_err(|message| (StatusCode::UNPROCESSABLE_ENTITY, message))
}

fn expected_revision(raw: Option<&str>) -> Result<i64, String> {
    raw.map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            "refused: the form carries no revision; reload the page. Nothing was written".to_owned()
        })?
        .parse::<i64>()
        .map_err(|_| {
            "refused: the form's revision is not a number; reload the page. Nothing was written"
                .to_owned()
        })
}

fn required_note(note: Option<&str>, what: &str) -> Result<String, String> {
    match note.and_then(acts::note) {
        Some(note) => Ok(note.to_owned()),
        None => Err(format!(
            "refused: a {what} needs a note (why); nothing was written"
        )),
    }
}

/// A form that needs only a note (cancel, retry), checked in order: its
/// token and revision ([`form_revision`]), then the note; the revision and
/// note, or the refusal.
fn checked_note_form(
    state: &ConsoleState,
    viewer: &Viewer,
    token: Option<&str>,
    revision: Option<&str>,
    note: Option<&str>,
    what: &str,
) -> Result<(i64, String), (StatusCode, String)> {
    let expected = form_revision(state, viewer, token, revision)?;
    let note =
        required_note(note, what).map_err(|message| (StatusCode::UNPROCESSABLE_ENTITY, message))?;
    Ok((expected, note))
}

pub(super) async fn cancel_run(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<CancelForm>,
) -> PageResult {
    let run = parse_run(&raw)?;
    let refuse = |status: StatusCode, message: String| {
        let state = state.clone();
        let raw = raw.clone();
        let viewer = &viewer;
        async move { run_response(&state, viewer, &raw, None, Some((status, message))).await }
    };
    // Another tenant's run is not found before anything else is said.
    let view = state
        .sources
        .ledger
        .run_get(run)
        .await?
        .filter(|view| viewer.tenant().is_none_or(|own| view.tenant_id == own))
        .ok_or_else(|| Problem::not_found("run"))?;
    let (expected, note) = match checked_note_form(
        &state,
        &viewer,
        form.form_token.as_deref(),
        form.revision.as_deref(),
        form.note.as_deref(),
        "cancel",
    ) {
        Ok(checked) => checked,
        Err((status, message)) => return refuse(status, message).await,
    };
    if view.revision != expected {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "refused: the run moved on since this page was rendered (revision {expected}, now {}, {}); nothing was written. Look again",
                view.revision, view.status
            ),
        )
        .await;
    }
    // If we crash here nothing was written; after the call the run is
    // cancelled with its event.
    let outcome =
        match acts::cancel(&state.sources.operator, run, &viewer.actor(), Some(&note)).await {
            Ok(outcome) => outcome,
            Err(ActError::NoOperatorRole(why)) => {
                return refuse(StatusCode::SERVICE_UNAVAILABLE, format!("refused: {why}")).await;
            }
            Err(ActError::NothingToRetry(why)) => {
                return refuse(StatusCode::CONFLICT, format!("refused: {why}")).await;
            }
            Err(ActError::Ledger(error)) => return Err(error.into()),
        };
    match outcome.into_result() {
        Ok(_) => Ok(Redirect::to(&format!("/console/runs/{run}?done=cancelled")).into_response()),
        Err(rejection) => {
            refuse(
                StatusCode::CONFLICT,
                format!("refused: {rejection}; nothing was written"),
            )
            .await
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ResolveForm {
    revision: Option<String>,
    outcome: Option<String>,
    remote_id: Option<String>,
    note: Option<String>,
    form_token: Option<String>,
}

/// The resolve form's checks, in order: its token and revision
/// ([`form_revision`]), the outcome, the note; the revision, settlement and
/// note, or the refusal.
fn checked_resolution(
    state: &ConsoleState,
    viewer: &Viewer,
    form: &ResolveForm,
) -> Result<(i64, Settlement, String), (StatusCode, String)> {
    let expected = form_revision(
        state,
        viewer,
        form.form_token.as_deref(),
        form.revision.as_deref(),
    )?;
    let Some(settlement) = form.outcome.as_deref().and_then(acts::settlement) else {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "refused: outcome {:?} is not \"succeeded\" or \"failed_final\"; nothing was written",
                form.outcome.as_deref().unwrap_or("")
            ),
        ));
    };
    let note = required_note(form.note.as_deref(), "resolution")
        .map_err(|message| (StatusCode::UNPROCESSABLE_ENTITY, message))?;
    Ok((expected, settlement, note))
}

pub(super) async fn resolve_operation(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<ResolveForm>,
) -> PageResult {
    let id = operation_id(&raw)?;
    let asked = || Asked {
        outcome: form.outcome.clone(),
        remote_id: form.remote_id.clone(),
        note: form.note.clone(),
    };
    let refuse = |status: StatusCode, message: String| {
        let asked = asked();
        let state = state.clone();
        let raw = raw.clone();
        let viewer = &viewer;
        async move {
            operation_response(
                &state,
                viewer,
                &raw,
                None,
                Some((status, message)),
                Some(asked),
            )
            .await
        }
    };
    let ledger = &state.sources.ledger;
    if let Some(own) = viewer.tenant()
        && ledger.operation_tenant(&id).await?.as_deref() != Some(own)
    {
        return Err(Problem::not_found("operation"));
    }
    let (expected, settlement, note) = match checked_resolution(&state, &viewer, &form) {
        Ok(checked) => checked,
        Err((status, message)) => return refuse(status, message).await,
    };
    let remote_id = blank(&form.remote_id);
    let actor = viewer.actor();
    // One ledger call: the revision the page was rendered at is the
    // compare-and-swap's expected value (invariant 2). If we crash before
    // it nothing was written; after it, the operation is settled with the
    // operator's evidence and event.
    let resolution = acts::Resolution {
        operation_id: &id,
        expected_revision: expected,
        settlement,
        remote_id,
        result: None,
        actor: &actor,
        note: &note,
        evidence: &serde_json::json!({"via": "console"}),
    };
    let outcome = match acts::resolve(&state.sources.operator, resolution).await {
        Ok(outcome) => outcome,
        Err(ActError::NoOperatorRole(why)) => {
            return refuse(StatusCode::SERVICE_UNAVAILABLE, format!("refused: {why}")).await;
        }
        Err(ActError::NothingToRetry(why)) => {
            return refuse(StatusCode::CONFLICT, format!("refused: {why}")).await;
        }
        Err(ActError::Ledger(LedgerError::InvalidInput(invalid))) => {
            return refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("refused: {invalid}; nothing was written"),
            )
            .await;
        }
        Err(ActError::Ledger(error)) => return Err(error.into()),
    };
    match outcome {
        ConvergeOutcome::Converged { .. } => {
            Ok(Redirect::to(&format!("/console/operations/{}?done=resolved", pages::path_segment(id.as_str()))).into_response())
        }
        ConvergeOutcome::NotUnknown(found) => {
            refuse(
                StatusCode::CONFLICT,
                format!(
                    "refused: the operation is {} (revision {}), no longer unknown; only unknown operations are resolved. Nothing was written",
                    found.status, found.revision
                ),
            )
            .await
        }
        // An operator's resolution needs no reconcile claim: `NotClaimed`
        // is only the application role's answer, read as "moved on".
        ConvergeOutcome::Conflict { .. } | ConvergeOutcome::NotClaimed(_) => {
            let now = ledger
                .operation_record(&id)
                .await?
                .map(|found| format!("now {} at revision {}", found.status, found.revision))
                .unwrap_or_default();
            refuse(
                StatusCode::CONFLICT,
                format!(
                    "refused: the operation moved on since this page was rendered (revision {expected}; {now}); nothing was written. Look again before resolving"
                ),
            )
            .await
        }
        ConvergeOutcome::NotFound => Err(Problem::not_found("operation")),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct RetryForm {
    revision: Option<String>,
    note: Option<String>,
    form_token: Option<String>,
}

pub(super) async fn retry_operation(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<RetryForm>,
) -> PageResult {
    let id = operation_id(&raw)?;
    let refuse = |status: StatusCode, message: String| {
        let state = state.clone();
        let raw = raw.clone();
        let viewer = &viewer;
        async move {
            operation_response(&state, viewer, &raw, None, Some((status, message)), None).await
        }
    };
    let ledger = &state.sources.ledger;
    if let Some(own) = viewer.tenant()
        && ledger.operation_tenant(&id).await?.as_deref() != Some(own)
    {
        return Err(Problem::not_found("operation"));
    }
    let (expected, note) = match checked_note_form(
        &state,
        &viewer,
        form.form_token.as_deref(),
        form.revision.as_deref(),
        form.note.as_deref(),
        "retry",
    ) {
        Ok(checked) => checked,
        Err((status, message)) => return refuse(status, message).await,
    };
    let found = ledger
        .operation_record(&id)
        .await?
        .ok_or_else(|| Problem::not_found("operation"))?;
    if found.revision != expected {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "refused: the operation moved on since this page was rendered (revision {expected}; now {} at revision {}); nothing was written. Look again",
                found.status, found.revision
            ),
        )
        .await;
    }
    // If we crash here nothing was written; after the call the budget is
    // reset with its event.
    let outcome = match acts::retry(
        &state.sources.operator,
        state.sources.tools.as_deref(),
        &id,
        &viewer.actor(),
        &note,
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(ActError::NoOperatorRole(why)) => {
            return refuse(StatusCode::SERVICE_UNAVAILABLE, format!("refused: {why}")).await;
        }
        Err(ActError::NothingToRetry(why)) => {
            return refuse(StatusCode::CONFLICT, format!("refused: {why}")).await;
        }
        Err(ActError::Ledger(error)) => return Err(error.into()),
    };
    match outcome {
        RetryResetOutcome::Reset(_) => Ok(Redirect::to(&format!(
            "/console/operations/{}?done=retry_reset",
            pages::path_segment(id.as_str())
        ))
        .into_response()),
        RetryResetOutcome::NotUnknown(found) => {
            refuse(
                StatusCode::CONFLICT,
                format!(
                    "refused: the operation is {}, no longer unknown; only unknown operations are retried. Nothing was written",
                    found.status
                ),
            )
            .await
        }
        RetryResetOutcome::NotFound => Err(Problem::not_found("operation")),
    }
}
