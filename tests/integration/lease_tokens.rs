//! Unforgeable leases end to end. A forger reads the run
//! id, owner and epoch from `GET /v1/runs/{id}` — they are public — and
//! sends them without the lease token, or with a wrong one: the MCP front
//! (headers and `_meta`) and every lease-fenced control-API route refuse
//! it, nothing is written and nothing reaches the tool; the holder with its
//! token goes on; the token is in no GET answer and no `ledger_events` row;
//! the refusals are counted in `protected_write_rejected_total`.

use crate::common;
use crate::common::proxy::send_email;

use common::proxy::{RunningProxy, connect_http, lease_meta};
use common::{TestDb, http, prometheus};
use leasegate::ledger::{LeaseClaim, LeaseToken, RunId};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "claim_ttl = \"60s\"\n";

/// Runs, leases, events and operations as the superuser reads them.
async fn ledger_state(db: &TestDb) -> String {
    db.query_scalar(
        "SELECT concat_ws('|',
           (SELECT string_agg(row_to_json(r)::text, ',' ORDER BY run_id) FROM agent_runs r),
           (SELECT string_agg(row_to_json(l)::text, ',' ORDER BY run_id) FROM worker_leases l),
           (SELECT count(*)::text FROM ledger_events),
           (SELECT count(*)::text FROM tool_operations))",
    )
    .await
}

async fn post_json(url: &str, body: Value) -> (u16, Value) {
    let answer = http::post(
        url,
        &[("content-type", "application/json")],
        &body.to_string(),
    )
    .await;
    (
        answer.status,
        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
    )
}

/// A raw `tools/call` with `headers`; the JSON-RPC answer.
async fn raw_call(url: &str, headers: &[(&str, &str)], meta: Value) -> Value {
    let response = http::post_mcp(
        url,
        headers,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "mailer__send_email", "arguments": {"to": "victim@example.com"},
                           "_meta": meta}})
        .to_string(),
    )
    .await;
    response.json_rpc()
}

fn rejected_total(metrics: &str) -> f64 {
    prometheus::sum(
        metrics,
        "protected_write_rejected_total",
        &[("reason", "lease_token_invalid")],
    )
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_lease_read_from_the_api_without_its_token_is_refused_everywhere(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let control = format!("{}/v1", proxy.control_url);

    // The holder: a run created with its lease, started.
    let (status, created) = post_json(
        &format!("{control}/runs"),
        json!({"tenant_id": "tenant-a", "task_id": "victim", "owner": "holder", "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let run_id = created["run_id"].as_str().unwrap().to_owned();
    let token = created["lease_token"].as_str().unwrap().to_owned();
    assert!(
        token.starts_with("lgl_") && token.len() >= 4 + 43,
        "{token}"
    );
    let holder = |extra: Value| {
        let mut body = json!({"owner": "holder", "epoch": 1, "lease_token": token});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let (status, started) = post_json(
        &format!("{control}/runs/{run_id}/start"),
        holder(json!({"expected_revision": 0})),
    )
    .await;
    assert_eq!(status, 200, "{started}");

    // The forger reads the lease's identity.
    let shown = http::get(&format!("{control}/runs/{run_id}")).await;
    assert_eq!(shown.status, 200);
    assert!(!shown.body.contains(&token[4..]), "{}", shown.body);
    let run: Value = serde_json::from_str(&shown.body).unwrap();
    let (owner, epoch) = (
        run["lease"]["owner"].as_str().unwrap().to_owned(),
        run["lease"]["epoch"].as_i64().unwrap(),
    );
    assert_eq!((owner.as_str(), epoch), ("holder", 1));

    let before = ledger_state(&db).await;
    let metrics_before = rejected_total(
        &http::get(&format!("{}/metrics", proxy.control_url))
            .await
            .body,
    );

    // Every lease-fenced control route, without a token and with a wrong one.
    let routes: [(&str, Value); 6] = [
        ("lease/renew", json!({"ttl_ms": 60000})),
        ("lease/release", json!({})),
        (
            "checkpoint",
            json!({"expected_revision": 1, "checkpoint": {"forged": true},
                   "intents": [{"tool": "mailer__send_email", "arguments": {"to": "x@y.z"}, "step_id": "s"}]}),
        ),
        ("start", json!({"expected_revision": 1})),
        ("complete", json!({"expected_revision": 1})),
        ("fail", json!({"expected_revision": 1, "reason": "forged"})),
    ];
    let mut refusals = 0.0;
    for forged_token in [
        None,
        Some("lgl_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
    ] {
        for (route, extra) in &routes {
            let mut body = json!({"owner": owner, "epoch": epoch});
            if let Some(forged) = forged_token {
                body["lease_token"] = json!(forged);
            }
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let (status, answer) =
                post_json(&format!("{control}/runs/{run_id}/{route}"), body).await;
            assert_eq!(
                (status, answer["code"].as_str()),
                (403, Some("lease_token_invalid")),
                "{route}: {answer}"
            );
            let fault = if forged_token.is_some() {
                "wrong"
            } else {
                "missing"
            };
            assert_eq!(answer["detail"]["fault"], fault, "{route}: {answer}");
            assert!(!answer.to_string().contains(&token[4..]));
            refusals += 1.0;
        }
    }

    // The MCP front: headers and _meta, without a token and with a wrong one.
    let forged = LeaseClaim {
        run_id: run_id.parse::<RunId>().unwrap(),
        owner: owner.clone(),
        epoch,
        token: None,
    };
    let (agent, _) = connect_http(&proxy.url, Some(&forged)).await;
    let (code, message) = send_email(&agent, "victim@example.com", None)
        .await
        .expect_err("no token, refused");
    assert_eq!(code, -31002, "{message}");
    assert!(
        message.contains("no lease token was presented"),
        "{message}"
    );
    assert!(message.contains("Leasegate-Lease-Token"), "{message}");
    let wrong = LeaseClaim {
        token: Some(LeaseToken::generate()),
        ..forged.clone()
    };
    let (code, message) = send_email(&agent, "victim@example.com", Some(lease_meta(&wrong)))
        .await
        .expect_err("a wrong token in _meta, refused");
    assert_eq!(code, -31002, "{message}");
    assert!(message.contains("is not this lease's"), "{message}");
    let rid = run_id.clone();
    let epoch_text = epoch.to_string();
    let answer = raw_call(
        &proxy.url,
        &[
            ("leasegate-run-id", rid.as_str()),
            ("leasegate-owner", owner.as_str()),
            ("leasegate-epoch", epoch_text.as_str()),
            ("leasegate-lease-token", "lgl_guess"),
        ],
        json!({}),
    )
    .await;
    assert_eq!(answer["error"]["code"], -31002, "{answer}");
    assert_eq!(
        (
            answer["error"]["data"]["reason"].as_str(),
            answer["error"]["data"]["fault"].as_str()
        ),
        (Some("lease_token_invalid"), Some("wrong")),
        "{answer}"
    );
    let answer = raw_call(
        &proxy.url,
        &[],
        json!({"dev.leasegate/lease": {"run_id": rid, "owner": owner, "epoch": epoch}}),
    )
    .await;
    assert_eq!(
        answer["error"]["data"]["fault"].as_str(),
        Some("missing"),
        "{answer}"
    );
    refusals += 4.0;

    assert_eq!(ledger_state(&db).await, before, "nothing written");
    assert!(
        scenario.side_effects("emails.jsonl").is_empty(),
        "nothing reached the tool"
    );
    let metrics_after = rejected_total(
        &http::get(&format!("{}/metrics", proxy.control_url))
            .await
            .body,
    );
    assert!(
        metrics_after - metrics_before >= refusals,
        "{metrics_before} -> {metrics_after}, {refusals} refusals"
    );

    // The holder with its token: its call goes through, its writes apply.
    let real = LeaseClaim {
        token: Some(LeaseToken::presented(&token)),
        ..forged.clone()
    };
    let (holder_agent, _) = connect_http(&proxy.url, Some(&real)).await;
    send_email(&holder_agent, "friend@example.com", None)
        .await
        .expect("the holder's call");
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    let (status, answer) = post_json(
        &format!("{control}/runs/{run_id}/lease/renew"),
        holder(json!({"ttl_ms": 60000})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = post_json(
        &format!("{control}/runs/{run_id}/complete"),
        holder(json!({"expected_revision": 1})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = post_json(
        &format!("{control}/runs/{run_id}/lease/release"),
        holder(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    // The token is in no answer of a read and in no event.
    let shown = http::get(&format!("{control}/runs/{run_id}")).await;
    assert!(!shown.body.contains(&token[4..]), "{}", shown.body);
    let operations = http::get(&format!("{control}/runs/{run_id}/operations")).await;
    assert!(!operations.body.contains(&token[4..]));
    let events: Vec<String> = db
        .query_scalars("SELECT row_to_json(e)::text FROM ledger_events e")
        .await;
    assert!(!events.is_empty());
    for event in events {
        assert!(!event.contains(&token[4..]), "{event}");
    }
    proxy.stop().await;
}
