//! The console's HTML. Every value is interpolated by maud, which escapes
//! it; ids in URLs go through [`path_segment`]. Tables carry `data-*`
//! attributes and ids the browser tests select by.

use axum::http::StatusCode;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde_json::Value;

use super::page_data::{Asked, OperationQuery, Overview, RunQuery};
use crate::ledger::{
    LIST_LIMIT, LedgerEvent, OperationRecord, OperationRowSummary, OperationStatus, OperationView,
    RunRowSummary, RunView,
};

/// `text` percent-encoded for one URL path segment or query value.
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The page header's viewer: who, whether tokens are required (then a
/// logout form), and the logout form's token.
pub struct Banner {
    pub viewer: String,
    pub auth_required: bool,
    pub form_token: String,
}

fn layout(title: &str, banner: Option<&Banner>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · leasegate" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/console" { "leasegate" }
                    nav {
                        a href="/console" { "Overview" }
                        a href="/console/runs" { "Runs" }
                        a href="/console/operations" { "Operations" }
                        a href="/console/operations?status=unknown" { "Unknown" }
                    }
                    @if let Some(banner) = banner {
                        span.viewer #viewer { (banner.viewer) }
                        @if banner.auth_required {
                            form.inline method="post" action="/console/logout" {
                                input type="hidden" name="form_token" value=(banner.form_token);
                                button.link #logout type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

fn badge(status: &str) -> Markup {
    html! { span class=(format!("badge status-{status}")) data-status=(status) { (status) } }
}

fn time(at: &chrono::DateTime<chrono::Utc>) -> Markup {
    html! { time datetime=(at.to_rfc3339()) { (at.format("%Y-%m-%d %H:%M:%S%.3f UTC")) } }
}

fn age(seconds: f64) -> String {
    let seconds = seconds.max(0.0) as u64;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {}s", seconds / 60, seconds % 60),
        3600..86400 => format!("{}h {}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d {}h", seconds / 86400, seconds % 86400 / 3600),
    }
}

fn json_block(value: &Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    html! { pre.json { (text) } }
}

fn flash(done: Option<&str>, refused: Option<&str>) -> Markup {
    html! {
        @if let Some(message) = refused {
            div.flash.error #refused role="alert" { (message) }
        }
        @if let Some(done) = done {
            div.flash.ok #done role="status" {
                @match done {
                    "resolved" => "Resolved. The resolution, its note and who made it are in the history below.",
                    "retry_reset" => "Retry budget reset: the reconciler will retry with the same key.",
                    "cancelled" => "Run cancelled.",
                    other => (other),
                }
            }
        }
    }
}

fn operation_link(id: &str) -> Markup {
    html! { a.mono href=(format!("/console/operations/{}", path_segment(id))) { (id) } }
}

/// A long id (operation, run, step) as the lists show it: cut to its first
/// characters on screen (`code.id`), whole in its `title` and in its text,
/// so selecting it copies all of it.
fn short_id(id: &str) -> Markup {
    html! { code.id title=(id) { (id) } }
}

/// A list's link to a page named by a long id, shown as [`short_id`].
fn short_link(href: String, id: &str) -> Markup {
    html! { a href=(href) { (short_id(id)) } }
}

fn run_link(run: &str) -> Markup {
    html! { a.mono href=(format!("/console/runs/{}", path_segment(run))) { (run) } }
}

pub fn problem(status: StatusCode, message: &str) -> Markup {
    layout(
        status.canonical_reason().unwrap_or("error"),
        None,
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            div.flash.error #problem role="alert" { (message) }
            p { a href="/console" { "Back to the overview" } }
        },
    )
}

pub fn login(auth_required: bool, failed: Option<&str>, form_token: &str) -> Markup {
    layout(
        "Log in",
        None,
        html! {
            h1 { "Log in" }
            @if !auth_required {
                p { "This leasegate does not require tokens: " a href="/console" { "open the console" } "." }
            }
            @if let Some(reason) = failed {
                div.flash.error #login-failed role="alert" {
                    "That token was not accepted (" (reason) "). Use an operator token from "
                    code { "leasegate tokens create --scope operator" } "."
                }
            }
            form.card.narrow method="post" action="/console/login" {
                input type="hidden" name="form_token" value=(form_token);
                label for="token" { "Access token" }
                input #token type="password" name="token" autocomplete="off" placeholder="lgt_…" required;
                p.hint { "Checked on every page; this browser gets a console session (an HttpOnly, SameSite=Strict cookie) that logging out ends." }
                button #login type="submit" { "Log in" }
            }
        },
    )
}

pub fn overview(banner: &Banner, o: &Overview) -> Markup {
    let count_of = |status: &str| {
        o.counts
            .operations_by_status
            .iter()
            .find(|(s, _)| s == status)
            .map_or(0, |(_, n)| *n)
    };
    layout(
        "Overview",
        Some(banner),
        html! {
            h1 { "Overview" }
            section.tiles {
                div.tile.warn #unknown-count {
                    div.label { "Unknown operations" }
                    div.value { (o.unknown.count) }
                    div.sub {
                        @match (&o.unknown.oldest_operation_id, o.unknown.oldest_age_seconds) {
                            (Some(id), Some(seconds)) => { "oldest " (age(seconds)) ": " (short_link(format!("/console/operations/{}", path_segment(id.as_str())), id.as_str())) }
                            _ => "none waiting",
                        }
                    }
                }
                div.tile #needs-operator-count {
                    div.label { "Needs an operator" }
                    div.value { (o.needs_operator.len()) }
                    div.sub { "unknown, and the reconciler cannot settle them" }
                }
                div.tile #calls-per-second {
                    div.label { "Calls per second" }
                    div.value { @match o.calls_per_second { Some(rate) => (format!("{rate:.2}")), None => "—" } }
                    div.sub { @match o.calls_total { Some(total) => { (total) " agent calls since start; rate since the last load" } None => "no metrics" } }
                }
                div.tile #replays {
                    div.label { "Answered from the ledger" }
                    div.value { @match o.replays { Some((ended, waited)) => (ended + waited), None => "—" } }
                    div.sub { @match o.replays {
                        Some((_, waited)) => { "repeated calls the tool never saw again, since start (" (waited) " waited on the call in flight)" }
                        None => "no metrics"
                    } }
                }
                div.tile #takeovers {
                    div.label { "Lease takeovers" }
                    div.value { (o.counts.takeovers_last_hour) }
                    div.sub { "in the last hour (ledger)" @if let Some(total) = o.takeovers_total { "; " (total) " by this process" } }
                }
            }
            div.columns {
                section.card {
                    h2 { "Operations by status" }
                    table #operations-by-status {
                        tbody {
                            @for status in OperationStatus::ALL {
                                tr data-status=(status.as_str()) {
                                    td { a href=(format!("/console/operations?status={}", status.as_str())) { (badge(status.as_str())) } }
                                    td.num { (count_of(status.as_str())) }
                                }
                            }
                        }
                    }
                    h2 { "Runs by status" }
                    table #runs-by-status {
                        tbody {
                            @for (status, count) in &o.counts.runs_by_status {
                                tr { td { a href=(format!("/console/runs?status={}", path_segment(status))) { (badge(status)) } } td.num { (count) } }
                            }
                        }
                    }
                }
                section.card {
                    h2 { "Upstream health" }
                    @match &o.upstreams {
                        Some(Value::Array(upstreams)) if !upstreams.is_empty() => {
                            table #upstreams {
                                thead { tr { th { "upstream" } th { "state" } th { "since" } th { "restarts" } th { "last error" } } }
                                tbody {
                                    @for u in upstreams {
                                        tr {
                                            td { (u.get("name").and_then(Value::as_str).unwrap_or("?")) }
                                            td { (badge(u.get("state").and_then(Value::as_str).unwrap_or("?"))) }
                                            td.small { (u.get("since").and_then(Value::as_str).and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok()).map(|at| time(&at)).unwrap_or_default()) }
                                            td.num { (u.get("restarts").map(Value::to_string).unwrap_or_default()) }
                                            td.small { (u.get("last_error").and_then(Value::as_str).unwrap_or("")) }
                                        }
                                    }
                                }
                            }
                        }
                        Some(_) => p.muted { "No upstreams." },
                        None => p.muted { "Not known to this router." },
                    }
                    h2 { "Recent rejections by reason" }
                    p.hint { "Fenced writes refused (lease lost, stale epoch, …) and HTTP requests refused, since this process started." }
                    table #rejections {
                        tbody {
                            @for (reason, count) in &o.rejections {
                                tr { td { "write: " code { (reason) } } td.num { (count) } }
                            }
                            @for (reason, count) in &o.refusals {
                                tr { td { "http: " code { (reason) } } td.num { (count) } }
                            }
                            @if o.rejections.is_empty() && o.refusals.is_empty() {
                                tr { td.muted colspan="2" { "none" } }
                            }
                        }
                    }
                }
            }
            section.card {
                h2 { "Needs-operator queue" }
                @if o.needs_operator.is_empty() {
                    p.muted #needs-operator-empty { "Nothing waits for an operator." }
                } @else {
                    table #needs-operator {
                        thead { tr { th { "operation" } th { "tool" } th { "unknown for" } th { "why" } th {} } }
                        tbody {
                            @for (op, seconds, why) in &o.needs_operator {
                                tr data-operation=(op.operation_id.as_str()) {
                                    td { (operation_link(op.operation_id.as_str())) }
                                    td { code { (op.tool_name) } }
                                    td { (age(*seconds)) }
                                    td.small { (why) }
                                    td { a.button href=(format!("/console/operations/{}#resolve", path_segment(op.operation_id.as_str()))) { "Resolve" } }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub fn runs(banner: &Banner, q: &RunQuery, rows: &[RunRowSummary]) -> Markup {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    layout(
        "Runs",
        Some(banner),
        html! {
            h1 { "Runs" }
            form.filters method="get" action="/console/runs" {
                label { "task " input name="task" value=(value(&q.task)) placeholder="substring"; }
                label { "run id " input name="run_id" value=(value(&q.run_id)) placeholder="uuid"; }
                label { "status "
                    select name="status" {
                        option value="" { "any" }
                        @for s in ["pending", "running", "succeeded", "failed", "cancelled"] {
                            option value=(s) selected[q.status.as_deref() == Some(s)] { (s) }
                        }
                    }
                }
                button type="submit" { "Search" }
            }
            table #runs.list {
                thead { tr { th { "run" } th { "task" } th { "attempt" } th { "status" } th { "revision" } th { "lease" } th { "operations" } th { "changed" } } }
                tbody {
                    @for r in rows {
                        tr data-run=(r.run_id.to_string()) {
                            td { (run_link(&r.run_id.to_string())) }
                            td { (r.task_id) }
                            td.num { (r.attempt) }
                            td { (badge(&r.status)) }
                            td.num { (r.revision) }
                            td.small {
                                @match &r.lease_owner {
                                    Some(owner) => { (owner) " · epoch " (r.lease_epoch) @if r.lease_expired { " · " span.badge.status-expired { "expired" } } }
                                    None => { "free · epoch " (r.lease_epoch) }
                                }
                            }
                            td.num { (r.operations) @if r.unknown > 0 { " (" span.warn-text { (r.unknown) " unknown" } ")" } }
                            td.small { (time(&r.updated_at)) }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.muted #no-runs { "No runs match." } }
            @if rows.len() as i64 >= LIST_LIMIT { p.hint { "Showing the " (LIST_LIMIT) " most recently changed; narrow the search." } }
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    banner: &Banner,
    view: &RunView,
    events: &[LedgerEvent],
    operations: &[OperationRecord],
    form_token: &str,
    done: Option<&str>,
    refused: Option<&str>,
) -> Markup {
    let run = view.run_id.to_string();
    let live = matches!(view.status.as_str(), "pending" | "running");
    layout(
        &format!("Run {run}"),
        Some(banner),
        html! {
            h1 { "Run " span.mono #run-id { (run) } " " (badge(view.status.as_str())) }
            (flash(done, refused))
            div.columns {
                section.card {
                    h2 { "Run" }
                    dl #run-facts {
                        dt { "tenant" } dd { (view.tenant_id) }
                        dt { "task" } dd #run-task { (view.task_id) }
                        dt { "attempt" } dd { (view.attempt) @if view.active { " (the task's active run)" } }
                        dt { "status" } dd { (badge(view.status.as_str())) }
                        dt { "revision" } dd #run-revision { (view.revision) }
                        dt { "created" } dd { (time(&view.created_at)) }
                        dt { "changed" } dd { (time(&view.updated_at)) }
                    }
                }
                section.card {
                    h2 { "Lease" }
                    dl #lease {
                        dt { "owner" } dd #lease-owner { (view.lease.owner.as_deref().unwrap_or("— (free)")) }
                        dt { "epoch" } dd #lease-epoch { (view.lease.epoch) }
                        dt { "expires" } dd { (time(&view.lease.expires_at)) @if view.lease.expired { " " span.badge.status-expired { "expired" } } }
                    }
                    p.hint { "The lease's secret is never shown: the ledger keeps only its hash." }
                }
            }
            section.card {
                h2 { "Checkpoint" }
                (json_block(&view.checkpoint))
            }
            section.card {
                h2 { "Operations" }
                table #run-operations.list {
                    thead { tr { th { "operation" } th { "step" } th { "tool" } th { "status" } th { "revision" } } }
                    tbody {
                        @for op in operations {
                            tr data-operation=(op.operation_id.as_str()) {
                                td { (operation_link(op.operation_id.as_str())) }
                                td.step { (op.step_id) " v" (op.effect_version) }
                                td { code { (op.tool_name) } }
                                td { (badge(op.status.as_str())) }
                                td.num { (op.revision) }
                            }
                        }
                    }
                }
            }
            section.card {
                h2 { "Timeline" }
                (timeline(events, "timeline"))
            }
            @if live {
                section.card.danger #cancel {
                    h2 { "Cancel this run" }
                    form method="post" action=(format!("/console/runs/{}/cancel", path_segment(&run))) {
                        input type="hidden" name="revision" value=(view.revision);
                        input type="hidden" name="form_token" value=(form_token);
                        label for="cancel-note" { "Note (required)" }
                        textarea #cancel-note name="note" rows="2" required {}
                        button.danger #cancel-submit type="submit" data-confirm="Cancel this run?" { "Cancel run at revision " (view.revision) }
                    }
                }
            }
        },
    )
}

fn timeline(events: &[LedgerEvent], id: &str) -> Markup {
    html! {
        table.list id=(id) {
            thead { tr { th { "#" } th { "at" } th { "subject" } th { "change" } th { "by" } th { "epoch" } th { "revision" } th { "detail" } } }
            tbody {
                @for e in events {
                    tr data-event=(e.event_id) data-actor=(e.actor.as_deref().unwrap_or("")) {
                        td.num { (e.event_id) }
                        td.small { (time(&e.at)) }
                        td { (e.subject) @if let Some(op) = &e.operation_id { br; (operation_link(op)) } }
                        td { @if let Some(from) = &e.from_status { (badge(from)) " → " } (badge(&e.to_status)) }
                        td { (e.actor_kind) @if let Some(actor) = &e.actor { br; code.actor { (actor) } } }
                        td.num { (e.epoch.map(|v| v.to_string()).unwrap_or_default()) }
                        td.num { (e.revision.map(|v| v.to_string()).unwrap_or_default()) }
                        td.small { @if e.detail.as_object().is_some_and(|d| !d.is_empty()) { code.detail { (e.detail.to_string()) } } }
                    }
                }
            }
        }
    }
}

pub fn operations(banner: &Banner, q: &OperationQuery, rows: &[OperationRowSummary]) -> Markup {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    layout(
        "Operations",
        Some(banner),
        html! {
            h1 { "Operations" }
            form.filters method="get" action="/console/operations" {
                label { "status "
                    select name="status" {
                        option value="" { "any" }
                        @for s in OperationStatus::ALL {
                            option value=(s.as_str()) selected[q.status.as_deref() == Some(s.as_str())] { (s.as_str()) }
                        }
                    }
                }
                label { "tool " input name="tool" value=(value(&q.tool)); }
                label { "upstream " input name="upstream" value=(value(&q.upstream)); }
                label { "run " input name="run_id" value=(value(&q.run_id)) placeholder="uuid"; }
                label { "unchanged for at least " input name="older_than" value=(value(&q.older_than)) placeholder="5m" size="6"; }
                button type="submit" { "Filter" }
            }
            table #operations.list {
                thead { tr { th { "operation" } th { "run" } th { "step" } th { "tool" } th { "upstream" } th { "status" } th { "revision" } th { "unchanged for" } } }
                tbody {
                    @for row in rows {
                        @let op = &row.operation;
                        tr data-operation=(op.operation_id.as_str()) data-status=(op.status.as_str()) {
                            @let id = op.operation_id.as_str();
                            @let run = op.run_id.to_string();
                            td.operation { (short_link(format!("/console/operations/{}", path_segment(id)), id)) }
                            td.run { (short_link(format!("/console/runs/{}", path_segment(&run)), &run)) }
                            td.step { (short_id(&op.step_id)) " v" (op.effect_version) }
                            td { code { (op.tool_name) } }
                            td { (op.route.as_ref().map(|r| r.upstream.as_str()).unwrap_or("—")) }
                            td { (badge(op.status.as_str())) }
                            td.num { (op.revision) }
                            td.small { (age(row.age_seconds)) }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.muted #no-operations { "No operations match." } }
            @if rows.len() as i64 >= LIST_LIMIT { p.hint { "Showing the " (LIST_LIMIT) " most recently changed; narrow the filter." } }
        },
    )
}

pub struct OperationPage<'a> {
    pub view: &'a OperationView,
    pub reconcile_attempts: Option<i32>,
    /// Why resetting the retry budget can change nothing (`None`: it can, or
    /// not judged): the retry action is not offered then.
    pub no_retry: Option<&'static str>,
    pub plan: Option<(&'static str, String)>,
    pub form_token: String,
    pub done: Option<&'a str>,
    pub refused: Option<&'a str>,
    pub asked: Asked,
}

pub fn operation(banner: &Banner, page: &OperationPage<'_>) -> Markup {
    let view = page.view;
    let op = &view.operation;
    let id = op.operation_id.as_str();
    let unknown = op.status == OperationStatus::Unknown;
    let attempts = &view.claims;
    let asked = &page.asked;
    layout(
        &format!("Operation {id}"),
        Some(banner),
        html! {
            h1 { "Operation " (badge(op.status.as_str())) }
            p.mono.big #operation-id { (id) }
            (flash(page.done, page.refused))
            div.columns {
                section.card {
                    h2 { "Identity" }
                    dl #identity {
                        dt { "operation id" } dd.mono { (id) }
                        dt { "run" } dd { (run_link(&op.run_id.to_string())) }
                        dt { "step" } dd #step { (op.step_id) }
                        dt { "effect version" } dd { (op.effect_version) }
                        dt { "tool" } dd { code { (op.tool_name) } @if let Some(route) = &op.route { " → " (route.upstream) " / " code { (route.tool) } } }
                        dt { "request digest" } dd.mono.small { (op.request_digest.as_str()) }
                        dt { "status" } dd #status { (badge(op.status.as_str())) }
                        dt { "revision" } dd #revision { (op.revision) }
                        dt { "dispatches" } dd { (op.dispatch_count) }
                        dt { "retry budget spent" } dd { (page.reconcile_attempts.map(|n| n.to_string()).unwrap_or_default()) }
                        @if let Some(owner) = &op.dispatch_owner { dt { "claim" } dd { (owner) @if let Some(until) = &op.dispatch_until { " until " (time(until)) } } }
                        dt { "remote id" } dd #remote-id { (op.remote_id.as_deref().unwrap_or("—")) }
                        dt { "created" } dd { (time(&view.created_at)) }
                        dt { "changed" } dd { (time(&view.updated_at)) }
                        @if let Some(by) = &view.superseded_by { dt { "superseded by" } dd { (operation_link(by.as_str())) } }
                    }
                }
                section.card #next-step {
                    h2 { "What the reconciler plans next" }
                    @match (&page.plan, unknown) {
                        (Some((step, why)), _) => {
                            p { span class=(format!("badge plan-{step}")) #plan-step { (step) } }
                            p #plan-why { (why) }
                            p.hint { "Read-only: computed now by the reconciler's decision function from the evidence on record; nothing was run." }
                        }
                        (None, true) => p.muted { "The planner is not available on this router." },
                        (None, false) => p.muted #plan-none { "Nothing: the operation is " (op.status.as_str()) "." },
                    }
                }
            }
            div.columns {
                section.card {
                    h2 { "Request" }
                    p.hint { "As the ledger stores it under the policy's body rules (masked fields stay masked; sealed bodies are opened)." }
                    div #request { (json_block(&view.request_body)) }
                }
                section.card {
                    h2 { "Result" }
                    div #result {
                        @match &op.result { Some(result) => (json_block(result)), None => p.muted { "No result recorded." } }
                    }
                }
            }
            section.card {
                h2 { "Dispatch attempts" }
                @if attempts.is_empty() { p.muted { "Never dispatched." } } @else {
                    table #attempts.list {
                        thead { tr { th { "#" } th { "at" } th { "by" } th { "for" } th { "epoch" } th { "revision" } th { "ended" } } }
                        tbody {
                            @for (n, c) in attempts.iter().enumerate() {
                                tr { td.num { (c.dispatch_count.unwrap_or(n as i64 + 1)) } td.small { @if let Some(at) = &c.at { (time(at)) } } td { "dispatcher " code { (c.dispatch_owner.as_deref().unwrap_or("")) } } td { @if let Some(worker) = &c.worker { code { (worker) } } @else { "outbox" } } td.num { (c.epoch.map(|v| v.to_string()).unwrap_or_default()) } td.num { (c.revision.map(|v| v.to_string()).unwrap_or_default()) } td { @match &c.ended { Some(to) => (badge(to)), None => "in flight" } } }
                            }
                        }
                    }
                }
            }
            section.card {
                h2 { "Evidence" }
                @if view.evidence.is_empty() { p.muted { "No evidence." } } @else {
                    table #evidence.list {
                        thead { tr { th { "#" } th { "at" } th { "kind" } th { "source" } th { "outcome" } th { "remote id" } th { "body" } } }
                        tbody {
                            @for e in &view.evidence {
                                tr data-kind=(e.kind.as_str()) {
                                    td.num { (e.evidence_id) }
                                    td.small { (time(&e.at)) }
                                    td { (e.kind.as_str()) }
                                    td { code { (e.source) } }
                                    td { @if let Some(outcome) = &e.outcome { (badge(outcome)) } }
                                    td { (e.remote_id.as_deref().unwrap_or("")) }
                                    td.small { code.detail { (e.body.to_string()) } }
                                }
                            }
                        }
                    }
                }
            }
            section.card {
                h2 { "History" }
                (timeline(&view.events, "history"))
            }
            @if unknown {
                section.card.action #resolve {
                    h2 { "Resolve" }
                    p.hint { "You checked the tool's side: say what happened. Refused if the operation changes before you submit (this form is for revision " (op.revision) ")." }
                    form #resolve-form method="post" action=(format!("/console/operations/{}/resolve", path_segment(id))) {
                        input type="hidden" name="revision" value=(op.revision);
                        input type="hidden" name="form_token" value=(page.form_token);
                        fieldset {
                            legend { "Outcome" }
                            label { input type="radio" name="outcome" value="succeeded" #outcome-succeeded checked[asked.outcome.as_deref() == Some("succeeded")]; " succeeded" }
                            label { input type="radio" name="outcome" value="failed_final" #outcome-failed checked[asked.outcome.as_deref() == Some("failed_final")]; " failed_final" }
                        }
                        label for="remote-id-input" { "Remote id (optional)" }
                        input #remote-id-input name="remote_id" value=(asked.remote_id.clone().unwrap_or_default());
                        label for="note" { "Note (required)" }
                        textarea #note name="note" rows="3" { (asked.note.clone().unwrap_or_default()) }
                        button #resolve-submit type="submit" { "Resolve" }
                    }
                }
                @if let Some(why) = page.no_retry {
                    section.card #no-retry {
                        h2 { "Retry" }
                        p.hint { "Not offered: " (why) "." }
                    }
                } @else {
                section.card.action #retry {
                    h2 { "Retry" }
                    p.hint { "Starts the same-key retry budget over (after the upstream was fixed): the reconciler tries again under the same operation id." }
                    form #retry-form method="post" action=(format!("/console/operations/{}/retry", path_segment(id))) {
                        input type="hidden" name="revision" value=(op.revision);
                        input type="hidden" name="form_token" value=(page.form_token);
                        label for="retry-note" { "Note (required)" }
                        textarea #retry-note name="note" rows="2" {}
                        button #retry-submit type="submit" { "Reset the retry budget" }
                    }
                }
                }
            }
            (PreEscaped(""))
        },
    )
}
