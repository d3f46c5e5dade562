//! The control HTTP API against a real PostgreSQL, driven without a socket
//! (`tower::ServiceExt::oneshot` on the router `leasegate serve` serves),
//! plus the OpenAPI document and the operator CLI.

use crate::common;
use crate::common::intents;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::TestDb;
use leasegate::control::ROUTES;
use leasegate::intent::IntegerPolicy;
use leasegate::ledger::{Ledger, UnknownCause};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

struct Api {
    ledger: Ledger,
    /// The operator routes' ledger (as `leasegate_operator`).
    operator: Ledger,
}

impl Api {
    /// The routes on `db`'s ledgers, as the application and operator roles.
    fn of(db: &TestDb) -> Self {
        Self {
            ledger: db.ledger.clone(),
            operator: db.operator.clone(),
        }
    }

    async fn send(&self, method: Method, path: &str, body: Option<&str>) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(
                body.map(|b| Body::from(b.to_owned()))
                    .unwrap_or_else(Body::empty),
            )
            .unwrap();
        let router = leasegate::control::with_metrics(
            leasegate::control::with_durability(
                leasegate::control::with_upstream_health(
                    leasegate::control::router_with_operator(
                        self.ledger.clone(),
                        self.operator.clone(),
                        IntegerPolicy::Reject,
                    ),
                    std::sync::Arc::new(|| json!([{"name": "payments", "state": "up"}])),
                ),
                std::sync::Arc::new(leasegate::durability::DurabilityGate::unchecked()),
            ),
            leasegate::app::metrics_handle(),
        );
        common::router::answer(router, request).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(&body.to_string())).await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, None).await
    }

    /// Creates a run, acquires its lease and starts it; (run_id, owner,
    /// epoch, revision, lease token).
    async fn running(&self, task: &str, owner: &str) -> (String, String, i64, i64, String) {
        let (status, run) = self
            .post(
                "/v1/runs",
                json!({"tenant_id": "tenant-a", "task_id": task}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{run}");
        let run_id = run["run_id"].as_str().unwrap().to_owned();
        let (status, lease) = self
            .post(
                &format!("/v1/runs/{run_id}/lease"),
                json!({"owner": owner, "ttl_ms": 30000}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{lease}");
        let epoch = lease["epoch"].as_i64().unwrap();
        let token = lease["lease_token"].as_str().unwrap().to_owned();
        let (status, started) = self
            .post(
                &format!("/v1/runs/{run_id}/start"),
                json!({"owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": 0}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{started}");
        (
            run_id,
            owner.to_owned(),
            epoch,
            started["revision"].as_i64().unwrap(),
            token,
        )
    }
}

fn code(answer: &Value) -> &str {
    answer["code"].as_str().unwrap_or("")
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn every_endpoint_answers_its_success_path(pool: PgPoolOptions, connect: PgConnectOptions) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);

    // Create (and replay), acquire with a generated owner, renew.
    let run_id = uuid::Uuid::now_v7().to_string();
    let body = json!({"tenant_id": "tenant-a", "task_id": "t1", "run_id": run_id});
    let (status, created) = api.post("/v1/runs", body.clone()).await;
    assert_eq!(
        (
            status,
            created["attempt"].clone(),
            created["status"].clone()
        ),
        (StatusCode::CREATED, json!(1), json!("pending"))
    );
    let (status, replay) = api.post("/v1/runs", body).await;
    assert_eq!(
        (status, replay["run_id"].as_str()),
        (StatusCode::OK, Some(run_id.as_str()))
    );
    let (status, lease) = api
        .post(
            &format!("/v1/runs/{run_id}/lease"),
            json!({"ttl_ms": 30000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let owner = lease["owner"].as_str().unwrap().to_owned();
    assert!(owner.starts_with("owner-"), "{lease}");
    let token = lease["lease_token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("lgl_"), "{lease}");
    assert_eq!(
        (lease["epoch"].clone(), lease["took_over"].clone()),
        (json!(1), json!(false))
    );
    let (status, renewed) = api
        .post(
            &format!("/v1/runs/{run_id}/lease/renew"),
            json!({"owner": owner, "epoch": 1, "lease_token": token, "ttl_ms": 30000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert!(renewed["expires_at"].as_str().unwrap() >= lease["expires_at"].as_str().unwrap());

    // Start, checkpoint with planned intents, read the run and its operations.
    let claim = json!({"owner": owner, "epoch": 1, "lease_token": token});
    let (status, started) = api
        .post(
            &format!("/v1/runs/{run_id}/start"),
            json!({"owner": owner, "epoch": 1, "lease_token": token, "expected_revision": 0}),
        )
        .await;
    assert_eq!(
        (
            status,
            started["run_status"].clone(),
            started["revision"].clone()
        ),
        (StatusCode::OK, json!("running"), json!(1))
    );
    let plan = json!({"owner": owner, "epoch": 1, "lease_token": token, "expected_revision": 1, "checkpoint": {"step": "charge"},
        "intents": [{"tool": "payments__charge", "arguments": {"amount": 5}, "step_id": "charge"}]});
    let (status, saved) = api
        .post(&format!("/v1/runs/{run_id}/checkpoint"), plan)
        .await;
    assert_eq!(status, StatusCode::OK, "{saved}");
    assert_eq!(saved["revision"], 2);
    let operation_id = saved["intents"][0]["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(saved["intents"][0]["status"], "prepared");
    let (status, run) = api.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            run["status"].clone(),
            run["revision"].clone(),
            run["checkpoint"].clone()
        ),
        (json!("running"), json!(2), json!({"step": "charge"}))
    );
    assert_eq!(
        (
            run["lease"]["owner"].as_str(),
            run["lease"]["epoch"].clone()
        ),
        (Some(owner.as_str()), json!(1))
    );
    let (status, listed) = api
        .get(&format!("/v1/runs/{run_id}/operations?status=prepared"))
        .await;
    assert_eq!(
        (status, listed["operations"].as_array().unwrap().len()),
        (StatusCode::OK, 1)
    );
    let (status, op) = api.get(&format!("/v1/operations/{operation_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            op["operation"]["tool_name"].clone(),
            op["request_body"].clone()
        ),
        (json!("payments__charge"), json!({"amount": 5}))
    );
    assert_eq!(op["events"][0]["to_status"], "prepared");
    let (status, summary) = api.get("/v1/operations/unknown").await;
    assert_eq!(
        (status, summary["count"].clone()),
        (StatusCode::OK, json!(0))
    );

    // Complete, release; fail and cancel on other runs.
    let (status, done) = api.post(&format!("/v1/runs/{run_id}/complete"), json!({"owner": owner, "epoch": 1, "lease_token": token, "expected_revision": 2, "checkpoint": {"done": true}})).await;
    assert_eq!(
        (status, done["run_status"].clone()),
        (StatusCode::OK, json!("succeeded"))
    );
    let (status, _) = api
        .post(&format!("/v1/runs/{run_id}/lease/release"), claim)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (other, other_owner, epoch, revision, other_token) = api.running("t2", "w2").await;
    let (status, failed) = api.post(&format!("/v1/runs/{other}/fail"), json!({"owner": other_owner, "epoch": epoch, "lease_token": other_token, "expected_revision": revision, "reason": "card declined"})).await;
    assert_eq!(
        (status, failed["run_status"].clone()),
        (StatusCode::OK, json!("failed"))
    );
    let (third, _, _, _, _) = api.running("t3", "w3").await;
    let (status, cancelled) = api
        .post(
            &format!("/v1/runs/{third}/cancel"),
            json!({"actor": "ops@example", "reason": "stop"}),
        )
        .await;
    assert_eq!(
        (status, cancelled["run_status"].clone()),
        (StatusCode::OK, json!("cancelled"))
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn documented_error_codes_come_with_their_http_status(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let (run_id, owner, epoch, revision, token) = api.running("task", "holder").await;
    let missing = uuid::Uuid::now_v7();

    let cases: Vec<(StatusCode, Value, &str)> = vec![
        {
            let (s, a) = api
                .post(
                    &format!("/v1/runs/{run_id}/lease"),
                    json!({"owner": "rival", "ttl_ms": 1000}),
                )
                .await;
            (s, a, "lease_busy")
        },
        {
            let (s, a) = api
                .post(
                    &format!("/v1/runs/{run_id}/lease/renew"),
                    json!({"owner": "rival", "epoch": epoch, "ttl_ms": 1000}),
                )
                .await;
            (s, a, "lease_lost")
        },
        {
            let (s, a) = api.post(&format!("/v1/runs/{run_id}/checkpoint"), json!({"owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": revision + 9, "checkpoint": {}})).await;
            (s, a, "revision_conflict")
        },
        {
            let (s, a) = api
                .post(
                    "/v1/runs",
                    json!({"tenant_id": "tenant-a", "task_id": "task"}),
                )
                .await;
            (s, a, "active_run_live")
        },
        {
            let (s, a) = api
                .post(
                    &format!("/v1/runs/{run_id}/start"),
                    json!({"owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": revision}),
                )
                .await;
            (s, a, "wrong_status")
        },
        {
            let (s, a) = api.get(&format!("/v1/runs/{missing}")).await;
            (s, a, "not_found")
        },
        {
            let (s, a) = api.get("/v1/operations/no-such-operation").await;
            (s, a, "not_found")
        },
        {
            let (s, a) = api
                .post(
                    &format!("/v1/runs/{run_id}/lease/renew"),
                    json!({"owner": owner, "epoch": epoch, "lease_token": token, "ttl_ms": 0}),
                )
                .await;
            (s, a, "invalid_ttl")
        },
        {
            // The current owner and epoch, read from GET /v1/runs, without
            // the token.
            let (s, a) = api
                .post(
                    &format!("/v1/runs/{run_id}/lease/renew"),
                    json!({"owner": owner, "epoch": epoch, "ttl_ms": 1000}),
                )
                .await;
            (s, a, "lease_token_invalid")
        },
        {
            let (s, a) = api.get("/v1/runs/12345").await;
            (s, a, "invalid_run_id")
        },
        {
            let (s, a) = api
                .get(&format!("/v1/runs/{run_id}/operations?status=lost"))
                .await;
            (s, a, "invalid_status")
        },
        {
            let (s, a) = api.get("/v1/nowhere").await;
            (s, a, "no_route")
        },
    ];
    for (status, answer, expected) in &cases {
        assert_eq!(code(answer), *expected, "{answer}");
        let want = match *expected {
            "not_found" | "no_route" => StatusCode::NOT_FOUND,
            "invalid_ttl" | "invalid_run_id" | "invalid_status" => StatusCode::UNPROCESSABLE_ENTITY,
            "lease_token_invalid" => StatusCode::FORBIDDEN,
            _ => StatusCode::CONFLICT,
        };
        assert_eq!(*status, want, "{answer}");
        assert!(
            !answer["message"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("select"),
            "no SQL leaks: {answer}"
        );
    }
    // Intent conflict: the same step planned with other arguments.
    let plan = |amount: i64, expected_revision: i64| {
        json!({"owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": expected_revision, "checkpoint": {},
               "intents": [{"tool": "payments__charge", "arguments": {"amount": amount}, "step_id": "s"}]})
    };
    assert_eq!(
        api.post(&format!("/v1/runs/{run_id}/checkpoint"), plan(1, revision))
            .await
            .0,
        StatusCode::OK
    );
    let (status, conflict) = api
        .post(
            &format!("/v1/runs/{run_id}/checkpoint"),
            plan(2, revision + 1),
        )
        .await;
    assert_eq!(
        (status, code(&conflict)),
        (StatusCode::CONFLICT, "intent_conflict"),
        "{conflict}"
    );
    assert_ne!(
        conflict["detail"]["expected_digest"],
        conflict["detail"]["found_digest"]
    );
    // Terminal run.
    api.post(
        &format!("/v1/runs/{run_id}/cancel"),
        json!({"actor": "ops"}),
    )
    .await;
    let (status, terminal) = api
        .post(
            &format!("/v1/runs/{run_id}/cancel"),
            json!({"actor": "ops"}),
        )
        .await;
    assert_eq!(
        (status, code(&terminal)),
        (StatusCode::CONFLICT, "terminal_run")
    );

    // The database goes away: 503, nothing leaks.
    db.ledger.close().await;
    let (status, down) = api.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        (status, code(&down)),
        (StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable"),
        "{down}"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_a_and_c_through_the_http_api(pool: PgPoolOptions, connect: PgConnectOptions) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let (run_id, owner, epoch, revision, token) = api.running("ac", "worker").await;
    let save = |expected: i64, n: i64| json!({"owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": expected, "checkpoint": {"n": n}});
    // A: sequential saves, revision +1 each.
    let (s1, a1) = api
        .post(&format!("/v1/runs/{run_id}/checkpoint"), save(revision, 1))
        .await;
    let (s2, a2) = api
        .post(
            &format!("/v1/runs/{run_id}/checkpoint"),
            save(revision + 1, 2),
        )
        .await;
    assert_eq!(
        (s1, a1["revision"].clone(), s2, a2["revision"].clone()),
        (
            StatusCode::OK,
            json!(revision + 1),
            StatusCode::OK,
            json!(revision + 2)
        )
    );
    // C: two concurrent saves with the same expected revision: one 200, one 409.
    let path = format!("/v1/runs/{run_id}/checkpoint");
    let (x, y) = tokio::join!(
        api.post(&path, save(revision + 2, 3)),
        api.post(&path, save(revision + 2, 4))
    );
    let mut statuses = vec![x.0, y.0];
    statuses.sort();
    assert_eq!(statuses, vec![StatusCode::OK, StatusCode::CONFLICT]);
    let loser = if x.0 == StatusCode::CONFLICT {
        &x.1
    } else {
        &y.1
    };
    assert_eq!(code(loser), "revision_conflict");
    let (_, run) = api.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["revision"], revision + 3);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn after_a_takeover_the_old_owner_gets_lease_lost_and_changes_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let (status, run) = api
        .post(
            "/v1/runs",
            json!({"tenant_id": "tenant-a", "task_id": "tk", "owner": "old", "ttl_ms": 200}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let old_token = run["lease_token"].as_str().unwrap().to_owned();
    api.post(
        &format!("/v1/runs/{run_id}/start"),
        json!({"owner": "old", "epoch": 1, "lease_token": old_token, "expected_revision": 0}),
    )
    .await;
    db.wait_lease_expired(leasegate::ledger::RunId::from_uuid(run_id.parse().unwrap()))
        .await;
    let (status, taken) = api
        .post(
            &format!("/v1/runs/{run_id}/lease"),
            json!({"owner": "new", "ttl_ms": 30000}),
        )
        .await;
    assert_eq!(
        (status, taken["epoch"].clone(), taken["took_over"].clone()),
        (StatusCode::OK, json!(2), json!(true))
    );
    let new_token = taken["lease_token"].as_str().unwrap().to_owned();
    assert_ne!(new_token, old_token);
    let (_, saved) = api.post(&format!("/v1/runs/{run_id}/checkpoint"), json!({"owner": "new", "epoch": 2, "lease_token": new_token, "expected_revision": 1, "checkpoint": {"by": "new"}})).await;
    let (_, before) = api.get(&format!("/v1/runs/{run_id}")).await;

    // The old owner's own (once valid) token does not bring its epoch back.
    for (path, body) in [
        (
            "lease/renew",
            json!({"owner": "old", "epoch": 1, "lease_token": old_token, "ttl_ms": 30000}),
        ),
        (
            "checkpoint",
            json!({"owner": "old", "epoch": 1, "lease_token": old_token, "expected_revision": 2, "checkpoint": {"by": "old"}}),
        ),
        (
            "complete",
            json!({"owner": "old", "epoch": 1, "lease_token": old_token, "expected_revision": 2}),
        ),
        (
            "lease/release",
            json!({"owner": "old", "epoch": 1, "lease_token": old_token}),
        ),
    ] {
        let (status, answer) = api.post(&format!("/v1/runs/{run_id}/{path}"), body).await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::CONFLICT, "lease_lost"),
            "{path}: {answer}"
        );
        assert_eq!(answer["detail"]["found"]["owner"], "new");
    }
    let (_, after) = api.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(after, before);
    assert_eq!(
        (after["revision"].clone(), after["checkpoint"].clone()),
        (saved["revision"].clone(), json!({"by": "new"}))
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn bad_input_gets_a_4xx_with_a_code_and_writes_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let huge = json!({"task_id": "x".repeat(2 * 1024 * 1024)}).to_string();
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        (
            "/v1/runs",
            "{\"task_id\": ".to_owned(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "/v1/runs",
            json!({"task_id": 42}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "/v1/runs",
            json!({"task_id": "t", "colour": "blue"}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "/v1/runs",
            json!({"task_id": "t", "run_id": "not-a-uuid"}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_run_id",
        ),
        (
            "/v1/runs",
            json!({"task_id": "t", "owner": "o"}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "/v1/runs",
            json!({"task_id": ""}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/runs",
            huge,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            "/v1/runs/not-a-uuid/lease",
            json!({"ttl_ms": 1000}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_run_id",
        ),
    ];
    for (path, body, status, expected) in cases {
        let (got, answer) = api.send(Method::POST, path, Some(&body)).await;
        assert_eq!(
            (got, code(&answer)),
            (status, expected),
            "{path} {}: {answer}",
            &body[..body.len().min(60)]
        );
    }
    let counts: (i64, i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM agent_tasks), (SELECT count(*) FROM agent_runs), (SELECT count(*) FROM ledger_events)",
        )
        .await;
    assert_eq!(counts, (0, 0, 0), "nothing written");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_openapi_document_matches_the_served_routes(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let document: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).unwrap(),
    )
    .unwrap();
    let mut documented = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let declared: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        documented, declared,
        "openapi.json and control::ROUTES differ"
    );
    // The web console's pages are HTML, not API: never in the document,
    // and each is served once the console is mounted (as `leasegate serve`
    // mounts it).
    let console = leasegate::control::console::with_console(
        leasegate::control::router(db.ledger.clone(), IntegerPolicy::Reject),
        leasegate::control::console::Sources {
            ledger: db.ledger.clone(),
            operator: leasegate::control::OperatorLedger::Unavailable("not needed here".into()),
            tenant: None,
            auth_required: false,
            upstreams: None,
            metrics: None,
            planner: None,
            tools: None,
        },
    );
    for (method, path, _) in leasegate::control::console::CONSOLE_ROUTES {
        assert!(
            !documented.iter().any(|(_, p)| p == path),
            "{path} is a console page, not API"
        );
        let concrete = path
            .replace("{run_id}", &uuid::Uuid::now_v7().to_string())
            .replace("{operation_id}", "some-operation");
        let request = Request::builder()
            .method(*method)
            .uri(&concrete)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from("note=x"))
            .unwrap();
        let (status, bytes) = common::router::answer_bytes(console.clone(), request).await;
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(code(&answer), "no_route", "{method} {path} is not served");
        assert!(
            String::from_utf8_lossy(&bytes).starts_with("<!DOCTYPE html>"),
            "{method} {path}: {status}"
        );
    }
    // Every documented route is really served: never the router's fallback or a 405.
    for (method, path) in &documented {
        let concrete = path
            .replace("{run_id}", &uuid::Uuid::now_v7().to_string())
            .replace("{operation_id}", "some-operation");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let body = (method == Method::POST).then_some("{}");
        let (status, answer) = api.send(method.clone(), &concrete, body).await;
        if path == "/metrics" {
            assert_eq!(status, StatusCode::OK);
            continue;
        }
        if path == "/v1/upstreams" {
            assert_eq!(
                (status, answer),
                (
                    StatusCode::OK,
                    json!({"upstreams": [{"name": "payments", "state": "up"}]})
                )
            );
            continue;
        }
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(
            code(&answer),
            "no_route",
            "{method} {path} is documented but not served"
        );
    }
}

/// `leasegate` with `args` against the ledger at `url`.
fn operator_cli(url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .args(args)
        .args(["--database-url", url])
        .output()
        .unwrap()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn operator_cli_prints_the_fate_of_a_call_and_exits_by_outcome(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned(lease.run_id, "mailer__send_email", &json!({"to": "a@b.c"}));
    let claim = db.claim(&lease, &intent, "proxy-1", 30_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({"error": "timeout"}))
        .await;

    let cli = |args: &[&str]| operator_cli(&db.url, args);
    let shown = cli(&["ops", "show", intent.operation_id.as_str()]);
    assert_eq!(shown.status.code(), Some(0));
    let text = String::from_utf8_lossy(&shown.stdout);
    for needle in [
        "status           unknown",
        // An inline call's claim writes no event: its history is the one
        // event that ended the claim, and the claims table says who held
        // it, under which epoch, and how it ended.
        "dispatching -> unknown",
        "timeout",
        "history:",
        "claims:",
        "DISPATCH",
        "WORKER",
        "evidence:",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("- -> dispatching"), "{text}");
    let claim_line = text
        .lines()
        .skip_while(|l| !l.starts_with("claims:"))
        .nth(2)
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(
        (
            claim_line.first().copied(),
            claim_line.get(2).copied(),
            claim_line.get(3).copied(),
            claim_line.get(4).map(|e| e.to_string()),
            claim_line.last().copied()
        ),
        (
            Some("1"),
            Some("proxy-1"),
            Some("agent"),
            Some(lease.epoch.to_string()),
            Some("unknown")
        ),
        "{text}"
    );
    let listed = cli(&[
        "ops",
        "list",
        "--run",
        &lease.run_id.to_string(),
        "--status",
        "unknown",
        "--json",
    ]);
    assert_eq!(listed.status.code(), Some(0));
    let json: Value = serde_json::from_slice(&listed.stdout).expect("--json parses");
    assert_eq!(
        json["operations"][0]["operation_id"],
        intent.operation_id.as_str()
    );
    let table = cli(&["ops", "list", "--run", &lease.run_id.to_string()]);
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("OPERATION"));
    let unknown: Value =
        serde_json::from_slice(&cli(&["ops", "unknown", "--json"]).stdout).unwrap();
    assert_eq!(unknown["count"], 1);

    // Exit codes: not found 3, conflict 4, lease lost 5, invalid input 2.
    assert_eq!(cli(&["ops", "show", "nope"]).status.code(), Some(3));
    assert_eq!(
        cli(&[
            "lease",
            "acquire",
            &lease.run_id.to_string(),
            "--ttl-ms",
            "1000"
        ])
        .status
        .code(),
        Some(4)
    );
    assert_eq!(
        cli(&[
            "lease",
            "renew",
            &lease.run_id.to_string(),
            "--owner",
            "x",
            "--epoch",
            "1",
            "--lease-token",
            "lgl_not-the-token",
            "--ttl-ms",
            "1000"
        ])
        .status
        .code(),
        Some(5)
    );
    // The current owner and epoch with a wrong token: exit 5 as well.
    let forged = cli(&[
        "lease",
        "renew",
        &lease.run_id.to_string(),
        "--owner",
        &lease.owner,
        "--epoch",
        &lease.epoch.to_string(),
        "--lease-token",
        "lgl_not-the-token",
        "--ttl-ms",
        "1000",
        "--json",
    ]);
    assert_eq!(forged.status.code(), Some(5));
    let answer: Value = serde_json::from_slice(&forged.stdout).unwrap();
    assert_eq!(
        (answer["code"].clone(), answer["detail"]["fault"].clone()),
        (json!("lease_token_invalid"), json!("wrong")),
        "{answer}"
    );
    // The holder's token, from the environment: renewed.
    let renewed = std::process::Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .args([
            "lease",
            "renew",
            &lease.run_id.to_string(),
            "--owner",
            &lease.owner,
        ])
        .args(["--epoch", &lease.epoch.to_string(), "--ttl-ms", "60000"])
        .args(["--database-url", &db.url])
        .env(
            "LEASEGATE_LEASE_TOKEN",
            lease.token.as_ref().unwrap().expose(),
        )
        .output()
        .unwrap();
    assert_eq!(renewed.status.code(), Some(0), "{renewed:?}");
    assert_eq!(cli(&["runs", "show", "not-a-uuid"]).status.code(), Some(2));
    let created = cli(&[
        "runs", "create", "--task", "cli-task", "--tenant", "tenant-a", "--json",
    ]);
    assert_eq!(created.status.code(), Some(0));
    let run: Value = serde_json::from_slice(&created.stdout).unwrap();
    assert!(
        run.get("lease_token").is_none(),
        "no lease, no token: {run}"
    );
    // Acquire prints the token once, in text as in JSON.
    let acquired = cli(&[
        "lease",
        "acquire",
        run["run_id"].as_str().unwrap(),
        "--ttl-ms",
        "60000",
        "--owner",
        "cli-worker",
    ]);
    assert_eq!(acquired.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&acquired.stdout).contains("lease_token      lgl_"),
        "{acquired:?}"
    );
    let shown = cli(&["runs", "show", run["run_id"].as_str().unwrap()]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("pending"));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_operator_restarts_the_retry_budget_of_an_unknown_operation_only(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned(lease.run_id, "payments__charge", &json!({"amount": 3}));
    let claim = db.claim(&lease, &intent, "proxy-1", 30_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
        .await;
    // A reconciler spends the whole budget of one.
    let items = db
        .ledger
        .operation_reconcile_claim("reconciler-1", 60_000, 10, None)
        .await
        .unwrap();
    let verdict = db
        .ledger
        .operation_reconcile_attempt(&items[0].operation, "reconciler-1", 3_600_000, 1)
        .await
        .unwrap();
    assert!(matches!(
        verdict,
        leasegate::ledger::RetryVerdict::Attempt { .. }
    ));
    let attempts = || async {
        sqlx::query_as::<_, (i32, Option<String>)>(
            "SELECT reconcile_attempts, reconcile_owner FROM tool_operations WHERE operation_id = $1",
        )
        .bind(intent.operation_id.as_str())
        .fetch_one(&db.admin)
        .await
        .unwrap()
    };
    assert_eq!(attempts().await, (1, Some("reconciler-1".into())));

    let path = format!("/v1/operations/{}/retry", intent.operation_id);
    let (status, answer) = api
        .send(
            Method::POST,
            &path,
            Some(r#"{"actor": "alice", "note": " "}"#),
        )
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body")
    );
    assert_eq!(attempts().await.0, 1, "nothing written");

    let (status, answer) = api
        .send(
            Method::POST,
            &path,
            Some(r#"{"actor": "alice", "note": "bank API back up"}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["operation"]["status"], "unknown");
    assert_eq!(attempts().await, (0, None));
    let event: Value = db
        .scalar(
            "SELECT detail FROM ledger_events WHERE operation_id = $1 AND actor = 'alice'",
            intent.operation_id.as_str(),
        )
        .await;
    assert_eq!(
        event,
        json!({"retry_budget_reset": true, "note": "bank API back up", "previous_attempts": 1})
    );

    // Only unknown operations; unknown ids are not found.
    let settled = intents::unplanned(lease.run_id, "payments__charge", &json!({"amount": 4}));
    let claim = db.claim(&lease, &settled, "proxy-1", 30_000).await;
    db.settle_succeeded(&claim, None, &json!({})).await;
    let (status, answer) = api
        .send(
            Method::POST,
            &format!("/v1/operations/{}/retry", settled.operation_id),
            Some(r#"{"actor": "alice", "note": "again"}"#),
        )
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::CONFLICT, "not_unknown")
    );
    let (status, answer) = api
        .send(
            Method::POST,
            "/v1/operations/no-such-operation/retry",
            Some(r#"{"actor": "alice", "note": "again"}"#),
        )
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::NOT_FOUND, "not_found")
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_process_serving_one_tenant_refuses_runs_of_another_and_writes_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // As `leasegate serve` builds it for `tenant = "tenant-a"`.
    let send = |body: Value| {
        let router = leasegate::control::router_with_metrics(
            db.ledger.clone(),
            leasegate::control::OperatorLedger::Ready(db.operator.clone()),
            IntegerPolicy::Reject,
            "tenant-a".to_owned(),
            Default::default(),
            leasegate::app::metrics_handle(),
        );
        async move {
            let request = Request::builder()
                .method(Method::POST)
                .uri("/v1/runs")
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            let (status, bytes) = common::router::answer_bytes(router, request).await;
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        }
    };
    let rows = || async {
        db.query_scalar::<i64>(
            "SELECT (SELECT count(*) FROM agent_tasks) + (SELECT count(*) FROM agent_runs) \
             + (SELECT count(*) FROM ledger_events)",
        )
        .await
    };

    let (status, answer) = send(json!({"tenant_id": "tenant-b", "task_id": "order-42",
        "owner": "agent", "ttl_ms": 30_000}))
    .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, "tenant_mismatch")
    );
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "tenant mismatch: expected tenant \"tenant-a\" (the tenant this leasegate serves"
        ) && message.contains("found \"tenant-b\"")
            && message.contains("Nothing was written"),
        "{message}"
    );
    assert_eq!(
        answer["detail"],
        json!({"expected": "tenant-a", "found": "tenant-b"})
    );
    assert_eq!(rows().await, 0, "no task, run or event written");

    // Its own tenant, named or not, is accepted.
    let (status, named) = send(json!({"tenant_id": "tenant-a", "task_id": "order-42"})).await;
    assert_eq!(status, StatusCode::CREATED, "{named}");
    let (status, unnamed) = send(json!({"task_id": "order-43"})).await;
    assert_eq!(status, StatusCode::CREATED, "{unnamed}");
    let tenants: Vec<String> = db
        .query_scalars("SELECT tenant_id FROM agent_runs ORDER BY task_id")
        .await;
    assert_eq!(tenants, ["tenant-a", "tenant-a"]);

    // The tenant-free router (the operator CLI without --config) takes any.
    let api = Api::of(&db);
    let (status, _) = api
        .post(
            "/v1/runs",
            json!({"tenant_id": "tenant-b", "task_id": "order-42"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn operations_are_listed_a_page_at_a_time_and_a_resolution_prints_what_it_wrote(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let api = Api::of(&db);
    let (first, _) = db.running_run("agent-1", 60_000).await;
    let (second, _) = db.running_run("agent-2", 60_000).await;
    let mut ids = Vec::new();
    for (lease, to) in [
        (&first, "a@b.c"),
        (&first, "d@e.f"),
        (&first, "g@h.i"),
        (&second, "j@k.l"),
    ] {
        let intent = intents::unplanned(lease.run_id, "mailer__send_email", &json!({"to": to}));
        let claim = db.claim(lease, &intent, "proxy-1", 30_000).await;
        db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({"error": "timeout"}))
            .await;
        ids.push(intent.operation_id.as_str().to_owned());
    }

    // Pages of two, newest first, until next_cursor is null: every one once.
    let mut seen = Vec::new();
    let mut path = "/v1/operations?limit=2".to_owned();
    loop {
        let (status, page) = api.send(Method::GET, &path, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let rows = page["operations"].as_array().unwrap();
        assert!(rows.len() <= 2, "{page}");
        seen.extend(
            rows.iter()
                .map(|op| op["operation_id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/operations?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);

    // The CLI's filters: run, status, tool.
    let count = |query: String| {
        let api = &api;
        async move {
            let (status, page) = api
                .send(Method::GET, &format!("/v1/operations?{query}"), None)
                .await;
            assert_eq!(status, StatusCode::OK, "{query}: {page}");
            page["operations"].as_array().unwrap().len()
        }
    };
    assert_eq!(count(format!("run_id={}", first.run_id)).await, 3);
    assert_eq!(count("status=unknown".into()).await, 4);
    assert_eq!(count("status=succeeded".into()).await, 0);
    assert_eq!(count("tool=mailer__send_email".into()).await, 4);
    assert_eq!(count("tool=payments__charge".into()).await, 0);
    for (query, expected) in [
        ("limit=0", "invalid_input"),
        ("limit=1001", "invalid_input"),
        ("cursor=nonsense", "invalid_input"),
        ("status=lost", "invalid_status"),
        ("run_id=not-a-uuid", "invalid_run_id"),
    ] {
        let (status, answer) = api
            .send(Method::GET, &format!("/v1/operations?{query}"), None)
            .await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, expected),
            "{query}: {answer}"
        );
    }
    let (status, _) = api
        .send(
            Method::GET,
            &format!("/v1/operations?run_id={}", uuid::Uuid::now_v7()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let cli = |args: &[&str]| operator_cli(&db.url, args);
    let listed = cli(&["ops", "list", "--limit", "3", "--status", "unknown"]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.starts_with("OPERATION") && listed.contains("more: the next page with --cursor "),
        "{listed}"
    );
    // A resolution prints the row it wrote and its history, itself last.
    let resolved = cli(&[
        "ops",
        "resolve",
        &ids[0],
        "--succeeded",
        "--note",
        "checked the mailbox",
        "--actor",
        "ada",
    ]);
    assert_eq!(resolved.status.code(), Some(0), "{resolved:?}");
    let printed = String::from_utf8_lossy(&resolved.stdout);
    assert!(
        printed.starts_with(&format!("resolved {} (evidence ", ids[0])),
        "{printed}"
    );
    for needle in [
        "status           succeeded",
        "history:",
        "dispatching -> unknown",
        "unknown -> succeeded",
        "ada",
    ] {
        assert!(
            printed.contains(needle),
            "missing {needle:?} in:\n{printed}"
        );
    }
    let history = printed.split("history:").nth(1).unwrap();
    assert!(
        history.find("dispatching -> unknown") < history.find("unknown -> succeeded"),
        "{printed}"
    );
}
