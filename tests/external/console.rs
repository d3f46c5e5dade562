//! The web console in a real headless Chromium, driven
//! through WebDriver, against a real `leasegate serve` process with tokens
//! required and a real ledger holding runs and operations (one unknown):
//!
//! * an operator logs in with a token (HttpOnly cookie) and the overview,
//!   the run's page (lease owner and epoch, never the lease secret; the
//!   timeline) and the operation's page (identity, request, evidence, what
//!   the reconciler plans next) show what the ledger holds;
//! * a resolution without a note is refused and writes nothing; a
//!   resolution whose page is stale (the operation's revision moved on) is
//!   refused with a clear message and writes nothing; a resolution made in
//!   the browser is in the ledger with its note and its actor (the token);
//! * without authentication (the loopback default) there is no login, the
//!   actor is the local operator: a retry and a cancel made in the browser
//!   are in the ledger with that actor and their notes, a stale cancel is
//!   refused, and a form posted from a foreign origin is refused (403) with
//!   nothing written;
//! * an operator of another tenant sees nothing of this tenant (pages are
//!   "no such …", lists and counts are empty) and cannot resolve it; an
//!   agent token is refused the console; no cookie → the login page.
//!
//! With `LEASEGATE_CONSOLE_SCREENSHOTS=<dir>` the test also writes the
//! README's screenshots there (`docs/console/`).

use crate::common;
use crate::common::intents;
use crate::common::tokens::{create_token, token_id};

use common::TestDb;
use common::proxy::{Scenario, ServedChild};
use common::webdriver::Browser;
use leasegate::ledger::{RunId, UnknownCause};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Everything tenant data is made of, as one digest: equal before and
/// after means nothing was written.
async fn fingerprint(db: &TestDb) -> String {
    db.tables_digest(&[
        "agent_runs",
        "worker_leases",
        "tool_operations",
        "ledger_events",
        "operation_evidence",
    ])
    .await
}

async fn screenshot(browser: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("LEASEGATE_CONSOLE_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        browser
            .screenshot(&std::path::Path::new(&dir).join(format!("{name}.png")))
            .await;
    }
}

async fn log_in(browser: &Browser, control: &str, token: &str) {
    browser.goto(&format!("{control}/console")).await;
    // No cookie yet: the login page.
    browser.find("#token").await;
    assert!(browser.url().await.contains("/console/login"));
    browser.type_into("#token", token).await;
    browser.click("#login").await;
    browser.find("#unknown-count").await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_operator_sees_the_fate_of_calls_and_resolves_an_unknown_one_in_the_browser(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let scenario = Scenario::new(&db.url, "background = false\n");
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        format!("{config}\n[auth]\nmode = \"required\"\n"),
    )
    .unwrap();

    // The ledger: a running run with an email whose outcome is unknown (the
    // mailer cannot be asked: the reconciler needs an operator), a run whose
    // charge succeeded, and a run of another tenant.
    let (lease, _) = db.running_run("worker-7", 600_000).await;
    let email = intents::unplanned(
        lease.run_id,
        "mailer__send_email",
        &json!({"to": "ada@example.com", "subject": "invoice 42"}),
    );
    let claim = db.claim(&lease, &email, "proxy-1", 30_000).await;
    db.holder_marks_unknown(
        &claim,
        UnknownCause::TimedOut,
        &json!({"error": "timed out after 700ms"}),
    )
    .await;
    let unknown_id = email.operation_id.as_str().to_owned();
    let (paid, _) = db.running_run("worker-8", 600_000).await;
    let charge = intents::unplanned_charge(paid.run_id, 1200, "EUR");
    let charged = db.claim(&paid, &charge, "proxy-1", 30_000).await;
    db.settle_succeeded(&charged, Some("ch_1"), &json!({"charge_id": "ch_1"}))
        .await;
    let other_run = RunId::generate();
    db.ledger
        .run_create(other_run, "tenant-b", "their-task", None)
        .await
        .unwrap();
    let lease_secret: String = db
        .scalar(
            "SELECT encode(token_sha256, 'hex') FROM worker_leases WHERE run_id = $1",
            lease.run_id.as_uuid(),
        )
        .await;

    let operator = create_token(&db, "tenant-a", "operator", Some("console-test")).await;
    let intruder = create_token(&db, "tenant-b", "operator", Some("console-test")).await;
    let agent = create_token(&db, "tenant-a", "agent", Some("console-test")).await;
    let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    let control = served.control.clone();
    let browser = Browser::start().await;

    // An agent token does not open the console (it shows bodies); a
    // request without a token is sent to the login page.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = client
        .get(format!("{control}/console"))
        .header("authorization", format!("Bearer {agent}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    assert!(
        answer
            .text()
            .await
            .unwrap()
            .contains("needs an operator or admin token")
    );
    let answer = client
        .get(format!("{control}/console/operations"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303);
    assert!(
        answer.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/console/login")
    );

    // A token that is not one: back to the login page, saying so.
    browser.goto(&format!("{control}/console")).await;
    browser
        .type_into("#token", "lgt_0000000000000000_nope")
        .await;
    browser.click("#login").await;
    assert!(browser.text("#login-failed").await.contains("not accepted"));

    // The operator logs in; the overview counts this tenant's operations.
    log_in(&browser, &control, &operator).await;
    assert_eq!(browser.text("#unknown-count .value").await, "1");
    assert!(
        browser
            .text("#unknown-count .sub")
            .await
            .contains(&unknown_id)
    );
    assert_eq!(
        browser
            .text("#operations-by-status tr[data-status=succeeded] td.num")
            .await,
        "1"
    );
    let queue = browser.text("#needs-operator").await;
    assert!(queue.contains(&unknown_id), "{queue}");
    assert!(queue.contains("no_capability"), "{queue}");
    assert!(browser.text("#upstreams").await.contains("mailer"));
    assert!(browser.text("#viewer").await.contains(token_id(&operator)));
    screenshot(&browser, "overview").await;

    // The operations list: long ids cut on screen, whole in their title
    // and text (selecting one copies all of it).
    browser.goto(&format!("{control}/console/operations")).await;
    let row = format!("#operations tr[data-operation='{unknown_id}']");
    for (cell, full) in [
        ("td.operation code.id", unknown_id.clone()),
        ("td.run code.id", lease.run_id.to_string()),
        ("td.step code.id", email.step_id.clone()),
    ] {
        let css = format!("{row} {cell}");
        assert_eq!(browser.attribute(&css, "title").await, full, "{cell}");
        assert_eq!(browser.text(&css).await, full, "{cell}");
        assert!(browser.is_clipped(&css).await, "{cell} is shown whole");
    }
    screenshot(&browser, "operations").await;

    // Runs: search by task; the run's page shows the lease and the
    // timeline, never the lease secret.
    let task: String = db
        .scalar(
            "SELECT task_id FROM agent_runs WHERE run_id = $1",
            lease.run_id.as_uuid(),
        )
        .await;
    browser
        .goto(&format!("{control}/console/runs?task={task}"))
        .await;
    assert_eq!(browser.count("#runs tbody tr").await, 1);
    browser
        .click(&format!("#runs tr[data-run='{}'] a", lease.run_id))
        .await;
    assert_eq!(browser.text("#lease-owner").await, "worker-7");
    assert_eq!(browser.text("#lease-epoch").await, "1");
    assert_eq!(browser.text("#run-task").await, task);
    let events: i64 = db.event_count(lease.run_id).await;
    assert_eq!(browser.count("#timeline tbody tr").await as i64, events);
    assert!(events >= 4, "run, lease and operation events: {events}");
    let page = browser.source().await;
    assert!(!page.contains(&lease_secret) && !page.contains("token_sha256"));
    screenshot(&browser, "run").await;

    // The operation's page: identity, request, evidence, the plan.
    browser
        .click(&format!(
            "#run-operations tr[data-operation='{unknown_id}'] a"
        ))
        .await;
    assert_eq!(browser.text("#operation-id").await, unknown_id);
    assert_eq!(browser.text("#step").await, email.step_id);
    assert!(browser.text("#request").await.contains("ada@example.com"));
    assert_eq!(browser.text("#plan-step").await, "needs_operator");
    assert!(browser.text("#history").await.contains("unknown"));
    assert_eq!(browser.count("#attempts tbody tr").await, 1);
    let rendered_revision: i64 = browser.text("#revision").await.parse().unwrap();
    // The mailer promises nothing: no retry can follow, so none is offered;
    // resolving is.
    assert!(browser.exists("#resolve-form").await);
    assert!(!browser.exists("#retry-form").await);
    assert!(
        browser.text("#no-retry").await.contains("Not offered"),
        "{}",
        browser.text("#no-retry").await
    );
    screenshot(&browser, "operation").await;

    // No note: refused, nothing written.
    let before = fingerprint(&db).await;
    browser.click("#outcome-succeeded").await;
    browser.type_into("#remote-id-input", "msg_77").await;
    browser.click("#resolve-submit").await;
    assert!(
        browser.text("#refused").await.contains("needs a note"),
        "{}",
        browser.text("#refused").await
    );
    assert_eq!(
        fingerprint(&db).await,
        before,
        "a refused resolution writes nothing"
    );

    // Stale: another operator acts while this page is open.
    browser
        .goto(&format!("{control}/console/operations/{unknown_id}"))
        .await;
    browser.click("#outcome-succeeded").await;
    browser.type_into("#remote-id-input", "msg_77").await;
    browser
        .type_into("#note", "checked the mail provider: delivered as msg_77")
        .await;
    browser.scroll_to("#resolve").await;
    screenshot(&browser, "resolve").await;
    db.operator
        .operation_reconcile_reset(&email.operation_id, "someone-else", "retry it")
        .await
        .unwrap();
    let before = fingerprint(&db).await;
    browser.click("#resolve-submit").await;
    let refused = browser.text("#refused").await;
    assert!(
        refused.contains("moved on") && refused.contains(&format!("revision {rendered_revision}")),
        "{refused}"
    );
    assert_eq!(
        fingerprint(&db).await,
        before,
        "a stale resolution writes nothing"
    );
    let status: String = db
        .scalar(
            "SELECT status FROM tool_operations WHERE operation_id = $1",
            &unknown_id,
        )
        .await;
    assert_eq!(status, "unknown");

    // Look again, resolve: in the ledger with its note and who did it.
    browser
        .goto(&format!("{control}/console/operations/{unknown_id}"))
        .await;
    browser.click("#outcome-succeeded").await;
    browser.type_into("#remote-id-input", "msg_77").await;
    browser
        .type_into("#note", "checked the mail provider: delivered as msg_77")
        .await;
    browser.click("#resolve-submit").await;
    browser.find("#done").await;
    let (status, remote_id): (String, Option<String>) = db
        .row(
            "SELECT status, remote_id FROM tool_operations WHERE operation_id = $1",
            &unknown_id,
        )
        .await;
    assert_eq!(
        (status.as_str(), remote_id.as_deref()),
        ("succeeded", Some("msg_77"))
    );
    let (actor_kind, actor, note): (String, String, String) = db
        .row(
            "SELECT actor_kind, actor, detail->>'note' FROM ledger_events
          WHERE operation_id = $1 AND to_status = 'succeeded'",
            &unknown_id,
        )
        .await;
    assert_eq!(actor_kind, "operator");
    assert_eq!(actor, format!("token:{}", token_id(&operator)));
    assert_eq!(note, "checked the mail provider: delivered as msg_77");
    let operator_evidence: i64 = db
        .scalar(
            "SELECT count(*) FROM operation_evidence WHERE operation_id = $1 AND kind = 'operator'
            AND body->>'note' = 'checked the mail provider: delivered as msg_77'",
            &unknown_id,
        )
        .await;
    assert_eq!(operator_evidence, 1);
    assert!(
        browser
            .text("#history")
            .await
            .contains(&format!("token:{}", token_id(&operator)))
    );
    assert_eq!(browser.text("#status").await, "succeeded");

    // Another tenant's operator: sees nothing of tenant-a, resolves nothing.
    browser.click("header form button").await;
    log_in(&browser, &control, &intruder).await;
    assert_eq!(browser.text("#unknown-count .value").await, "0");
    assert!(browser.exists("#needs-operator-empty").await);
    browser.goto(&format!("{control}/console/runs")).await;
    assert_eq!(browser.count("#runs tbody tr").await, 1);
    assert!(
        browser
            .exists(&format!("#runs tr[data-run='{other_run}']"))
            .await
    );
    browser.goto(&format!("{control}/console/operations")).await;
    assert!(browser.exists("#no-operations").await);
    for path in [
        format!("/console/operations/{unknown_id}"),
        format!("/console/runs/{}", lease.run_id),
    ] {
        browser.goto(&format!("{control}{path}")).await;
        assert!(
            browser.text("#problem").await.starts_with("no such"),
            "{path}"
        );
        assert!(
            !browser.source().await.contains("ada@example.com"),
            "{path}"
        );
    }
    let before = fingerprint(&db).await;
    let answer = client
        .post(format!("{control}/console/runs/{}/cancel", lease.run_id))
        .header("authorization", format!("Bearer {intruder}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("revision=0&note=mine&form_token=x")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
    assert_eq!(
        fingerprint(&db).await,
        before,
        "another tenant writes nothing"
    );

    browser.quit().await;
    let mut child = served.child;
    child.start_kill().unwrap();
    common::within("leasegate serve to exit", child.wait())
        .await
        .unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn without_authentication_the_local_operator_retries_and_cancels_and_stale_or_foreign_forms_are_refused(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let scenario = Scenario::new(&db.url, "background = false\n");
    let (lease, _) = db.running_run("worker-1", 600_000).await;
    let charge = intents::unplanned_charge(lease.run_id, 500, "EUR");
    let claim = db.claim(&lease, &charge, "proxy-1", 30_000).await;
    db.holder_marks_unknown(
        &claim,
        UnknownCause::TimedOut,
        &json!({"error": "timed out"}),
    )
    .await;
    let id = charge.operation_id.as_str().to_owned();
    let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    let control = served.control.clone();
    let browser = Browser::start().await;

    // No login: the console opens as the local operator.
    browser.goto(&format!("{control}/console")).await;
    assert_eq!(browser.text("#viewer").await, "local operator");
    assert_eq!(browser.text("#unknown-count .value").await, "1");

    // The charge can be retried with its key: the reconciler's plan says so.
    browser
        .goto(&format!("{control}/console/operations/{id}"))
        .await;
    assert_eq!(browser.text("#plan-step").await, "retry_same_key");
    browser
        .type_into("#retry-note", "the payment provider is back")
        .await;
    browser.click("#retry-submit").await;
    assert!(browser.text("#done").await.contains("Retry budget reset"));
    let (actor, note): (String, String) = db
        .row(
            "SELECT actor, detail->>'note' FROM ledger_events
          WHERE operation_id = $1 AND detail ? 'retry_budget_reset'",
            &id,
        )
        .await;
    assert_eq!(
        (actor.as_str(), note.as_str()),
        ("local-operator", "the payment provider is back")
    );

    // A form posted from another origin (a rebinding or hostile page): 403
    // before any handler, nothing written.
    let form_token = {
        browser
            .goto(&format!("{control}/console/runs/{}", lease.run_id))
            .await;
        let page = browser.source().await;
        page.split("name=\"form_token\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the cancel form's token")
            .to_owned()
    };
    let revision: i64 = browser.text("#run-revision").await.parse().unwrap();
    let before = fingerprint(&db).await;
    let answer = reqwest::Client::new()
        .post(format!("{control}/console/runs/{}/cancel", lease.run_id))
        .header("origin", "https://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "revision={revision}&note=gotcha&form_token={form_token}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    assert_eq!(
        fingerprint(&db).await,
        before,
        "a foreign form writes nothing"
    );

    // Stale: the worker checkpoints while the cancel form is open.
    browser
        .type_into("#cancel-note", "the customer withdrew the order")
        .await;
    let saved = db
        .ledger
        .checkpoint_save(&lease, revision, &json!({"step": 2}))
        .await
        .unwrap();
    assert!(saved.is_applied(), "{saved:?}");
    let before = fingerprint(&db).await;
    browser.click("#cancel-submit").await;
    browser.accept_dialog().await;
    let refused = browser.text("#refused").await;
    assert!(
        refused.contains("moved on") && refused.contains(&format!("revision {revision}")),
        "{refused}"
    );
    assert_eq!(
        fingerprint(&db).await,
        before,
        "a stale cancel writes nothing"
    );

    // Look again, cancel: in the ledger with the local operator and the note.
    browser
        .goto(&format!("{control}/console/runs/{}", lease.run_id))
        .await;
    browser
        .type_into("#cancel-note", "the customer withdrew the order")
        .await;
    browser.click("#cancel-submit").await;
    browser.accept_dialog().await;
    assert!(browser.text("#done").await.contains("cancelled"));
    let (status, actor, detail): (String, String, Value) = db
        .row(
            "SELECT r.status, e.actor, e.detail FROM agent_runs r
           JOIN ledger_events e ON e.run_id = r.run_id
          WHERE r.run_id = $1 AND e.subject = 'run' AND e.to_status = 'cancelled'",
            lease.run_id.as_uuid(),
        )
        .await;
    assert_eq!(
        (status.as_str(), actor.as_str()),
        ("cancelled", "local-operator")
    );
    assert!(
        detail
            .to_string()
            .contains("the customer withdrew the order"),
        "{detail}"
    );

    browser.quit().await;
    let mut child = served.child;
    child.start_kill().unwrap();
    common::within("leasegate serve to exit", child.wait())
        .await
        .unwrap();
}
