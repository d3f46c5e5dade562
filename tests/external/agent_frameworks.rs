//! The MCP clients of fastmcp, pydantic-ai and the Vercel AI SDK
//! (`@ai-sdk/mcp`), in their default settings and with no LLM, against real
//! leasegate processes and the example tool server: what their user or
//! model reads of a replay, a refusal, an unknown outcome and a start-up
//! failure, how a pydantic-ai agent run ends when leasegate refuses its
//! calls, and a stdio session the Vercel client ends with SIGTERM. LangGraph
//! and OpenAI Agents SDK runs whose task key is their own thread or group id,
//! going on after a run died past its charge. The clients are driven by
//! `tests/sdk/agent_clients.py` (venv `target/agents-venv`),
//! `tests/sdk/frameworks.py` (`target/frameworks-venv`) and
//! `tests/sdk/vercel.mjs` (`target/sdk-node`), provisioned by
//! `common::peers`; the side effects and ledger rows are counted here.

use crate::common;

use common::proxy::{LEASEGATE, Scenario, ServedChild};
use common::{TestDb, wait_until};
use leasegate::mcp::convert::{OUTCOME_KEY, codes};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const REPLAYED: &str = "[leasegate] replayed: ";

/// Runs `program script args` (with `env`), which must exit 0 within two
/// minutes; returns the JSON lines it printed.
async fn run_script(
    program: std::path::PathBuf,
    script: &str,
    args: &[String],
    env: &[(&str, std::path::PathBuf)],
) -> Vec<Value> {
    let script = format!("{}/tests/sdk/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut command = tokio::process::Command::new(program);
    command.arg(&script).args(args).kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} {args:?} did not finish in 120 s"))
        .expect("the script's interpreter runs");
    assert!(
        output.status.success(),
        "{script} {args:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        common::peers::stderr_tail(&output)
    );
    common::peers::json_lines(&output)
}

async fn agents_py(args: &[&str]) -> Vec<Value> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    run_script(
        common::peers::agents_python(),
        "agent_clients.py",
        &args,
        &[],
    )
    .await
}

async fn frameworks_py(args: &[&str]) -> Vec<Value> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    run_script(
        common::peers::frameworks_python(),
        "frameworks.py",
        &args,
        &[],
    )
    .await
}

async fn vercel_mjs(args: &[&str]) -> Vec<Value> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let node_packages = common::peers::sdk_node();
    run_script(
        "node".into(),
        "vercel.mjs",
        &args,
        &[("SDK_NODE", node_packages)],
    )
    .await
}

/// The line of `lines` whose `field` is `value`.
fn line<'a>(lines: &'a [Value], field: &str, value: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l[field] == value)
        .unwrap_or_else(|| panic!("no {field} = {value} in {lines:#?}"))
}

/// A structured result without leasegate's sentence: the tool's own fields.
fn own_fields(structured: &Value) -> Value {
    let mut own = structured.clone();
    own.as_object_mut().expect("an object").remove(OUTCOME_KEY);
    own
}

fn says_replayed(value: &Value) -> bool {
    value.as_str().is_some_and(|s| s.starts_with(REPLAYED))
}

fn says_unknown(value: &Value) -> bool {
    value.as_str().is_some_and(|s| {
        s.starts_with("outcome unknown for operation")
            && s.contains("do not retry it under a new step")
    })
}

/// `leasegate serve` in lease mode `key` in front of the example tools.
async fn key_mode_proxy(db: &TestDb) -> (Scenario, ServedChild) {
    let scenario = Scenario::new(&db.url, "claim_ttl = \"4s\"\n");
    scenario.surround_config("lease_mode = \"key\"", "");
    let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    (scenario, served)
}

/// `leasegate serve` in lease mode `session` in front of the example tools:
/// a call's task is its `Leasegate-Task` header.
async fn session_mode_proxy(db: &TestDb) -> (Scenario, ServedChild) {
    let scenario = Scenario::new(&db.url, "claim_ttl = \"4s\"\n");
    scenario.surround_config("lease_mode = \"session\"", "");
    let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    (scenario, served)
}

/// One conversation of `framework` (`langgraph-thread`, `openai-group` of
/// `tests/sdk/frameworks.py`) under the thread or group id `identity`,
/// which is also its `Leasegate-Task`: a run that dies after its charge of
/// 500 was answered, then the run that goes on and asks for the charge
/// again (`replan`: with another `idempotency_key`). Returns the two calls,
/// (first, again), once the second was answered from the ledger: the first
/// call's operation, replayed, and the model reads that it was.
async fn conversation(framework: &str, url: &str, identity: &str, replan: bool) -> (Value, Value) {
    let mut args = vec![
        framework, "--url", url, "--thread", identity, "--amount", "500",
    ];
    if replan {
        args.push("--replan");
    }
    let lines = frameworks_py(&args).await;
    let [first, again] = <[Value; 2]>::try_from(lines).expect("two charge calls");
    let (sent, replayed) = (&first["operation"], &again["operation"]);
    assert_eq!(sent["replayed"], false, "{first}");
    assert_eq!(replayed["replayed"], true, "{identity}: {again}");
    assert_eq!(replayed["operation_id"], sent["operation_id"], "{again}");
    let read = again["model_read"].as_str().unwrap_or_default();
    assert!(
        read.lines().any(|l| l.starts_with(REPLAYED)),
        "the model reads that the charge was not made again: {again}"
    );
    (first, again)
}

/// The tool's charges: its record of each, by leasegate's operation id
/// (sent as the charge's `idempotency_key`).
fn charged_operations(scenario: &Scenario) -> Vec<Value> {
    scenario
        .side_effects("charges.jsonl")
        .iter()
        .map(|charge| charge["idempotency_key"].clone())
        .collect()
}

/// A run per conversation of `framework` under two thread or group ids,
/// each dying after its charge and going on with the same arguments: one
/// charge per id, the second call of each answered from the ledger, and
/// one session task per id, named by it.
async fn one_charge_per_conversation(db: &TestDb, framework: &str, identities: [&str; 2]) {
    let (scenario, served) = session_mode_proxy(db).await;
    let (first, _) = conversation(framework, &served.mcp, identities[0], false).await;
    assert_eq!(
        charged_operations(&scenario),
        [first["operation"]["operation_id"].clone()],
        "one charge for {}",
        identities[0]
    );
    let (other, _) = conversation(framework, &served.mcp, identities[1], false).await;
    assert_eq!(
        charged_operations(&scenario),
        [
            first["operation"]["operation_id"].clone(),
            other["operation"]["operation_id"].clone()
        ],
        "another id, another task: its charge is made"
    );
    let tasks: Vec<String> = db
        .query_scalars("SELECT task_id FROM agent_tasks WHERE kind = 'session' ORDER BY task_id")
        .await;
    let mut named = identities.map(str::to_owned).to_vec();
    named.sort();
    assert_eq!(tasks, named, "the task keys are the framework's ids");
    assert_eq!(db.row_count("tool_operations").await, 2);
    let calls = scenario.side_effects("calls.jsonl");
    assert_eq!(calls.len(), 2, "the tool was called once per id: {calls:?}");
}

/// A conversation of `framework` whose run dies after its charge and whose
/// model, in the run that goes on, asks for the charge again with another
/// `idempotency_key` (the argument the payments adapter writes its
/// operation id to, so not part of the call's identity): the same intent,
/// answered from the ledger, one charge.
async fn one_charge_for_a_replanned_call(db: &TestDb, framework: &str, identity: &str) {
    let (scenario, served) = session_mode_proxy(db).await;
    let (first, again) = conversation(framework, &served.mcp, identity, true).await;
    let (mut planned, mut replanned) = (first["arguments"].clone(), again["arguments"].clone());
    let keys = (
        planned.as_object_mut().unwrap().remove("idempotency_key"),
        replanned.as_object_mut().unwrap().remove("idempotency_key"),
    );
    assert!(keys.0.is_some() && keys.0 != keys.1, "{first} {again}");
    assert_eq!(planned, replanned, "the calls differ only in their key");
    assert_eq!(
        charged_operations(&scenario),
        [first["operation"]["operation_id"].clone()],
        "one charge"
    );
    let calls = scenario.side_effects("calls.jsonl");
    assert_eq!(calls.len(), 1, "the tool was called once: {calls:?}");
}

/// A LangGraph agent graph (checkpointer, `ToolNode` of the adapters'
/// tools) whose tool interceptor sends the run's `thread_id` as
/// `Leasegate-Task`: the worker dies after the charge was answered, before
/// the tool step is checkpointed; a new client and graph resume the thread
/// from its checkpoint and run the tool step again. One charge per thread.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_langgraph_thread_resumed_from_its_checkpoint_is_charged_once_and_another_thread_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    one_charge_per_conversation(
        &db,
        "langgraph-thread",
        ["thread-order-42", "thread-order-43"],
    )
    .await;
}

/// A LangGraph thread whose run died after its charge, taken up again with
/// the user's message: the planner asks for the charge anew with another
/// `idempotency_key`, and the call is answered from the ledger.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_langgraph_thread_whose_model_asks_again_with_another_idempotency_key_is_charged_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    one_charge_for_a_replanned_call(&db, "langgraph-thread", "thread-order-44").await;
}

/// OpenAI Agents SDK runs (the SDK's scripted model) under
/// `RunConfig(group_id)`, whose MCP server sends that group id as
/// `Leasegate-Task`: the model provider fails after the charge was
/// answered, the app runs the turn again under the same group id with a new
/// server connection, and the model asks for the charge again. One charge
/// per group.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_agents_sdk_turn_run_again_under_its_group_id_is_charged_once_and_another_group_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    one_charge_per_conversation(&db, "openai-group", ["chat-order-42", "chat-order-43"]).await;
}

/// An Agents SDK turn run again under its group id whose model asks for the
/// charge with another `idempotency_key`: answered from the ledger.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_agents_sdk_turn_whose_model_asks_again_with_another_idempotency_key_is_charged_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    one_charge_for_a_replanned_call(&db, "openai-group", "chat-order-44").await;
}

/// Each client's user or model reads, in what the client hands on by
/// default, that a repeated call was answered from the ledger and not sent
/// again, why a call without a key was refused, and that a call whose tool
/// did not answer in time has an unknown outcome not to be retried under a
/// new step: fastmcp (its `CallToolResult`: content and structured content;
/// a tool error raised with its text), pydantic-ai (what its model is
/// handed: the structured content alone, so the sentences must be there)
/// and the Vercel AI SDK (the tool's `toModelOutput`: the content blocks).
/// Refusals carry leasegate's own code. One charge per key.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn each_clients_model_reads_a_replay_a_refusal_and_an_unknown_outcome(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, served) = key_mode_proxy(&db).await;
    let url = served.mcp.as_str();

    let fastmcp = agents_py(&["--url", url, "--key", "fastmcp-1", "replay-fastmcp"]).await;
    let (first, again) = (
        line(&fastmcp, "call", "first"),
        line(&fastmcp, "call", "again"),
    );
    assert_eq!(first["note"]["replayed"], false, "{first}");
    assert_eq!(again["note"]["replayed"], true, "{again}");
    assert!(
        first["structured"][OUTCOME_KEY].is_null(),
        "a fresh answer is the tool's own: {first}"
    );
    assert!(says_replayed(&again["structured"][OUTCOME_KEY]), "{again}");
    assert_eq!(own_fields(&again["structured"]), first["structured"]);
    let texts = again["texts"].as_array().unwrap();
    assert!(says_replayed(texts.last().unwrap()), "{again}");
    let refused = line(&fastmcp, "call", "unkeyed");
    assert_refused_without_a_lease(refused);

    let unknown = line(&fastmcp, "call", "unknown");
    assert!(says_unknown(&unknown["error"]), "{unknown}");

    let pydantic = agents_py(&["--url", url, "--key", "pydantic-1", "replay-pydantic-ai"]).await;
    let (first, again) = (line(&pydantic, "run", "0"), line(&pydantic, "run", "1"));
    // What the model was handed: the structured content, as a dict.
    assert!(first["model_read"]["charge_id"].is_string(), "{first}");
    assert!(first["model_read"][OUTCOME_KEY].is_null(), "{first}");
    assert!(says_replayed(&again["model_read"][OUTCOME_KEY]), "{again}");
    assert_eq!(own_fields(&again["model_read"]), first["model_read"]);
    // An error's structured content, as the retry text the model reads.
    let unknown = line(&pydantic, "run", "2");
    let read = unknown["model_read"].as_str().unwrap();
    assert!(
        read.contains("\"status\":\"unknown\"")
            && read.contains("Do not retry it under a new step"),
        "{unknown}"
    );

    let vercel = vercel_mjs(&["replay", "--url", url, "--key", "vercel-1"]).await;
    let read = |call: &str| -> Vec<Value> {
        let read = &line(&vercel, "call", call)["model_read"];
        assert_eq!(read["type"], "content", "{read}");
        read["value"].as_array().unwrap().clone()
    };
    let (first, again) = (read("first"), read("again"));
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(says_replayed(&again.last().unwrap()["text"]), "{again:?}");
    assert_eq!(again[0], first[0], "the tool's own answer first");
    let unknown = read("unknown");
    assert!(says_unknown(&unknown[0]["text"]), "{unknown:?}");
    let refused = line(&vercel, "call", "unkeyed");
    assert_refused_without_a_lease(refused);

    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        6,
        "one charge per key, none for the refused calls"
    );
}

// A counter's value in a Prometheus text page: the sum over the lines of
// `name` whose labels include every one of `labels`.
fn counter(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A pydantic-ai agent with default settings whose model asks, each turn,
/// for a keyed charge (which hangs a while after charging) and an unkeyed
/// one at once, over a leasegate in key mode. pydantic-ai turns the
/// `-31001` refusal into a retry prompt (the model reads why); at its
/// default retry limit the run fails and pydantic-ai cancels the keyed call
/// still in flight. Nothing of the refused calls reaches the tool; the
/// cancelled call, sent before the run failed, is settled from the tool's
/// answer (`succeeded`, never `unknown` or `dispatching`); and no call
/// reaches the tool after the run ended, not even a re-send.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_pydantic_ai_run_whose_calls_are_refused_fails_and_nothing_is_sent_after_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, served) = key_mode_proxy(&db).await;

    let lines = agents_py(&[
        "--url",
        &served.mcp,
        "--key",
        "refused",
        "refused-pydantic-ai",
    ])
    .await;
    let run = line(&lines, "run", "failed");
    assert_eq!(run["error_type"], "UnexpectedModelBehavior", "{run}");
    let asked = lines.iter().find(|l| l["model_turns"].is_number()).unwrap();
    let keyed = asked["keyed"].as_array().unwrap().len();
    let unkeyed = asked["unkeyed"].as_array().unwrap().len();
    // pydantic-ai's default: one retry, so two turns of the model.
    assert_eq!((keyed, unkeyed), (2, 2), "{asked}");
    let read: Vec<&str> = asked["model_read"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        read.iter()
            .any(|r| r.contains("has side effects") && r.contains("Nothing was sent")),
        "the model reads why its call was refused: {read:?}"
    );
    let settled = wait_until("every operation settled", || async {
        let (open,): (i64,) = db
            .query_row("SELECT count(*) FROM tool_operations WHERE status <> 'succeeded'")
            .await;
        (open == 0).then_some(())
    });
    settled.await;
    let metrics = common::http::get(&format!("{}/metrics", served.control)).await;
    let refused = counter(
        &metrics.body,
        "leasegate_agent_calls_total",
        &["outcome=\"refused\"", "reason=\"lease_missing\""],
    );
    assert_eq!(
        refused, unkeyed as f64,
        "each refused call the model asked for reached leasegate once: pydantic-ai does not retry it on its own"
    );
    let calls = scenario.side_effects("calls.jsonl");
    // The first turn's keyed call is answered before the model's second
    // turn; the second turn's is cancelled by pydantic-ai once its sibling
    // failed the run. A disconnect is not a cancel before MCP 2026-07-28,
    // and `on_disconnect = "finish"` otherwise: leasegate runs that call
    // to its end, so it may reach the tool after the agent's process
    // ended. What may reach the tool is only what the model asked with a
    // key, each once.
    let charged: Vec<i64> = scenario
        .side_effects("charges.jsonl")
        .iter()
        .map(|c| c["amount"].as_i64().unwrap())
        .collect();
    let keyed_amounts: Vec<i64> = asked["keyed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_i64().unwrap())
        .collect();
    assert!(
        charged.first() == keyed_amounts.first()
            && charged.iter().all(|a| keyed_amounts.contains(a)),
        "charges {charged:?} are keyed calls {keyed_amounts:?}, none unkeyed"
    );
    assert_eq!(
        calls.len(),
        charged.len(),
        "each call reached the tool once"
    );
    let operations = db.row_count("tool_operations").await;
    assert_eq!(operations, charged.len() as i64, "one operation per charge");
}

/// A pydantic-ai agent with default settings whose calls carry a lease
/// another worker has taken over: each is refused `-31002` before the tool,
/// pydantic-ai treats it as it treats `-31001` (a retry prompt the model
/// reads, then the run fails at the retry limit), and nothing is
/// registered or sent.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_pydantic_ai_run_with_a_lost_lease_fails_and_nothing_is_sent(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "claim_ttl = \"4s\"\n");
    let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    let (old, _) = db.running_run("old-worker", 300).await;
    db.wait_lease_expired(old.run_id).await;
    db.acquire(old.run_id, "new-worker", 60_000).await;
    let lease = leasegate::mcp::front::lease_meta(&old).to_string();

    let lines = agents_py(&[
        "--url",
        &served.mcp,
        "--lease-json",
        &lease,
        "lost-lease-pydantic-ai",
    ])
    .await;
    let run = line(&lines, "run", "failed");
    assert_eq!(run["error_type"], "UnexpectedModelBehavior", "{run}");
    let asked = lines.iter().find(|l| l["model_turns"].is_number()).unwrap();
    assert_eq!(asked["model_turns"], 2, "{asked}");
    let read = asked["model_read"].to_string();
    assert!(
        read.contains("lease lost: this write holds owner old-worker epoch 1"),
        "the model reads why: {read}"
    );
    assert!(scenario.side_effects("calls.jsonl").is_empty());
    assert_eq!(db.row_count("tool_operations").await, 0);
}

/// The Vercel AI SDK's stdio transport closes its server with SIGTERM. A
/// `leasegate stdio --task` session it closes with a charge in flight frees
/// the task's lease, settles the call from the tool's answer (not
/// `dispatching`, not `unknown`) and exits.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_vercel_stdio_client_closing_mid_call_frees_the_lease_and_the_call_is_settled(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "claim_ttl = \"4s\"\n");
    scenario.surround_config(
        "lease_mode = \"session\"\ndatabase_max_connections = 4",
        "[session]\nttl = \"3s\"\n",
    );
    let command = serde_json::to_string(&[
        LEASEGATE,
        "stdio",
        "--config",
        scenario.config_path().to_str().unwrap(),
        "--task",
        "vercel-nightly",
    ])
    .unwrap();
    let charges = scenario.dir.join("state/charges.jsonl");
    let lines = vercel_mjs(&[
        "sigterm",
        "--stdio-command",
        &command,
        "--charges",
        charges.to_str().unwrap(),
        "--amount",
        "700",
    ])
    .await;
    let pid = lines
        .iter()
        .find_map(|l| l["pid"].as_i64())
        .expect("the client named its server's pid") as i32;
    assert!(lines.iter().any(|l| l["closed"] == true), "{lines:?}");

    wait_until("the closed session to free its lease", || async {
        let (held,): (i64,) = db
            .query_row(
                "SELECT count(*) FROM worker_leases l JOIN agent_tasks t ON t.active_run_id = l.run_id \
                 WHERE t.task_id = 'vercel-nightly' AND l.owner IS NOT NULL",
            )
            .await;
        (held == 0).then_some(())
    })
    .await;
    wait_until("the call in flight to be settled", || async {
        let status: Option<String> = db
            .scalar(
                "SELECT status FROM tool_operations WHERE request_body->>'amount' = $1",
                "700".to_owned(),
            )
            .await;
        (status.as_deref() == Some("succeeded")).then_some(())
    })
    .await;
    wait_until("leasegate stdio to exit", || async {
        common::process_exited(pid).then_some(())
    })
    .await;
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
}

/// A `leasegate stdio` that cannot open its ledger, spawned by a pydantic-ai
/// agent's stdio toolset: the agent's run fails with leasegate's `-31013`
/// and its cause (which database, the wait, the fix), not "Connection
/// closed". fastmcp, under pydantic-ai, first probes with
/// `server/discover` and falls back to `initialize` on the error: both are
/// answered.
#[tokio::test]
async fn a_pydantic_ai_run_over_a_stdio_leasegate_that_cannot_start_fails_with_the_cause() {
    let url = common::silent_server_url();
    let dir = std::env::temp_dir().join(format!(
        "leasegate-agents-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("leasegate.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = \"{url}\"\ndatabase_connect_timeout = \"2s\"\nmigrate = false\n\
             [upstreams.tools]\ntransport = \"stdio\"\ncommand = \"/bin/true\"\n"
        ),
    )
    .unwrap();
    let command =
        serde_json::to_string(&[LEASEGATE, "stdio", "--config", config.to_str().unwrap()]).unwrap();
    let lines = agents_py(&["--stdio-command", &command, "unstarted-pydantic-ai"]).await;
    let run = line(&lines, "run", "failed");
    assert_eq!(run["error_code"], codes::NOT_STARTED, "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(
        error.contains("leasegate could not start, nothing was sent")
            && error.contains("no PostgreSQL server answers")
            && error.contains("within 2s (database_connect_timeout)")
            && !error.contains("sekret"),
        "{error}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// leasegate's codes are none of those the pinned fastmcp, pydantic-ai,
/// MCP SDK and `@ai-sdk/mcp` sources name: every integer literal from
/// -32768 to -31000 in their installed Python and JavaScript files (and
/// the SDK's named constants, which are such literals in `mcp_types`).
#[test]
fn no_leasegate_code_is_one_the_installed_frameworks_use() {
    let python = common::peers::agents_python();
    let site = python
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("lib")
        .read_dir()
        .unwrap()
        .flatten()
        .map(|python| python.path().join("site-packages"))
        .find(|site| site.is_dir())
        .expect("the agents venv's site-packages");
    let node = common::peers::sdk_node().join("node_modules/@ai-sdk");
    let roots = [
        site.join("fastmcp"),
        site.join("pydantic_ai"),
        site.join("mcp"),
        site.join("mcp_types"),
        node,
    ];
    let mut theirs = std::collections::BTreeSet::new();
    for root in &roots {
        assert!(root.is_dir(), "{} is installed", root.display());
        collect_codes(root, &mut theirs);
    }
    assert!(
        theirs.contains(&-32602) && theirs.contains(&-32000) && theirs.contains(&-32022),
        "the scan finds the codes known to be there: {theirs:?}"
    );
    for code in codes::OWN {
        assert!(
            !theirs.contains(&i64::from(code)),
            "{code} is used by a framework: {theirs:?}"
        );
    }
}

/// A call refused for want of a lease (key mode, no key), as the client
/// reported it: `-31001`, saying nothing was sent.
#[track_caller]
fn assert_refused_without_a_lease(refused: &Value) {
    assert_eq!(refused["error_code"], codes::LEASE_REQUIRED, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("Nothing was sent"),
        "{refused}"
    );
}

/// The integer literals from -32768 to -31000 in the `.py`, `.js`, `.mjs`
/// and `.ts` files under `dir`.
fn collect_codes(dir: &std::path::Path, codes: &mut std::collections::BTreeSet<i64>) {
    for entry in dir.read_dir().unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_codes(&path, codes);
            continue;
        }
        let source = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("py" | "js" | "mjs" | "ts")
        );
        let Some(text) = source
            .then(|| std::fs::read_to_string(&path).ok())
            .flatten()
        else {
            continue;
        };
        let bytes = text.as_bytes();
        for (at, _) in text.match_indices("-3") {
            let digits: String = text[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let bounded = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
            if bounded
                && digits.len() == 5
                && let Ok(value) = digits.parse::<i64>()
                && (31_000..=32_768).contains(&value)
            {
                codes.insert(-value);
            }
        }
    }
}
