//! `leasegate_agent_calls_total` by lease mode and front: calls of an
//! agent leasegate holds the lease for (a task key over MCP sessions, an
//! idempotency key over stateless HTTP) are counted under their mode and
//! front, and an answer that waited on the same call in flight is counted
//! apart from a replay of a call that had ended; the console's overview
//! shows the calls per second and the answers from the ledger from those
//! counts. (Explicit leases and refusals:
//! `proxy_e2e::every_agent_call_is_counted_by_outcome`.)

use crate::common;

use common::proxy::{RunningProxy, Scenario, call, connect_http_with, operation_note};
use common::{TestDb, http, wait_until};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "in_flight_wait = \"10s\"\nclaim_ttl = \"60s\"\n";

/// The sums of `leasegate_agent_calls_total` over each label set, read
/// from `control`'s `/metrics` (the recorder is the process's: other
/// tests count too, so callers compare before and after).
async fn counts<const N: usize>(control: &str, series: &[Vec<(&str, &str)>; N]) -> [f64; N] {
    let text = http::get(&format!("{control}/metrics")).await.body;
    std::array::from_fn(|index| {
        common::prometheus::sum(&text, "leasegate_agent_calls_total", &series[index])
    })
}

/// The number in the console overview's tile `id` (`None`: "—").
fn tile(page: &str, id: &str) -> Option<f64> {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no tile {id}: {page}"));
    let value = &page[at..];
    let value = &value[value.find("class=\"value\">").unwrap() + "class=\"value\">".len()..];
    value[..value.find('<').unwrap()].trim().parse().ok()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn lease_mode_calls_are_counted_by_mode_and_front_and_a_waited_on_answer_apart(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let sessions = Scenario::new(&db.url, POLICY);
    sessions.prepend_config("lease_mode = \"session\"\nhttp_sessions = true");
    let session_proxy = RunningProxy::start(&sessions.config_path()).await;
    let keys = Scenario::new(&db.url, POLICY);
    keys.prepend_config("lease_mode = \"key\"");
    let key_proxy = RunningProxy::start(&keys.config_path()).await;

    let charge = |outcome: &'static str, replayed: &'static str| {
        vec![
            ("path", "gated"),
            ("tool", "payments__charge"),
            ("outcome", outcome),
            ("replayed", replayed),
        ]
    };
    let with = |mut labels: Vec<(&'static str, &'static str)>,
                more: &[(&'static str, &'static str)]| {
        labels.extend_from_slice(more);
        labels
    };
    let series = [
        with(
            charge("succeeded", "false"),
            &[("front", "http_sessions"), ("mode", "session")],
        ),
        with(
            charge("succeeded", "waited"),
            &[("front", "http_sessions"), ("mode", "session")],
        ),
        with(
            charge("succeeded", "true"),
            &[("front", "http_sessions"), ("mode", "session")],
        ),
        with(
            charge("succeeded", "false"),
            &[("front", "http_stateless"), ("mode", "key")],
        ),
        with(
            charge("succeeded", "true"),
            &[("front", "http_stateless"), ("mode", "key")],
        ),
    ];
    let before = counts(&session_proxy.control_url, &series).await;
    let console = format!("{}/console", session_proxy.control_url);
    let first_page = http::get(&console).await;
    assert_eq!(first_page.status, 200, "{}", first_page.body);
    let replays_before = tile(&first_page.body, "replays").expect("metrics on the console");

    // Session mode over MCP sessions: a slow charge, the same call again
    // while it is in flight (it waits for the first's answer), then once
    // more after it ended (a replay).
    let agent = std::sync::Arc::new(
        connect_http_with(&session_proxy.url, &[("leasegate-task", "counted-task")]).await,
    );
    let slow = json!({"amount": 8, "currency": "eur", "hang_ms": 1500});
    let first = common::proxy::spawn_call(&agent, "payments__charge", slow.clone());
    wait_until("the slow charge to be in flight", || async {
        let dispatching: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tool_operations WHERE status = 'dispatching'")
                .fetch_one(&db.admin)
                .await
                .unwrap();
        (dispatching == 1).then_some(())
    })
    .await;
    let waited = call(&agent, "payments__charge", slow.clone(), None)
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(operation_note(&first)["replayed"], false, "{first:?}");
    assert_eq!(operation_note(&waited)["replayed"], true, "{waited:?}");
    let replayed = call(&agent, "payments__charge", slow, None).await.unwrap();
    assert_eq!(operation_note(&replayed)["replayed"], true);
    assert_eq!(sessions.side_effects("charges.jsonl").len(), 1);

    // Key mode over stateless HTTP: a key's call, then the same again.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "payments__charge", "arguments": {"amount": 9, "currency": "eur"}}})
    .to_string();
    for expected in [false, true] {
        let answer =
            http::post_mcp(&key_proxy.url, &[("idempotency-key", "counted-key")], &body).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let answer: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(
            answer["result"]["_meta"]["dev.leasegate/operation"]["replayed"], expected,
            "{answer}"
        );
    }

    let after = counts(&session_proxy.control_url, &series).await;
    common::prometheus::assert_each_grew(&series, &before, &after);
    // The overview: calls since its last load, and the three answers from
    // the ledger (the waited one, the session replay, the key replay).
    let page = http::get(&console).await.body;
    assert!(
        tile(&page, "calls-per-second").is_some_and(|rate| rate > 0.0),
        "{page}"
    );
    assert!(
        tile(&page, "replays").is_some_and(|replays| replays >= replays_before + 3.0),
        "{replays_before}: {page}"
    );
    drop(agent);
    session_proxy.stop().await;
    key_proxy.stop().await;
}
