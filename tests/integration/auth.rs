//! Authentication and tenant isolation, against a
//! real `leasegate serve` process with `[auth] mode = "required"`, tokens
//! made by the real `leasegate tokens` CLI, and real HTTP and MCP clients:
//!
//! * no token → 401 with `WWW-Authenticate: Bearer resource_metadata=…`,
//!   and the RFC 9728 document there; a wrong scope → 403;
//! * a token of another tenant walks every control route and gets 404 (or
//!   403 for its scope, 422 for a create) with nothing written; on the MCP
//!   front a token of another tenant than the served one is refused (422
//!   `tenant_mismatch`) before any method runs, and
//!   reaches no tool;
//! * revoked and expired tokens → 401;
//! * the secret is in no table and no log line (the server logs at debug).

use crate::common;
use crate::common::proxy::charge_eur;
use crate::common::tokens::{create_token, token_id};

use std::sync::{Arc, Mutex};

use common::proxy::{LEASEGATE, Scenario, ServedChild, call, connect_http_with, lease_meta};
use common::{TestDb, within};
use leasegate::ledger::{LeaseClaim, RunId};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// `leasegate serve` with debug logs; its MCP and control URLs, and every
/// line it writes to stderr.
struct Served {
    child: tokio::process::Child,
    mcp: String,
    control: String,
    log: Arc<Mutex<Vec<String>>>,
}

async fn serve(scenario: &Scenario) -> Served {
    let served = ServedChild::spawn(ServedChild::command(scenario, &[("RUST_LOG", "debug")])).await;
    Served {
        child: served.child,
        mcp: served.mcp,
        control: served.control,
        log: served.log,
    }
}

struct Answer {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

async fn request(method: &str, url: &str, token: Option<&str>, body: Option<Value>) -> Answer {
    let client = reqwest::Client::builder()
        .timeout(common::DEADLINE)
        .build()
        .unwrap();
    let mut request = client.request(method.parse().unwrap(), url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    Answer {
        status,
        challenge,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

/// Everything tenant data is made of, as one digest: equal before and after
/// means nothing was written.
async fn fingerprint(db: &TestDb) -> String {
    db.tables_digest(&[
        "agent_tasks",
        "agent_runs",
        "worker_leases",
        "tool_operations",
        "ledger_events",
        "operation_evidence",
        "ledger_failovers",
        "access_tokens",
    ])
    .await
}

const POLICY: &str = "background = false\n";

fn scenario_with_auth(db: &TestDb) -> Scenario {
    let scenario = Scenario::new(&db.url, POLICY);
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        format!("{config}\n[auth]\nmode = \"required\"\n"),
    )
    .unwrap();
    scenario
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn tokens_gate_both_listeners_by_scope_and_another_tenant_finds_nothing_and_writes_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_with_auth(&db);
    let agent = create_token(&db, "tenant-a", "agent", Some("test")).await;
    let operator = create_token(&db, "tenant-a", "operator", Some("test")).await;
    let intruder = create_token(&db, "tenant-evil", "admin", Some("test")).await;
    let intruder_agent = create_token(&db, "tenant-evil", "agent", Some("test")).await;
    let served = serve(&scenario).await;
    let control = served.control.clone();
    let api = |path: &str| format!("{control}{path}");

    // No token: 401 on both listeners, with where to read about the resource.
    let answer = request("GET", &api("/v1/operations/unknown"), None, None).await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    assert_eq!(answer.body["code"], "unauthorized");
    let challenge = answer.challenge.expect("a WWW-Authenticate challenge");
    let metadata_url = challenge
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("resource_metadata in the challenge")
        .to_owned();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    let document = request("GET", &metadata_url, None, None).await;
    assert_eq!(document.status, 200);
    assert_eq!(document.body["resource"], json!(control));
    assert_eq!(
        document.body["scopes_supported"],
        json!(["agent", "operator", "admin"])
    );
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let mcp_post = |token: Option<String>| {
        let url = served.mcp.clone();
        let list = list.clone();
        async move {
            let client = reqwest::Client::new();
            let mut request = client
                .post(&url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .body(list.to_string());
            if let Some(token) = token {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let response = request.send().await.unwrap();
            let challenge = response
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap().to_owned());
            (response.status().as_u16(), challenge)
        }
    };
    let (status, challenge) = mcp_post(None).await;
    assert_eq!(status, 401);
    let challenge = challenge.expect("a challenge on the MCP front");
    let mcp_metadata = challenge
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    assert!(
        mcp_metadata.ends_with("/.well-known/oauth-protected-resource/mcp"),
        "{challenge}"
    );
    let document = request("GET", &mcp_metadata, None, None).await;
    assert_eq!(document.body["resource"], json!(served.mcp));
    // A token that is not one, and a well-formed one that does not exist.
    let (status, challenge) = mcp_post(Some("not-a-token".into())).await;
    assert_eq!(status, 401);
    assert!(challenge.unwrap().contains("error=\"invalid_token\""));
    let forged = format!("lgt_{}_{}", token_id(&agent), "0".repeat(64));
    let answer = request("GET", &api("/v1/runs/x"), Some(&forged), None).await;
    assert_eq!(
        (answer.status, answer.body["detail"]["reason"].as_str()),
        (401, Some("unknown_token"))
    );
    // An operator does not make tool calls.
    let (status, challenge) = mcp_post(Some(operator.clone())).await;
    assert_eq!(status, 403);
    assert!(challenge.unwrap().contains("error=\"insufficient_scope\""));
    let (status, _) = mcp_post(Some(agent.clone())).await;
    assert_eq!(status, 200);

    // The agent of tenant-a: a run, its lease, and one charge through MCP.
    let created = request(
        "POST",
        &api("/v1/runs"),
        Some(&agent),
        Some(json!({"task_id": "order-1"})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let run: RunId = created.body["run_id"].as_str().unwrap().parse().unwrap();
    let leased = request(
        "POST",
        &api(&format!("/v1/runs/{run}/lease")),
        Some(&agent),
        Some(json!({"owner": "worker-a", "ttl_ms": 60_000})),
    )
    .await;
    assert_eq!(leased.status, 200, "{}", leased.body);
    let lease = LeaseClaim {
        run_id: run,
        owner: "worker-a".into(),
        epoch: leased.body["epoch"].as_i64().unwrap(),
        token: Some(leasegate::ledger::LeaseToken::presented(
            leased.body["lease_token"]
                .as_str()
                .expect("the lease token"),
        )),
    };
    let auth_header = format!("Bearer {agent}");
    let client = connect_http_with(&served.mcp, &[("authorization", &auth_header)]).await;
    let mut meta = lease_meta(&lease);
    meta.insert(
        "dev.leasegate/step".into(),
        json!({"step_id": "charge", "effect_version": 1}),
    );
    let result = charge_eur(&client, 500, Some(meta.clone()))
        .await
        .expect("the agent's charge");
    let operation_id = common::proxy::operation_note(&result)["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    client.cancel().await.unwrap();
    let charges = || {
        scenario
            .side_effects("calls.jsonl")
            .into_iter()
            .filter(|c| c["tool"] == "charge")
            .count()
    };
    assert_eq!(charges(), 1);
    // An agent does not read bodies; the operator does.
    let path = format!("/v1/operations/{operation_id}");
    let answer = request("GET", &api(&path), Some(&agent), None).await;
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (403, Some("insufficient_scope"))
    );
    let answer = request("GET", &api(&path), Some(&operator), None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    // Another tenant's admin walks every route: nothing of tenant-a exists
    // for it, and nothing is written.
    let before = fingerprint(&db).await;
    let claim = json!({"owner": "worker-a", "epoch": lease.epoch});
    let transition = json!({"owner": "worker-a", "epoch": lease.epoch, "expected_revision": 1});
    let batch = json!({"ttl_ms": 60_000, "leases": [{
        "run_id": run.to_string(), "owner": "worker-a", "epoch": lease.epoch,
        "lease_token": leased.body["lease_token"],
    }]});
    let renewed = request(
        "POST",
        &api("/v1/leases/renew"),
        Some(&intruder),
        Some(batch.clone()),
    )
    .await;
    assert_eq!(renewed.status, 200, "{}", renewed.body);
    assert!(
        renewed.body.to_string().contains("not_found")
            && !renewed.body.to_string().contains("applied"),
        "another tenant's lease is not found: {}",
        renewed.body
    );
    let walk: Vec<(&str, String, Option<Value>, u16)> = vec![
        (
            "POST",
            "/v1/runs".into(),
            Some(json!({"tenant_id": "tenant-a", "task_id": "order-1"})),
            422,
        ),
        (
            "POST",
            "/v1/runs".into(),
            Some(json!({"task_id": "order-2"})),
            422,
        ),
        ("GET", format!("/v1/runs/{run}"), None, 404),
        (
            "POST",
            format!("/v1/runs/{run}/lease"),
            Some(json!({"ttl_ms": 60_000})),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/lease/renew"),
            Some(json!({"owner": "worker-a", "epoch": lease.epoch, "ttl_ms": 60_000})),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/lease/release"),
            Some(claim.clone()),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/checkpoint"),
            Some(
                json!({"owner": "worker-a", "epoch": lease.epoch, "expected_revision": 1, "checkpoint": {"x": 1}}),
            ),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/start"),
            Some(transition.clone()),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/complete"),
            Some(transition.clone()),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/fail"),
            Some(transition.clone()),
            404,
        ),
        (
            "POST",
            format!("/v1/runs/{run}/cancel"),
            Some(json!({"actor": "intruder"})),
            404,
        ),
        ("GET", format!("/v1/runs/{run}/operations"), None, 404),
        ("GET", "/v1/operations".into(), None, 200),
        ("GET", "/v1/operations/unknown".into(), None, 200),
        ("GET", path.clone(), None, 404),
        (
            "POST",
            format!("{path}/resolve"),
            Some(json!({"outcome": "failed_final", "actor": "intruder", "note": "x"})),
            404,
        ),
        (
            "POST",
            format!("{path}/retry"),
            Some(json!({"actor": "intruder", "note": "x"})),
            404,
        ),
        ("GET", "/v1/failovers".into(), None, 200),
        (
            "POST",
            "/v1/failovers/1/resolve".into(),
            Some(json!({"by": "intruder", "reason": "x"})),
            404,
        ),
        ("GET", "/v1/upstreams".into(), None, 200),
        ("GET", "/v1/durability".into(), None, 200),
        ("GET", "/metrics".into(), None, 200),
        // A batch renewal naming tenant-a's lease, with its real token:
        // answered per lease as not found (checked below), nothing renewed.
        ("POST", "/v1/leases/renew".into(), Some(batch.clone()), 200),
    ];
    // The tenant's operations list is the intruder's own tenant's: empty,
    // and tenant-a's run is not found there.
    let listed = request("GET", &api("/v1/operations"), Some(&intruder), None).await;
    assert_eq!(listed.body["operations"], json!([]), "{}", listed.body);
    let of_run = format!("/v1/operations?run_id={run}");
    let listed = request("GET", &api(&of_run), Some(&intruder), None).await;
    assert_eq!(listed.status, 404, "{}", listed.body);
    // Every route of the router is walked.
    for (method, route) in leasegate::control::ROUTES {
        let pattern = route
            .replace("{run_id}", &run.to_string())
            .replace("{operation_id}", &operation_id)
            .replace("{failover_id}", "1");
        assert!(
            walk.iter().any(|(m, p, _, _)| m == method && *p == pattern),
            "{method} {route} is not walked"
        );
    }
    for (method, path, body, expected) in &walk {
        let answer = request(method, &api(path), Some(&intruder), body.clone()).await;
        assert_eq!(answer.status, *expected, "{method} {path}: {}", answer.body);
        if *expected == 404 {
            assert_eq!(answer.body["code"], "not_found", "{method} {path}");
        }
        // The agent scope of the same tenant: 403 where the route is not an
        // agent's, else the same 404/422.
        let needed = leasegate::control::auth::route_scopes(
            &method.parse().unwrap(),
            leasegate::control::ROUTES
                .iter()
                .find(|(m, r)| {
                    m == method
                        && *path
                            == r.replace("{run_id}", &run.to_string())
                                .replace("{operation_id}", &operation_id)
                                .replace("{failover_id}", "1")
                })
                .unwrap()
                .1,
        )
        .unwrap();
        let answer = request(method, &api(path), Some(&intruder_agent), body.clone()).await;
        let expected = if needed.contains(&leasegate::auth::Scope::Agent) {
            *expected
        } else {
            403
        };
        assert_eq!(
            answer.status, expected,
            "agent {method} {path}: {}",
            answer.body
        );
    }
    let summary = request("GET", &api("/v1/operations/unknown"), Some(&intruder), None).await;
    assert_eq!(summary.body["count"], 0);
    // On the MCP front: a token of another tenant than the one this
    // process serves is refused before any method runs or any session is
    // made (resources, prompts and sessions are the served tenant's too).
    let (status, _) = mcp_post(Some(intruder_agent.clone())).await;
    assert_eq!(status, 422, "tenant_mismatch on the MCP front");
    // A rebinding page: Host and Origin are judged before the token.
    let rebinding = reqwest::Client::new()
        .post(&served.mcp)
        .header("host", "attacker.example")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(rebinding.status().as_u16(), 403);
    assert!(rebinding.headers().get("www-authenticate").is_none());
    assert_eq!(charges(), 1, "no tool ran for the other tenant");
    assert_eq!(fingerprint(&db).await, before, "nothing was written");

    // An operator act is audited under the token, whatever name the body
    // gives: the operator cancels tenant-a's run "as alice".
    let cancelled = request(
        "POST",
        &api(&format!("/v1/runs/{run}/cancel")),
        Some(&operator),
        Some(json!({"actor": "alice", "reason": "audit check"})),
    )
    .await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    let actors: Vec<String> = db
        .scalars(
            "SELECT actor FROM ledger_events WHERE run_id = $1 AND subject = 'run' \
         AND to_status = 'cancelled'",
            run.as_uuid(),
        )
        .await;
    assert_eq!(
        actors,
        [format!("token:{}/alice", token_id(&operator))],
        "the cancel names the token that made it"
    );

    // Revoked, then expired: 401 from the next request on.
    let revoked = tokio::process::Command::new(LEASEGATE)
        .args([
            "tokens",
            "revoke",
            token_id(&agent),
            "--by",
            "test",
            "--database-url",
            &db.url,
        ])
        .output()
        .await
        .unwrap();
    assert!(revoked.status.success(), "{revoked:?}");
    let answer = request("GET", &api(&format!("/v1/runs/{run}")), Some(&agent), None).await;
    assert_eq!(
        (answer.status, answer.body["detail"]["reason"].as_str()),
        (401, Some("revoked_token"))
    );
    let listed = tokio::process::Command::new(LEASEGATE)
        .args([
            "tokens",
            "list",
            "--json",
            "--tenant",
            "tenant-a",
            "--database-url",
            &db.url,
        ])
        .output()
        .await
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let listed = listed["tokens"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 2, "tenant-a's tokens only: {listed:?}");
    let row = listed
        .iter()
        .find(|t| t["token_id"] == token_id(&agent))
        .unwrap();
    assert_eq!(
        (row["scope"].as_str(), row["revoked_by"].as_str()),
        (Some("agent"), Some("test"))
    );
    assert!(
        !Value::Array(listed.clone())
            .to_string()
            .contains(agent.rsplit('_').next().unwrap())
    );
    let (status, _) = mcp_post(Some(agent.clone())).await;
    assert_eq!(status, 401);
    sqlx::query("UPDATE access_tokens SET expires_at = clock_timestamp() - interval '1 second' WHERE token_id = $1")
        .bind(token_id(&operator))
        .execute(&db.admin)
        .await
        .unwrap();
    let answer = request("GET", &api(&path), Some(&operator), None).await;
    assert_eq!(
        (answer.status, answer.body["detail"]["reason"].as_str()),
        (401, Some("expired_token"))
    );

    // Refusals are counted by reason.
    let metrics = request("GET", &api("/metrics"), Some(&intruder), None).await;
    let text = metrics.body.as_str().unwrap_or_default().to_owned();
    for reason in [
        "missing_token",
        "unknown_token",
        "insufficient_scope",
        "revoked_token",
        "expired_token",
        "other_tenant",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with("http_refused_total")
                && l.contains(&format!("reason=\"{reason}\""))),
            "{reason} counted:\n{text}"
        );
    }

    // The secrets are in no table and in no log line.
    let Served { mut child, log, .. } = served;
    child.start_kill().unwrap();
    within("leasegate to stop", child.wait()).await.unwrap();
    let tables: Vec<String> = db
        .query_scalars("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
        .await;
    let log = log.lock().unwrap().join("\n");
    assert!(
        log.contains("DEBUG") || log.contains("debug"),
        "the server logged at debug"
    );
    for token in [&agent, &operator, &intruder, &intruder_agent] {
        let secret = token.rsplit('_').next().unwrap();
        for table in &tables {
            let found: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} t WHERE t::text LIKE '%' || $1 || '%'"
            )))
            .bind(secret)
            .fetch_one(&db.admin)
            .await
            .unwrap();
            assert_eq!(found, 0, "the secret is in {table}");
        }
        assert!(!log.contains(secret), "the secret is in the log");
    }
}

#[tokio::test]
async fn a_listener_beyond_loopback_without_authentication_is_refused_by_check_config_and_serve() {
    let dir =
        std::env::temp_dir().join(format!("leasegate-auth-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("leasegate.toml");
    let write = |listen: &str, auth: &str| {
        std::fs::write(
            &config,
            format!(
                "listen = \"{listen}\"\ncontrol_listen = \"127.0.0.1:0\"\n\n[upstreams.tools]\ntransport = \"stdio\"\ncommand = \"{}\"\n{auth}",
                common::proxy::EXAMPLE_TOOLS
            ),
        )
        .unwrap();
    };
    let run = |args: &[&str]| {
        std::process::Command::new(LEASEGATE)
            .args(args)
            .arg(&config)
            .output()
            .unwrap()
    };
    write("0.0.0.0:0", "\n[auth]\nmode = \"off\"\n");
    let checked = run(&["check-config"]);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(checked.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "auth.mode: \"off\" with a listener that is not loopback (listen = \"0.0.0.0:0\")"
        ),
        "{stdout}"
    );
    let served = run(&["serve", "--config"]);
    let stderr = String::from_utf8_lossy(&served.stderr);
    assert_eq!(served.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("auth.mode: \"off\""), "{stderr}");
    // `--listen` cannot expose a loopback config that has authentication off.
    write("127.0.0.1:0", "\n[auth]\nmode = \"off\"\n");
    let served = std::process::Command::new(LEASEGATE)
        .args(["serve", "--listen", "0.0.0.0:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&served.stderr);
    assert_eq!(served.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--listen 0.0.0.0:0: auth.mode: \"off\""),
        "{stderr}"
    );
    // The default (auto) accepts it: tokens are then required.
    write("0.0.0.0:0", "");
    let checked = run(&["check-config"]);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );
    let loaded = leasegate::config::Config::load(&config).unwrap();
    assert!(loaded.auth_required());
    write("127.0.0.1:0", "");
    assert!(
        !leasegate::config::Config::load(&config)
            .unwrap()
            .auth_required()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn openapi_names_the_scopes_every_route_accepts() {
    let document: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).unwrap(),
    )
    .unwrap();
    for (method, path, scopes) in leasegate::control::auth::ROUTE_SCOPES {
        let mut expected: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
        if !expected.contains(&"admin") {
            expected.push("admin");
        }
        let operation = &document["paths"][path][method.to_lowercase()];
        assert_eq!(
            operation["x-leasegate-scopes"],
            json!(expected),
            "{method} {path}"
        );
        for status in ["401", "403"] {
            assert!(
                operation["responses"][status].is_object(),
                "{method} {path} {status}"
            );
        }
    }
}

/// `[auth.jwt]`: JWTs of the configured issuer act for the tenant and scope
/// their claims name; a wrong key, issuer or audience, a missing claim or
/// an expired token is 401; another tenant's JWT finds nothing.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn jwts_of_the_configured_issuer_act_for_their_claims_tenant_and_scope(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_with_auth(&db);
    trust_jwt_issuer(&scenario);
    let secret = JWT_SECRET;
    let proxy = common::proxy::RunningProxy::start(&scenario.config_path()).await;
    let now = chrono::Utc::now().timestamp();
    let sign = |claims: Value, key: &[u8]| sign_jwt(&claims, key);
    let claims = |org: &str, scope: Value| {
        json!({"iss": "https://idp.test", "aud": "leasegate-test", "sub": "alice",
               "exp": now + 600, "org": org, "scope": scope})
    };
    let api = |path: &str| format!("{}{path}", proxy.control_url);

    let agent = sign(claims("tenant-a", json!("openid agent")), secret);
    let created = request(
        "POST",
        &api("/v1/runs"),
        Some(&agent),
        Some(json!({"task_id": "t"})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let run = created.body["run_id"].as_str().unwrap().to_owned();
    let unknown = request("GET", &api("/v1/operations/unknown"), Some(&agent), None).await;
    assert_eq!(unknown.status, 403, "an agent is not an operator");
    let operator = sign(claims("tenant-a", json!(["operator"])), secret);
    let unknown = request("GET", &api("/v1/operations/unknown"), Some(&operator), None).await;
    assert_eq!(unknown.status, 200, "{}", unknown.body);
    let intruder = sign(claims("tenant-evil", json!("admin")), secret);
    let hidden = request(
        "GET",
        &api(&format!("/v1/runs/{run}")),
        Some(&intruder),
        None,
    )
    .await;
    assert_eq!(hidden.status, 404, "{}", hidden.body);

    let mut refused = Vec::new();
    let mut wrong_audience = claims("tenant-a", json!("agent"));
    wrong_audience["aud"] = json!("someone-else");
    let mut wrong_issuer = claims("tenant-a", json!("agent"));
    wrong_issuer["iss"] = json!("https://evil.test");
    let mut expired = claims("tenant-a", json!("agent"));
    expired["exp"] = json!(now - 600);
    let mut no_tenant = claims("tenant-a", json!("agent"));
    no_tenant.as_object_mut().unwrap().remove("org");
    for (what, token) in [
        (
            "another key",
            sign(
                claims("tenant-a", json!("agent")),
                b"not the provider's key at all, 32+ bytes",
            ),
        ),
        ("wrong audience", sign(wrong_audience, secret)),
        ("wrong issuer", sign(wrong_issuer, secret)),
        ("expired", sign(expired, secret)),
        ("no tenant claim", sign(no_tenant, secret)),
        (
            "no leasegate scope",
            sign(claims("tenant-a", json!("openid email")), secret),
        ),
    ] {
        let answer = request("GET", &api(&format!("/v1/runs/{run}")), Some(&token), None).await;
        assert_eq!(answer.status, 401, "{what}: {}", answer.body);
        refused.push((
            what,
            answer.body["detail"]["reason"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(refused[3], ("expired", "expired_token".to_owned()));
    assert!(
        refused
            .iter()
            .filter(|(what, _)| *what != "expired")
            .all(|(_, reason)| reason == "invalid_jwt"),
        "{refused:?}"
    );

    // The metadata names the issuer; the MCP front takes the same JWTs.
    let document = request(
        "GET",
        &proxy
            .url
            .replace("/mcp", "/.well-known/oauth-protected-resource/mcp"),
        None,
        None,
    )
    .await;
    assert_eq!(
        document.body["authorization_servers"],
        json!(["https://idp.test"])
    );
    let header = format!("Bearer {agent}");
    let client = connect_http_with(&proxy.url, &[("authorization", &header)]).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "payments__charge"));
    client.cancel().await.unwrap();
    proxy.stop().await;
}

/// The official Python SDK (mcp 2.3.0, the suite's venv) against `[auth]
/// mode = "required"`: the default client given an `Authorization: Bearer`
/// header on its HTTP client lists the tools and makes a gated call with a
/// lease token (one charge); the default client without it is refused 401
/// (counted `missing_token`) and reaches no tool.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_python_sdk_calls_through_the_http_front_with_a_bearer_token_and_is_refused_without(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_with_auth(&db);
    let agent = create_token(&db, "tenant-a", "agent", Some("test")).await;
    let operator = create_token(&db, "tenant-a", "operator", Some("test")).await;
    let served = serve(&scenario).await;
    let (lease, _) = db.running_run("python-agent", 60_000).await;
    let mut command = tokio::process::Command::new(common::peers::python());
    command
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/bearer.py"))
        .arg(&served.mcp)
        .env("LEASEGATE_BEARER", &agent)
        .env("LEASEGATE_RUN_ID", lease.run_id.to_string())
        .env("LEASEGATE_OWNER", &lease.owner)
        .env("LEASEGATE_EPOCH", lease.epoch.to_string())
        .env(
            "LEASEGATE_LEASE_TOKEN",
            lease.token.as_ref().unwrap().expose(),
        );
    let output = within("the Python SDK client", command.kill_on_drop(true).output())
        .await
        .expect("the test Python runs");
    let checks: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let failed: Vec<&Value> = checks.iter().filter(|c| c["ok"] != true).collect();
    assert!(
        output.status.success() && failed.is_empty() && checks.len() == 4,
        "{} of {} checks failed:\n{}\nstderr:\n{}",
        failed.len(),
        checks.len(),
        serde_json::to_string_pretty(&failed).unwrap(),
        String::from_utf8_lossy(&output.stderr)
    );
    // One charge, under the lease, recorded as succeeded.
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    let (status,): (String,) = db
        .row(
            "SELECT status FROM tool_operations WHERE run_id = $1 AND tool_name = 'payments__charge'",
            lease.run_id.as_uuid(),
        )
        .await;
    assert_eq!(status, "succeeded");
    // The refusal without a token was counted.
    let metrics = request(
        "GET",
        &format!("{}/metrics", served.control),
        Some(&operator),
        None,
    )
    .await;
    assert_eq!(metrics.status, 200);
    let text = metrics.body.as_str().unwrap_or_default().to_owned();
    let refused = common::prometheus::sum(
        &text,
        "http_refused_total",
        &[("listener", "mcp"), ("reason", "missing_token")],
    );
    assert!(refused >= 1.0, "{text}");
}

/// The test identity provider's HS256 key.
const JWT_SECRET: &[u8] = b"a shared secret of the test identity provider, 32+ bytes";

/// `[auth.jwt]` trusting [`JWT_SECRET`] (kid `k1`, in `jwks.json`), issuer
/// `https://idp.test`, audience `leasegate-test`, tenant claim `org`.
fn trust_jwt_issuer(scenario: &Scenario) {
    use jsonwebtoken::{Algorithm, EncodingKey, jwk::Jwk};
    let mut key = Jwk::from_encoding_key(
        &EncodingKey::from_secret(JWT_SECRET).unwrap(),
        Algorithm::HS256,
    )
    .unwrap();
    key.common.key_id = Some("k1".into());
    std::fs::write(
        scenario.dir.join("jwks.json"),
        json!({ "keys": [key] }).to_string(),
    )
    .unwrap();
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        format!(
            "{config}\n[auth.jwt]\nissuer = \"https://idp.test\"\naudience = \"leasegate-test\"\njwks_file = \"jwks.json\"\ntenant_claim = \"org\"\n"
        ),
    )
    .unwrap();
}

/// `claims` as they are, signed with `key` (HS256, kid `k1`).
fn sign_jwt(claims: &Value, key: &[u8]) -> String {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".into());
    encode(&header, claims, &EncodingKey::from_secret(key).unwrap()).unwrap()
}

fn scenario_in_lease_mode(db: &TestDb, mode: &str) -> Scenario {
    let scenario = scenario_with_auth(db);
    scenario.prepend_config(&format!("lease_mode = \"{mode}\""));
    scenario
}

/// The (run id, kind, principal) of the operation of the charge of `amount`.
async fn charge_run(db: &TestDb, amount: i64) -> Vec<(String, String, String)> {
    db.rows(
        "SELECT r.run_id::text, r.kind, r.principal FROM tool_operations o \
           JOIN agent_runs r ON r.run_id = o.run_id \
          WHERE (o.request_body->>'amount')::bigint = $1 ORDER BY o.created_at",
        amount,
    )
    .await
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn in_session_mode_another_principal_naming_the_task_key_gets_a_task_of_its_own_and_nothing_of_the_first(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_in_lease_mode(&db, "session");
    let alice = create_token(&db, "tenant-a", "agent", Some("test")).await;
    let mallory = create_token(&db, "tenant-a", "agent", Some("test")).await;
    let operator = create_token(&db, "tenant-a", "operator", Some("test")).await;
    let served = serve(&scenario).await;
    let api = |path: &str| format!("{}{path}", served.control);
    let charge = |amount: i64| json!({"amount": amount, "currency": "eur"});
    let on_payroll = |token: String| {
        let url = served.mcp.clone();
        async move {
            let auth = format!("Bearer {token}");
            connect_http_with(
                &url,
                &[("authorization", &auth), ("leasegate-task", "payroll")],
            )
            .await
        }
    };

    // Alice's agent works on task "payroll" in session mode.
    let alice_mcp = on_payroll(alice.clone()).await;
    let paid = call(&alice_mcp, "payments__charge", charge(50), None)
        .await
        .unwrap();
    assert_eq!(common::proxy::operation_note(&paid)["replayed"], false);
    let alice_run = charge_run(&db, 50).await[0].clone();
    assert_eq!(
        (alice_run.1.as_str(), alice_run.2.as_str()),
        ("session", token_id(&alice))
    );

    // A worker of Alice's with an explicit lease on a control-API task of the
    // same name: another namespace, so no conflict and no takeover.
    let created = request(
        "POST",
        &api("/v1/runs"),
        Some(&alice),
        Some(json!({"task_id": "payroll"})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let explicit_run = created.body["run_id"].as_str().unwrap().to_owned();
    assert_ne!(explicit_run, alice_run.0);
    let leased = request(
        "POST",
        &api(&format!("/v1/runs/{explicit_run}/lease")),
        Some(&alice),
        Some(json!({"owner": "worker-1", "ttl_ms": 60_000})),
    )
    .await;
    assert_eq!(leased.status, 200, "{}", leased.body);

    // Mallory, another agent token of the same tenant, names the same task
    // key and sends the same request: a task of its own, a charge of its own,
    // nothing replayed from Alice's run.
    let mallory_mcp = on_payroll(mallory.clone()).await;
    let own = call(&mallory_mcp, "payments__charge", charge(50), None)
        .await
        .unwrap();
    assert_eq!(
        common::proxy::operation_note(&own)["replayed"],
        false,
        "{own:?}"
    );
    let runs = charge_run(&db, 50).await;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].2, token_id(&mallory));
    assert_ne!(runs[1].0, alice_run.0);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 2);

    // Alice is not fenced, and the explicit worker's lease still renews.
    let again = call(&alice_mcp, "payments__charge", charge(51), None)
        .await
        .unwrap();
    assert_eq!(common::proxy::operation_note(&again)["status"], "succeeded");
    let renewed = request(
        "POST",
        &api(&format!("/v1/runs/{explicit_run}/lease/renew")),
        Some(&alice),
        Some(json!({"owner": "worker-1", "epoch": 1, "ttl_ms": 60_000,
                    "lease_token": leased.body["lease_token"]})),
    )
    .await;
    assert_eq!(renewed.status, 200, "{}", renewed.body);

    // Through every control route Mallory (and Alice, an agent too) finds
    // nothing of Alice's session run, and writes nothing.
    let before = fingerprint(&db).await;
    let run = &alice_run.0;
    let claim = json!({"owner": "leasegate:session", "epoch": 1, "lease_token": "lgl_guess"});
    for token in [&mallory, &alice] {
        for (method, path, body) in [
            ("GET", format!("/v1/runs/{run}"), None),
            (
                "POST",
                format!("/v1/runs/{run}/lease"),
                Some(json!({"ttl_ms": 60_000})),
            ),
            (
                "POST",
                format!("/v1/runs/{run}/lease/renew"),
                Some(
                    json!({"owner": "leasegate:session", "epoch": 1, "lease_token": "lgl_guess", "ttl_ms": 60_000}),
                ),
            ),
            (
                "POST",
                format!("/v1/runs/{run}/lease/release"),
                Some(claim.clone()),
            ),
            (
                "POST",
                format!("/v1/runs/{run}/checkpoint"),
                Some(
                    json!({"owner": "leasegate:session", "epoch": 1, "expected_revision": 1,
                         "checkpoint": {}, "intents": [{"tool": "payments__charge",
                         "arguments": {"amount": 1}, "step_id": "s1"}]}),
                ),
            ),
            (
                "POST",
                format!("/v1/runs/{run}/start"),
                Some(json!({"owner": "leasegate:session", "epoch": 1, "expected_revision": 1})),
            ),
            (
                "POST",
                format!("/v1/runs/{run}/complete"),
                Some(json!({"owner": "leasegate:session", "epoch": 1, "expected_revision": 1})),
            ),
            (
                "POST",
                format!("/v1/runs/{run}/fail"),
                Some(json!({"owner": "leasegate:session", "epoch": 1, "expected_revision": 1})),
            ),
        ] {
            let answer = request(method, &api(&path), Some(token), body).await;
            assert_eq!(answer.status, 404, "{method} {path}: {}", answer.body);
            assert!(
                !answer.body.to_string().contains("leasegate:session"),
                "{}",
                answer.body
            );
        }
        let batch = request(
            "POST",
            &api("/v1/leases/renew"),
            Some(token),
            Some(
                json!({"ttl_ms": 60_000, "leases": [{"run_id": run, "owner": "leasegate:session",
                        "epoch": 1, "lease_token": "lgl_guess"}]}),
            ),
        )
        .await;
        assert_eq!(
            batch.body["leases"][0]["code"], "not_found",
            "{}",
            batch.body
        );
    }
    assert_eq!(fingerprint(&db).await, before, "nothing was written");

    // An operator of the tenant sees the run, and whose namespace it is in.
    let seen = request(
        "GET",
        &api(&format!("/v1/runs/{run}")),
        Some(&operator),
        None,
    )
    .await;
    assert_eq!(seen.status, 200, "{}", seen.body);
    assert_eq!(
        (seen.body["kind"].as_str(), seen.body["principal"].as_str()),
        (Some("session"), Some(token_id(&alice)))
    );

    alice_mcp.cancel().await.unwrap();
    mallory_mcp.cancel().await.unwrap();
    drop(served);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn in_key_mode_keys_belong_to_their_principal_and_a_jwt_without_a_subject_is_refused(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_in_lease_mode(&db, "key");
    trust_jwt_issuer(&scenario);
    let sign = |mut claims: Value| {
        claims["iss"] = json!("https://idp.test");
        claims["aud"] = json!("leasegate-test");
        claims["exp"] = json!(chrono::Utc::now().timestamp() + 600);
        sign_jwt(&claims, JWT_SECRET)
    };
    let alice = create_token(&db, "tenant-a", "agent", Some("test")).await;
    let mallory = create_token(&db, "tenant-a", "agent", Some("test")).await;
    let served = serve(&scenario).await;
    let charge = |amount: i64| json!({"amount": amount, "currency": "eur"});
    let keyed = |token: String, key: &'static str| {
        let url = served.mcp.clone();
        async move {
            let auth = format!("Bearer {token}");
            connect_http_with(&url, &[("authorization", &auth), ("idempotency-key", key)]).await
        }
    };

    let alice_mcp = keyed(alice.clone(), "order-1").await;
    let first = call(&alice_mcp, "payments__charge", charge(70), None)
        .await
        .unwrap();
    let replay = call(&alice_mcp, "payments__charge", charge(70), None)
        .await
        .unwrap();
    assert_eq!(common::proxy::operation_note(&replay)["replayed"], true);

    // Mallory uses Alice's key: with the same request it is a request of its
    // own (no replay of Alice's result); with another request it is not a
    // conflict with Alice's, and nothing names her request's digest.
    let mallory_mcp = keyed(mallory.clone(), "order-1").await;
    let own = call(&mallory_mcp, "payments__charge", charge(70), None)
        .await
        .unwrap();
    assert_eq!(
        common::proxy::operation_note(&own)["replayed"],
        false,
        "{own:?}"
    );
    let mallory_other = keyed(mallory.clone(), "order-2").await;
    let alice_other = keyed(alice.clone(), "order-2").await;
    call(&alice_other, "payments__charge", charge(71), None)
        .await
        .unwrap();
    let guess = call(&mallory_other, "payments__charge", charge(72), None).await;
    assert!(
        guess.is_ok(),
        "another principal's key is not a conflict: {guess:?}"
    );
    let conflict = call(&alice_other, "payments__charge", charge(73), None)
        .await
        .unwrap_err();
    assert_eq!(conflict.0, -31003, "{conflict:?}");
    let digests: Vec<String> = db
        .query_scalars("SELECT request_digest FROM tool_operations")
        .await;
    assert!(
        digests.iter().all(|d| !conflict.1.contains(d.as_str())),
        "-31003 names no digest: {}",
        conflict.1
    );
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 4);
    let principals: Vec<(String, String, String)> = db
        .query_rows("SELECT kind, principal, task_id FROM agent_tasks ORDER BY principal, task_id")
        .await;
    let mut expected = vec![
        (
            "key".to_owned(),
            token_id(&alice).to_owned(),
            "order-1".to_owned(),
        ),
        (
            "key".to_owned(),
            token_id(&alice).to_owned(),
            "order-2".to_owned(),
        ),
        (
            "key".to_owned(),
            token_id(&mallory).to_owned(),
            "order-1".to_owned(),
        ),
        (
            "key".to_owned(),
            token_id(&mallory).to_owned(),
            "order-2".to_owned(),
        ),
    ];
    expected.sort_by(|a, b| (&a.1, &a.2).cmp(&(&b.1, &b.2)));
    assert_eq!(principals, expected);
    let _ = first;

    // JWTs: two subjects of one issuer are two principals; a JWT without
    // `sub` would be every token of its issuer at once, and is refused.
    let with_subject = |sub: &str| sign(json!({"sub": sub, "org": "tenant-a", "scope": "agent"}));
    let carol = keyed(with_subject("carol"), "order-1").await;
    let dave = keyed(with_subject("dave"), "order-1").await;
    for client in [&carol, &dave] {
        let answer = call(client, "payments__charge", charge(80), None)
            .await
            .unwrap();
        assert_eq!(common::proxy::operation_note(&answer)["replayed"], false);
    }
    let anonymous_jwt = sign(json!({"org": "tenant-a", "scope": "agent"}));
    let nobody = keyed(anonymous_jwt, "order-1").await;
    let before = fingerprint(&db).await;
    let refused = call(&nobody, "payments__charge", charge(80), None)
        .await
        .unwrap_err();
    assert_eq!(refused.0, -32602, "{refused:?}");
    assert!(refused.1.contains("sub"), "{}", refused.1);
    assert_eq!(fingerprint(&db).await, before, "nothing was written");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 6);

    for client in [
        alice_mcp,
        mallory_mcp,
        mallory_other,
        alice_other,
        carol,
        dave,
        nobody,
    ] {
        client.cancel().await.unwrap();
    }
    drop(served);
}

/// The console's browser side, attacked the way a hostile page would:
/// every page refuses framing and caching; a login without the login
/// page's form token is refused and starts no session; the cookie is a
/// session id, never the token, and a cookie holding the token itself is
/// not a login; logout needs its form's token and ends the session here,
/// so the copied cookie is dead after it.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_console_refuses_framing_and_forged_logins_and_logout_ends_its_session(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_with_auth(&db);
    let proxy = common::proxy::RunningProxy::start(&scenario.config_path()).await;
    let control = proxy.control_url.clone();
    let operator = create_token(&db, "tenant-a", "operator", Some("console-hardening")).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(common::DEADLINE)
        .build()
        .unwrap();
    let cookies = |response: &reqwest::Response| -> Vec<String> {
        response
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let hidden = |page: &str, name: &str| -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = page
            .find(&marker)
            .unwrap_or_else(|| panic!("{name} in {page}"))
            + marker.len();
        page[start..start + page[start..].find('"').unwrap()].to_owned()
    };

    // This process's own views are its tenant's (or an admin's): another
    // tenant's operator is refused them.
    let foreign = create_token(&db, "tenant-other", "operator", Some("console-hardening")).await;
    for path in ["/metrics", "/v1/upstreams", "/v1/durability"] {
        let view = |token: &str| {
            client
                .get(format!("{control}{path}"))
                .header("authorization", format!("Bearer {token}"))
                .send()
        };
        assert_eq!(view(&foreign).await.unwrap().status(), 403, "{path}");
        assert_eq!(view(&operator).await.unwrap().status(), 200, "{path}");
    }

    // A NUL byte in a path or a filter is bad input, not a ledger failure.
    for path in ["/v1/operations/a%00b", "/console/operations?tool=x%00y"] {
        let refused = client.get(format!("{control}{path}")).send().await.unwrap();
        assert_eq!(refused.status(), 400, "{path}");
        assert!(
            refused.text().await.unwrap().contains("invalid_input"),
            "{path}"
        );
    }

    // The login page: hardened, with a form token bound to its nonce cookie.
    let page = client
        .get(format!("{control}/console/login"))
        .send()
        .await
        .unwrap();
    for (name, wanted) in [
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ] {
        assert_eq!(page.headers()[name], wanted, "{name}");
    }
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    let nonce = cookies(&page)
        .into_iter()
        .find(|c| c.starts_with("lg_login="))
        .expect("the login form's nonce cookie");
    let nonce = nonce.split(';').next().unwrap().to_owned();
    let form_token = hidden(&page.text().await.unwrap(), "form_token");

    // A page of another origin posts the attacker's token: no form token
    // (it cannot read ours), or ours without the nonce cookie.
    for (cookie, token) in [
        (None, ""),
        (None, form_token.as_str()),
        (Some(nonce.as_str()), "0"),
    ] {
        let mut forged = client
            .post(format!("{control}/console/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={operator}&form_token={token}"));
        if let Some(cookie) = cookie {
            forged = forged.header("cookie", cookie);
        }
        let forged = forged.send().await.unwrap();
        assert_eq!(forged.status(), 303);
        assert!(
            forged.headers()["location"]
                .to_str()
                .unwrap()
                .contains("failed="),
            "{cookie:?} {token}"
        );
        assert!(
            !cookies(&forged)
                .iter()
                .any(|c| c.starts_with("lg_console=") && !c.starts_with("lg_console=;")),
            "a forged login starts no session"
        );
    }

    // The real form logs in; the cookie is a session id, not the token.
    let login = client
        .post(format!("{control}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", &nonce)
        .body(format!("token={operator}&form_token={form_token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(login.headers()["location"], "/console");
    let session = cookies(&login)
        .into_iter()
        .find(|c| c.starts_with("lg_console=") && !c.starts_with("lg_console=;"))
        .expect("a console session cookie");
    let session = session.split(';').next().unwrap().to_owned();
    assert!(!session.contains(&operator), "the cookie is not the token");
    let open = |cookie: String| {
        let request = client
            .get(format!("{control}/console"))
            .header("cookie", cookie);
        async move { request.send().await.unwrap() }
    };
    let overview = open(session.clone()).await;
    assert_eq!(overview.status(), 200);
    assert_eq!(overview.headers()["x-frame-options"], "DENY");
    let overview = overview.text().await.unwrap();
    // The token as the cookie is not a login.
    assert_eq!(open(format!("lg_console={operator}")).await.status(), 303);

    // Logout without its form token is refused and ends nothing.
    let forged = client
        .post(format!("{control}/console/logout"))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("form_token=0")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert_eq!(open(session.clone()).await.status(), 200);
    let logout = client
        .post(format!("{control}/console/logout"))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("form_token={}", hidden(&overview, "form_token")))
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), 303);
    // The copied cookie is dead: back to the login page.
    let after = open(session).await;
    assert_eq!(after.status(), 303);
    assert!(
        after.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/console/login")
    );
    proxy.stop().await;
}

/// MCP sessions with tokens required: a session answers only the token
/// that created it (another token naming its id gets 404, as for an
/// unknown one), and one token's sessions beyond its share evict its own
/// idle ones, never another token's.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_mcp_session_belongs_to_its_creator_and_one_token_cannot_evict_anothers(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = scenario_with_auth(&db);
    scenario.prepend_config("http_sessions = true");
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        format!(
            "{config}\n[limits]\nmax_sessions = 8\nmax_sessions_per_principal = 2\nrate_limit = 0\n"
        ),
    )
    .unwrap();
    let proxy = common::proxy::RunningProxy::start(&scenario.config_path()).await;
    let alice = create_token(&db, "tenant-a", "agent", Some("sessions-alice")).await;
    let mallory = create_token(&db, "tenant-a", "agent", Some("sessions-mallory")).await;
    let client = reqwest::Client::builder()
        .timeout(common::DEADLINE)
        .build()
        .unwrap();
    let post = |token: &str, session: Option<&str>, body: Value| {
        let mut request = client
            .post(&proxy.url)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let open = |token: &'static str| {
        let post = &post;
        async move {
            let answer = post(
                token,
                None,
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "sessions-test", "version": "1"}}}),
            )
            .await
            .unwrap();
            assert_eq!(answer.status(), 200);
            let id = answer.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_owned();
            let done = post(
                token,
                Some(&id),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .await
            .unwrap();
            assert_eq!(done.status(), 202);
            id
        }
    };
    let alice: &'static str = Box::leak(alice.into_boxed_str());
    let mallory: &'static str = Box::leak(mallory.into_boxed_str());
    let list = |token: &'static str, session: String| {
        let post = &post;
        async move {
            post(
                token,
                Some(&session),
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            )
            .await
            .unwrap()
            .status()
            .as_u16()
        }
    };

    let first = open(alice).await;
    let theirs = open(mallory).await;
    assert_eq!(list(alice, first.clone()).await, 200);
    // Another token that knows the id gets what an unknown id gets.
    assert_eq!(list(mallory, first.clone()).await, 404);
    assert_eq!(
        list(alice, first.clone()).await,
        200,
        "the session lives on"
    );

    // Mallory opens more than its share: its own oldest idle session goes,
    // Alice's stays.
    let _second = open(mallory).await;
    let _third = open(mallory).await;
    assert_eq!(list(mallory, theirs).await, 404, "evicted: its own oldest");
    assert_eq!(
        list(alice, first).await,
        200,
        "another token's session stays"
    );
    proxy.stop().await;
}
