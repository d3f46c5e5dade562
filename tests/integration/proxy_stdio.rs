//! The other pair of transports: an agent that spawns `leasegate stdio` as
//! its MCP server, with the tool server reached over Streamable HTTP.

use crate::common;
use crate::common::proxy::charge_eur;

use common::TestDb;
use common::proxy::{
    Agent, AgentClient, LEASEGATE, call, http_tool_server, lease_meta, operation_note,
};
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The example payments server over Streamable HTTP on an ephemeral port,
/// its state in `dir/state`; returns the child and its MCP URL.
async fn payments_over_http(dir: &std::path::Path) -> (tokio::process::Child, String) {
    let (tools, address) =
        http_tool_server("payments", "127.0.0.1:0", &dir.join("state"), &[]).await;
    (tools, format!("http://{address}/mcp"))
}

/// `leasegate stdio` in front of the example payments server over
/// Streamable HTTP (charges with an idempotency key, a read-only lookup):
/// its directory, the tool server and the agent's client.
async fn stdio_in_front_of_payments_over_http(
    db: &TestDb,
) -> (std::path::PathBuf, tokio::process::Child, AgentClient) {
    let dir =
        std::env::temp_dir().join(format!("leasegate-stdio-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("adapters")).unwrap();
    let (tools, url) = payments_over_http(&dir).await;
    std::fs::write(
        dir.join("leasegate.toml"),
        format!(
            "database_url = \"{}\"\ntenant = \"tenant-a\"\nadapters = \"adapters\"\nmigrate = false\n\
             [upstreams.payments]\ntransport = \"streamable_http\"\nurl = \"{url}\"\n",
            db.url
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("adapters/payments.toml"),
        "upstream = \"payments\"\n[tools.charge]\ncapability = \"idempotency_key\"\n\
         operation_id_argument = \"idempotency_key\"\nkey_retention = \"24h\"\n[tools.get_charge]\nread_only = true\n",
    )
    .unwrap();
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .arg("stdio")
        .arg("--config")
        .arg(dir.join("leasegate.toml"));
    let agent = Agent::default()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .expect("leasegate stdio answers initialize");
    (dir, tools, agent)
}

/// An HTTP tool server that is gone refuses the connection: nothing left,
/// so the call is answered "not sent" (-31011), the operation stays
/// sendable (`prepared`, with the refusal as evidence) instead of
/// `unknown`, and the tool recorded nothing.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_refused_http_connection_is_not_sent_and_leaves_the_operation_sendable(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (dir, mut tools, agent) = stdio_in_front_of_payments_over_http(&db).await;
    let (lease, _) = db.running_run("stdio-agent", 60_000).await;
    call(
        &agent,
        "payments__charge",
        json!({"amount": 1, "currency": "usd"}),
        Some(lease_meta(&lease)),
    )
    .await
    .expect("the tool server answers while it runs");
    tools.kill().await.unwrap();

    let (code, message) = call(
        &agent,
        "payments__charge",
        json!({"amount": 2, "currency": "usd"}),
        Some(lease_meta(&lease)),
    )
    .await
    .unwrap_err();
    assert_eq!(code, -31011, "not sent: {message}");
    assert!(
        message.contains("could not be reached") && !message.contains("leasegate::"),
        "says why, without leasegate's type names: {message}"
    );
    let statuses: Vec<String> = db
        .scalars(
            "SELECT status FROM tool_operations WHERE run_id = $1 ORDER BY created_at",
            lease.run_id.as_uuid(),
        )
        .await;
    assert_eq!(statuses, vec!["succeeded", "prepared"]);
    let charges = std::fs::read_to_string(dir.join("state/charges.jsonl")).unwrap();
    assert_eq!(
        charges.lines().count(),
        1,
        "the refused call charged nothing"
    );

    agent.cancel().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn stdio_front_with_an_http_upstream_deduplicates_and_replays(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (dir, mut tools, agent) = stdio_in_front_of_payments_over_http(&db).await;

    let names = common::proxy::tool_names(&agent).await;
    assert_eq!(names, vec!["payments__charge", "payments__get_charge"]);

    let (lease, _) = db.running_run("stdio-agent", 60_000).await;
    let charge = json!({"amount": 42, "currency": "usd"});
    let first = call(
        &agent,
        "payments__charge",
        charge.clone(),
        Some(lease_meta(&lease)),
    )
    .await
    .unwrap();
    let second = call(&agent, "payments__charge", charge, Some(lease_meta(&lease)))
        .await
        .unwrap();
    assert_eq!(operation_note(&first)["replayed"], false);
    assert_eq!(operation_note(&second)["replayed"], true);
    let charges = std::fs::read_to_string(dir.join("state/charges.jsonl")).unwrap();
    assert_eq!(
        charges.lines().count(),
        1,
        "one side effect through stdio + HTTP"
    );

    // Over stdio there are no headers: a call without _meta lease is refused.
    let (code, _) = call(
        &agent,
        "payments__charge",
        json!({"amount": 1, "currency": "usd"}),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(code, -31001);

    agent.cancel().await.unwrap();
    tools.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_explicit_cancel_from_the_agent_reaches_the_upstream(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, RequestMetaObject};
    use rmcp::service::PeerRequestOptions;

    let db = TestDb::new(pool, connect).await;
    let scenario = common::proxy::Scenario::new(&db.url, "claim_ttl = \"60s\"\n");
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .arg("stdio")
        .arg("--config")
        .arg(scenario.config_path());
    let agent = Agent::default()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();
    let (lease, _) = db.running_run("agent", 60_000).await;

    let mut meta = RequestMetaObject::new();
    for (key, value) in lease_meta(&lease) {
        meta.insert(key, value);
    }
    let params = CallToolRequestParams::new("mailer__send_email").with_arguments(
        json!({"to": "x@y.z", "hang_ms": 20000})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let handle = agent
        .peer()
        .send_request_with_option(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options().with_meta(meta),
        )
        .await
        .unwrap();
    common::wait_until("the email to reach the tool", || async {
        (scenario.side_effects("emails.jsonl").len() == 1).then_some(())
    })
    .await;
    handle
        .cancel(Some("the user changed their mind".into()))
        .await
        .unwrap();
    common::wait_until("the cancel to reach the tool", || async {
        scenario
            .side_effects("calls.jsonl")
            .iter()
            .any(|c| c["cancelled"] == true)
            .then_some(())
    })
    .await;
    // The side effect may have happened: the operation is not failed.
    let status: String = common::wait_until("the operation to leave dispatching", || async {
        let status: String = db.query_scalar("SELECT status FROM tool_operations").await;
        (status != "dispatching").then_some(status)
    })
    .await;
    assert_eq!(
        status, "unknown",
        "a cancelled call with a possible side effect is unknown, never failed"
    );
    agent.cancel().await.unwrap();
}

/// `operation_id_header`: the operation id travels as an HTTP header of the
/// one `tools/call` POST to a Streamable HTTP upstream (here the example
/// payments server, which takes its idempotency key from `Idempotency-Key`).
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_operation_id_reaches_an_http_upstream_as_a_per_call_header(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let dir = std::env::temp_dir().join(format!(
        "leasegate-header-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(dir.join("adapters")).unwrap();
    let (mut tools, url) = payments_over_http(&dir).await;
    std::fs::write(
        dir.join("leasegate.toml"),
        format!(
            "database_url = \"{}\"\ntenant = \"tenant-a\"\nadapters = \"adapters\"\nmigrate = false\n\
             [upstreams.payments]\ntransport = \"streamable_http\"\nurl = \"{url}\"\n",
            db.url
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("adapters/payments.toml"),
        "upstream = \"payments\"\n[tools.charge]\ncapability = \"idempotency_key\"\n\
         operation_id_header = \"Idempotency-Key\"\nkey_retention = \"24h\"\n",
    )
    .unwrap();
    let proxy = common::proxy::RunningProxy::start(&dir.join("leasegate.toml")).await;
    let (lease, _) = db.running_run("header-agent", 60_000).await;
    let (agent, _) = common::proxy::connect_http(&proxy.url, None).await;
    let first = charge_eur(&agent, 7, Some(lease_meta(&lease)))
        .await
        .unwrap();
    let operation_id = operation_note(&first)["operation_id"].clone();
    let charges: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("state/charges.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(charges.len(), 1);
    assert_eq!(
        charges[0]["idempotency_key"], operation_id,
        "the charge was keyed by the Idempotency-Key header carrying the operation id"
    );
    agent.cancel().await.unwrap();
    proxy.stop().await;
    tools.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}
