//! An unmodified MCP client sees the upstream through leasegate: the
//! official Python SDK (`mcp` 2.3.0, default `Client` in auto mode, and a
//! handshake-era client) against leasegate in front of
//! `@modelcontextprotocol/server-everything` 2026.8.31 over stdio and over
//! Streamable HTTP, through `leasegate serve` (stateless and with sessions)
//! and `leasegate stdio`, with the lease passed explicitly and in lease mode
//! `session` (the agent sends none). The checks themselves are in
//! `tests/sdk/transparency.py` (and, for one agent's cancel or bad input
//! reaching another, `tests/sdk/relay.py`); this file starts the processes,
//! runs the client once per combination and asserts what the ledger and the
//! tools recorded.
//!
//! The pinned peers (the SDK in `target/sdk-venv`, server-everything in
//! `target/sdk-node`) are provisioned by the suite itself (`common::peers`);
//! without python3 or npm the test fails and says what to install.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::TestDb;
use common::proxy::{EXAMPLE_TOOLS, LEASEGATE, RunningProxy};
use leasegate::ledger::LeaseClaim;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/transparency.py");

fn server_everything() -> PathBuf {
    common::peers::server_everything()
}

/// Read-only tools of server-everything (everything else is side-effecting
/// by default and goes through the ledger: `echo` is the gated one here).
const READ_ONLY_TOOLS: [&str; 13] = [
    "get-sum",
    "get-structured-content",
    "get-tiny-image",
    "get-resource-links",
    "get-resource-reference",
    "trigger-long-running-operation",
    "trigger-sampling-request",
    "trigger-elicitation-request",
    "trigger-url-elicitation",
    "get-roots-list",
    "toggle-simulated-logging",
    "toggle-subscriber-updates",
    "gzip-file-as-resource",
];

/// The tools that ask the agent something (sampling, elicitation, roots)
/// before they answer: read-only in the explicit-lease runs, side-effecting
/// (through the ledger, each round recorded) in the session-mode runs.
const ASKING_TOOLS: [&str; 3] = [
    "trigger-sampling-request",
    "trigger-elicitation-request",
    "get-roots-list",
];

/// The adapter file of a server-everything upstream; with `gate_asking`,
/// the [`ASKING_TOOLS`] go through the ledger.
fn everything_adapter(upstream: &str, gate_asking: bool) -> String {
    // server-everything asks roots/list at start and keeps the answer,
    // asking again within a call only while it has none: refused at start,
    // each call's agent is asked.
    let mut adapter =
        format!("upstream = \"{upstream}\"\ntimeout = \"20s\"\nroots_outside_calls = \"refuse\"\n");
    for tool in READ_ONLY_TOOLS {
        if gate_asking && ASKING_TOOLS.contains(&tool) {
            continue;
        }
        adapter.push_str(&format!("[tools.{tool}]\nread_only = true\n"));
    }
    adapter
}

/// The mailer is where cancellation is checked: a 2026-07-28 agent cancels
/// by closing its response stream, which cancels a side-effecting call only
/// under `on_disconnect = "cancel"` (the default, `finish`, records the call
/// for the agent's re-issue instead: `tests/integration/reissue.rs`).
const MAILER_ADAPTER: &str = r#"upstream = "mailer"
timeout = "30s"
on_disconnect = "cancel"
[tools.send_email]
capability = "none"
timeout = "30s"
"#;

struct Setup {
    dir: PathBuf,
    http_upstream: tokio::process::Child,
}

impl Setup {
    async fn new(database_url: &str) -> Self {
        let everything = server_everything();
        let dir =
            std::env::temp_dir().join(format!("leasegate-sdk-{}", uuid::Uuid::new_v4().simple()));
        for sub in ["adapters", "adapters-gated", "policies", "state"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let http_upstream = tokio::process::Command::new("node")
            .arg(&everything)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs server-everything");
        common::wait_until("server-everything to listen over HTTP", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        let state = dir.join("state");
        let write_config = |name: &str, lease_mode: &str, sessions: bool| {
            // Session mode: the asking tools are gated (their own adapters).
            let adapters = if lease_mode == "session" {
                "adapters = \"adapters-gated\""
            } else {
                "adapters = \"adapters\""
            };
            let config = format!(
                r#"lease_mode = "{lease_mode}"
{head}http_sessions = {sessions}

[upstreams.everything]
transport = "stdio"
command = "node"
args = ["{everything}", "stdio"]

[upstreams.web]
transport = "streamable_http"
url = "http://127.0.0.1:{port}/mcp"

[upstreams.mailer]
transport = "stdio"
command = "{EXAMPLE_TOOLS}"
args = ["--tools", "mailer", "--state-dir", "{state}"]
"#,
                head = common::proxy::config_head(database_url, "off")
                    .replace("adapters = \"adapters\"", adapters),
                everything = everything.display(),
                state = state.display(),
            );
            std::fs::write(dir.join(name), config).unwrap();
        };
        write_config("stateless.toml", "explicit", false);
        write_config("sessions.toml", "explicit", true);
        write_config("session_stateless.toml", "session", false);
        for (adapters, gate_asking) in [("adapters", false), ("adapters-gated", true)] {
            for upstream in ["everything", "web"] {
                std::fs::write(
                    dir.join(format!("{adapters}/{upstream}.toml")),
                    everything_adapter(upstream, gate_asking),
                )
                .unwrap();
            }
            std::fs::write(dir.join(format!("{adapters}/mailer.toml")), MAILER_ADAPTER).unwrap();
        }
        std::fs::write(dir.join("policies/test.toml"), "claim_ttl = \"60s\"\n").unwrap();
        Self { dir, http_upstream }
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The mailer's recorded calls; a line still being written is skipped
    /// (this is polled while the tool runs).
    fn mailer_calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.state().join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.http_upstream.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How the Python client's side-effecting calls get their lease.
#[derive(Clone, Copy)]
enum Lease<'a> {
    /// The run's lease, in each gated call's `_meta`.
    Explicit(&'a LeaseClaim),
    /// Lease mode `session`: the client sends no lease, leasegate holds the
    /// task's. The task key is on leasegate's command line (stdio) or in
    /// the `Leasegate-Task` header the client sends (HTTP).
    Session { task: &'a str },
}

/// One run of the Python client.
#[derive(Clone, Copy)]
struct ClientRun<'a> {
    /// `stateless`, `sessions` or `stdio`.
    front: &'a str,
    /// The front's MCP URL, or "stdio" (then `stdio_command` is spawned).
    server: &'a str,
    stdio_command: Option<&'a [String]>,
    /// `auto` (the SDK's default) or `legacy` (handshake era).
    mode: &'a str,
    upstream: &'a str,
    interactive: bool,
    /// The example mailer's state directory, for the cancellation check.
    mailer_state: Option<&'a Path>,
    tag: &'a str,
}

/// Runs the Python client once; returns the checks it reported.
async fn run_client(run: &ClientRun<'_>, lease: Lease<'_>) -> Vec<Value> {
    let ClientRun {
        front,
        server,
        stdio_command,
        mode,
        upstream,
        interactive,
        mailer_state,
        tag,
    } = *run;
    let mut command = tokio::process::Command::new(common::peers::python());
    command
        .arg(SCRIPT)
        .args(["--front", front, "--server", server, "--mode", mode])
        .args(["--upstream", upstream])
        .args(["--interactive", if interactive { "yes" } else { "no" }])
        .args(["--tag", tag]);
    match lease {
        Lease::Explicit(lease) => {
            command
                .args(["--lease", "explicit", "--run-id", &lease.run_id.to_string()])
                .args(["--owner", &lease.owner, "--epoch", &lease.epoch.to_string()])
                .env(
                    "LEASEGATE_LEASE_TOKEN",
                    lease.token.as_ref().map(|t| t.expose()).unwrap_or_default(),
                );
        }
        Lease::Session { task } => {
            command.args(["--lease", "session", "--task", task]);
        }
    }
    if let Some(stdio) = stdio_command {
        command.args(["--stdio-command", &serde_json::to_string(stdio).unwrap()]);
    }
    if let Some(state) = mailer_state {
        command.arg("--mailer-state").arg(state);
    }
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(240),
        command.kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("the Python client ({tag}) did not finish in 240 s"))
    .expect("the test Python runs");
    let checks = common::peers::json_lines(&output);
    let failed: Vec<&Value> = checks.iter().filter(|c| c["ok"] != true).collect();
    assert!(
        output.status.success() && failed.is_empty() && !checks.is_empty(),
        "{tag}: {} of {} checks failed:\n{}\nstderr:\n{}",
        failed.len(),
        checks.len(),
        serde_json::to_string_pretty(&failed).unwrap(),
        common::peers::stderr_tail(&output)
    );
    checks
}

fn has_check(checks: &[Value], name: &str) -> bool {
    checks.iter().any(|c| c["check"] == name && c["ok"] == true)
}

/// The checks a run must have passed: the protocol era, interactivity and
/// the mailer (cancellation) decide which of them apply.
fn expected_checks(run: &ClientRun<'_>) -> Vec<&'static str> {
    let mut expected = vec![
        "tools_list",
        "gated_call_and_replay",
        "embedded_resources_named_as_exposed",
        "unicode_and_nul_through_the_ledger",
        "number_arguments",
        "fifty_concurrent_gated_calls",
        "progress_all_in_order_before_the_result",
        "progress_two_sessions_no_cross_talk",
        "resources",
        "prompts",
        "completions",
    ];
    if run.interactive {
        expected.extend(["sampling", "elicitation_form", "roots"]);
    }
    if run.mode == "auto" {
        expected.extend(["subscriptions_listen", "unknown_request_state_refused"]);
    } else if run.interactive {
        expected.extend(["logging", "resource_subscription", "list_changed"]);
    }
    if run.mailer_state.is_some() {
        expected.extend([
            "cancellation_reaches_the_upstream",
            "one_mib_arguments_through_the_ledger",
        ]);
    }
    expected
}

/// The run a session-mode task's calls went to.
async fn session_run(db: &TestDb, task: &str) -> Uuid {
    let run: Option<Uuid> = sqlx::query_scalar(
        "SELECT active_run_id FROM agent_tasks WHERE kind = 'session' AND task_id = $1",
    )
    .bind(task)
    .fetch_optional(&db.admin)
    .await
    .unwrap()
    .flatten();
    run.unwrap_or_else(|| panic!("session task {task} has an active run"))
}

/// Runs the Python client once and asserts that every check that applies
/// passed, and what the ledger and the mailer recorded.
async fn check_run(db: &TestDb, setup: &Setup, run: ClientRun<'_>, lease: Lease<'_>) {
    let tag = run.tag;
    let checks = run_client(&run, lease).await;
    for check in expected_checks(&run) {
        assert!(
            has_check(&checks, check),
            "{tag}: check {check} did not run"
        );
    }
    let run_id = match lease {
        Lease::Explicit(lease) => lease.run_id.as_uuid(),
        Lease::Session { task } => session_run(db, task).await,
    };
    assert_ledger(db, run_id, tag).await;
    if run.mailer_state.is_some() {
        assert_cancelled(db, setup, tag).await;
    }
}

async fn assert_ledger(db: &TestDb, run_id: Uuid, tag: &str) {
    // Every gated echo is one succeeded operation, replays included.
    let rows: Vec<(String, String, Value)> = db
        .rows(
            "SELECT tool_name, status, request_body FROM tool_operations WHERE run_id = $1",
            run_id,
        )
        .await;
    let echoes: Vec<_> = rows
        .iter()
        .filter(|(tool, _, body)| tool.ends_with("__echo") && body.to_string().contains(tag))
        .collect();
    assert_eq!(
        echoes.len(),
        52,
        "{tag}: one gated echo, one with an exact number, 50 concurrent ones, each recorded once"
    );
    assert!(echoes.iter().all(|(_, status, _)| status == "succeeded"));
    // Of the numbers' echoes only the exact one is an intent, stored with
    // its value; the four refused ones left no row, merged or rounded.
    let numbered: Vec<&Value> = echoes
        .iter()
        .map(|(_, _, body)| body)
        .filter(|body| body.get("n").is_some())
        .collect();
    assert_eq!(
        numbered,
        [&serde_json::json!({"message": format!("numbers {tag}"), "n": 9007199254740991_u64})],
        "{tag}: the numbers' intents"
    );
}

/// The cancel reached the tool, and the gated operation is unknown (it may
/// have sent the e-mail), never failed.
async fn assert_cancelled(db: &TestDb, setup: &Setup, tag: &str) {
    let to = format!("cancel-{tag}@example.com");
    let what = format!("{tag}: the cancel to reach the tool");
    common::wait_until(&what, || async {
        setup
            .mailer_calls()
            .iter()
            .any(|c| c["to"] == to.as_str() && c["cancelled"] == true)
            .then_some(())
    })
    .await;
    let status: String = common::wait_until("the cancelled operation to settle", || async {
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM tool_operations WHERE request_body::text LIKE '%' || $1 || '%'",
        )
        .bind(&to)
        .fetch_optional(&db.admin)
        .await
        .unwrap();
        status.filter(|s| s != "dispatching")
    })
    .await;
    assert_eq!(
        status, "unknown",
        "{tag}: a cancelled gated call is unknown"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_python_sdk_sees_server_everything_through_every_front(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let setup = Setup::new(&db.url).await;
    let (lease, _) = db.running_run("sdk-agent", 600_000).await;

    // leasegate serve, stateless (the default) and with sessions.
    let stateless = RunningProxy::start(&setup.dir.join("stateless.toml")).await;
    let sessions = RunningProxy::start(&setup.dir.join("sessions.toml")).await;
    let stdio: Vec<String> = vec![
        LEASEGATE.to_owned(),
        "stdio".to_owned(),
        "--config".to_owned(),
        setup.dir.join("sessions.toml").display().to_string(),
    ];

    // (front, mode, upstream, interactive, with the cancellation check).
    // Interactive: sampling, elicitation and roots round trips, which a
    // handshake-era agent on the stateless front cannot answer (it has no
    // session to answer on); 2026-07-28 agents answer through
    // input_required results on every front.
    let runs: Vec<(&str, &str, &str, bool, bool)> = vec![
        ("stateless", "auto", "everything", true, true),
        ("stateless", "legacy", "everything", false, true),
        ("stateless", "auto", "web", true, false),
        ("sessions", "legacy", "everything", true, true),
        ("sessions", "auto", "everything", true, false),
        ("sessions", "legacy", "web", true, false),
        ("stdio", "legacy", "everything", true, true),
        ("stdio", "auto", "everything", true, false),
    ];
    for (index, (front, mode, upstream, interactive, cancel)) in runs.into_iter().enumerate() {
        let tag = format!("run{index}-{front}-{mode}-{upstream}");
        let (server, stdio_command) = match front {
            "stateless" => (stateless.url.clone(), None),
            "sessions" => (sessions.url.clone(), None),
            _ => ("stdio".to_owned(), Some(stdio.as_slice())),
        };
        let state = setup.state();
        check_run(
            &db,
            &setup,
            ClientRun {
                front,
                server: &server,
                stdio_command,
                mode,
                upstream,
                interactive,
                mailer_state: cancel.then_some(state.as_path()),
                tag: &tag,
            },
            Lease::Explicit(&lease),
        )
        .await;
    }

    // A request body with U+0000 is stored (escaped), and reads back exact.
    let stored: Vec<Value> = db
        .query_scalars(
            "SELECT request_body FROM tool_operations WHERE request_body::text LIKE '%dev.leasegate/escaped%'",
        )
        .await;
    assert!(
        !stored.is_empty(),
        "the NUL-carrying request was stored escaped"
    );

    stateless.stop().await;
    sessions.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_python_sdk_passes_through_session_mode_on_stdio_and_stateless_http(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let setup = Setup::new(&db.url).await;

    // The agent is unmodified and in its SDK's default (auto) mode: it
    // spawns `leasegate stdio --task <key>`, or sends `Leasegate-Task` on
    // every request to the stateless front. Its two-session check runs two
    // clients at once for one task (two stdio processes, or two streams of
    // stateless requests), which share the task's lease.
    // One session config for both fronts (`http_sessions` does not apply to
    // stdio).
    let config = setup.dir.join("session_stateless.toml");
    let stateless = RunningProxy::start(&config).await;
    let stdio_task = "sdk-session-stdio";
    let http_task = "sdk-session-http";
    let stdio: Vec<String> = vec![
        LEASEGATE.to_owned(),
        "stdio".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
        "--task".to_owned(),
        stdio_task.to_owned(),
    ];

    for (front, task) in [("stdio", stdio_task), ("stateless", http_task)] {
        let tag = format!("session-{front}-auto-everything");
        let (server, stdio_command) = match front {
            "stateless" => (stateless.url.clone(), None),
            _ => ("stdio".to_owned(), Some(stdio.as_slice())),
        };
        let state = setup.state();
        check_run(
            &db,
            &setup,
            ClientRun {
                front,
                server: &server,
                stdio_command,
                mode: "auto",
                upstream: "everything",
                interactive: true,
                mailer_state: Some(state.as_path()),
                tag: &tag,
            },
            Lease::Session { task },
        )
        .await;
        assert_asking_tools_gated(&db, session_run(&db, task).await, &tag).await;
    }

    stateless.stop().await;
}

/// Each gated asking tool's call is one succeeded operation whose round
/// with the agent (when it asked) is recorded as `input_round` evidence.
async fn assert_asking_tools_gated(db: &TestDb, run_id: Uuid, tag: &str) {
    for tool in ASKING_TOOLS {
        let rows: Vec<(String, String, i64)> = db
            .rows_with(
                "SELECT o.operation_id, o.status, (SELECT count(*) FROM operation_evidence e
                    WHERE e.operation_id = o.operation_id AND e.kind = 'input_round')
                   FROM tool_operations o WHERE o.run_id = $1 AND o.tool_name = $2",
                (run_id, format!("everything__{tool}")),
            )
            .await;
        assert_eq!(rows.len(), 1, "{tag}: one operation for {tool}: {rows:?}");
        let (_, status, rounds) = &rows[0];
        assert_eq!(status, "succeeded", "{tag}: {tool}");
        // server-everything keeps the roots it was given per upstream
        // session, so get-roots-list asks only when it has none yet.
        let asks = if tool == "get-roots-list" {
            0..=1
        } else {
            1..=1
        };
        assert!(
            asks.contains(rounds),
            "{tag}: {tool} recorded {rounds} rounds with the agent"
        );
    }
}

const RELAY_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/relay.py");

/// The checks `tests/sdk/relay.py` must pass on a front.
fn relay_checks(front: &str) -> Vec<&'static str> {
    let mut checks = vec![
        "cancelled_call_then_another_agents_sampling",
        "refusal_names_the_candidates",
    ];
    if front != "stdio" {
        checks.extend([
            "oversized_then_normal_calls",
            "unreadable_bodies_answered_under_their_id",
        ]);
    }
    if front == "stateless" {
        checks.extend([
            "handshake_era_stateless_logs",
            "cancel_of_a_reused_request_id",
        ]);
    }
    checks
}

/// Where one agent's trouble used to reach another, with the official SDK:
/// a call cancelled on a stdio upstream no longer refuses the same agent's
/// or another agent's sampling (it is relayed well within the minute it was
/// refused for; on every front), and a request that cannot be attributed is
/// refused naming its candidates;
/// an 8 MiB call is a JSON-RPC error naming the limit and the same session
/// goes on; a body nested too deep or with `1e400` is `-32700` under its own
/// id and the session goes on; on the stateless front a handshake-era
/// client gets logs within its calls, and a cancel whose request id an
/// earlier client of the same identity used reaches the tool.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn one_agents_cancel_or_bad_input_does_not_reach_another_on_any_front(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let setup = Setup::new(&db.url).await;
    let (lease, _) = db.running_run("sdk-relay-agent", 600_000).await;
    let stateless = RunningProxy::start(&setup.dir.join("stateless.toml")).await;
    let sessions = RunningProxy::start(&setup.dir.join("sessions.toml")).await;
    let stdio: Vec<String> = vec![
        LEASEGATE.to_owned(),
        "stdio".to_owned(),
        "--config".to_owned(),
        setup.dir.join("sessions.toml").display().to_string(),
    ];
    for (front, mode, server) in [
        ("stateless", "auto", stateless.url.as_str()),
        ("sessions", "legacy", sessions.url.as_str()),
        ("stdio", "auto", "stdio"),
    ] {
        let tag = format!("relay-{front}-{mode}");
        let mut command = tokio::process::Command::new(common::peers::python());
        command
            .arg(RELAY_SCRIPT)
            .args(["--server", server, "--front", front, "--mode", mode])
            .args(["--stdio-command", &serde_json::to_string(&stdio).unwrap()])
            .args([
                "--run-id",
                &lease.run_id.to_string(),
                "--owner",
                &lease.owner,
            ])
            .args(["--epoch", &lease.epoch.to_string(), "--tag", &tag])
            .arg("--mailer-state")
            .arg(setup.state())
            .env(
                "LEASEGATE_LEASE_TOKEN",
                lease.token.as_ref().map(|t| t.expose()).unwrap_or_default(),
            );
        let output = tokio::time::timeout(
            std::time::Duration::from_secs(300),
            command.kill_on_drop(true).output(),
        )
        .await
        .unwrap_or_else(|_| panic!("the Python client ({tag}) did not finish in 300 s"))
        .expect("the test Python runs");
        let checks = common::peers::json_lines(&output);
        let failed: Vec<&Value> = checks.iter().filter(|c| c["ok"] != true).collect();
        assert!(
            output.status.success() && failed.is_empty(),
            "{tag}: {} of {} checks failed:\n{}\nstderr:\n{}",
            failed.len(),
            checks.len(),
            serde_json::to_string_pretty(&failed).unwrap(),
            common::peers::stderr_tail(&output)
        );
        for check in relay_checks(front) {
            assert!(
                has_check(&checks, check),
                "{tag}: check {check} did not run"
            );
        }
    }
    // The cancelled e-mail is unknown (it may have been sent), never failed.
    let to = "reuse-relay-stateless-auto@example.com";
    let status: String = common::wait_until("the cancelled operation to settle", || async {
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM tool_operations WHERE request_body::text LIKE '%' || $1 || '%'",
        )
        .bind(to)
        .fetch_optional(&db.admin)
        .await
        .unwrap();
        status.filter(|s| s != "dispatching")
    })
    .await;
    assert_eq!(status, "unknown", "a cancelled gated call is unknown");
    stateless.stop().await;
    sessions.stop().await;
}
