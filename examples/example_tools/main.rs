//! `leasegate-example-tools`: an example MCP tool server with real, counted
//! side effects, for the quickstart and the end-to-end tests. Not part of
//! the product: a separate binary that leasegate runs as an upstream.
//!
//! ```text
//! leasegate-example-tools [--tools payments|mailer|all|provisioner|jobs|asker] [--state-dir DIR]
//!                         [--http ADDR] [--fault-… P]
//! ```
//!
//! - `payments`: `charge` honours an `idempotency_key` (the same key returns
//!   the same charge, no new side effect) and `get_charge` (read-only) finds
//!   a charge by its key.
//! - `mailer`: `send_email` has no idempotency at all: every call that
//!   reaches it sends (and it may be told to hang after sending, to play a
//!   lost answer); `mail_stats` (read-only) reports progress as it counts.
//! - `provisioner` (only when asked for, not in `all`): `create_bucket`
//!   creates a bucket under the `name` it is given (leasegate's operation id,
//!   a `resource_id` tool) and does not deduplicate: every create that
//!   reaches it is a new bucket; `get_bucket` (read-only) finds it by name.
//! - `asker` (only when asked for): `send_confirmed` asks the agent
//!   (`sampling/createMessage`) whether to send and sends once, to
//!   `confirmed.jsonl`, only if the answer's text is "yes".
//! - `jobs` (only when asked for): `submit_job` starts a job under the
//!   operation id found in `_meta["example.dev/job_id"]` (or the `job_id`
//!   argument), no deduplication either; `get_job` (read-only) finds it.
//! - `tasks` (only when asked for; the MCP Tasks extension): `export_report`
//!   runs as a task when the request declares the extension (otherwise in
//!   the call): it waits until the file `<state-dir>/release-<name>` exists
//!   (at once when `wait` is false), then writes one export to
//!   `exports.jsonl` and completes; no deduplication. `report_status`
//!   (read-only) answers as a task too, to show one passed through.
//!
//! Every side effect is one JSON line appended to `<state-dir>/charges.jsonl`,
//! `emails.jsonl`, `buckets.jsonl`, `jobs.jsonl` or `exports.jsonl`, which is what tests
//! count; every call that reaches a side-effecting tool is a line of
//! `calls.jsonl`. Several processes may share one state dir (one child per
//! leasegate process): effects are serialised by a lock on
//! `<state-dir>/effects.lock`.
//!
//! # Fault injection (the chaos soak, `bench/chaos/`; all off by default)
//!
//! `--fault-transient P`: a side-effecting call (or a query) answers
//! `isError` "nothing was done" before doing anything. `--fault-crash P`:
//! the process exits right after a new side effect was written, before
//! answering. `--fault-hang P`: it sleeps `--fault-hang-ms` after a new side
//! effect (a lost answer). `--fault-slow P`: any answer is delayed by up to
//! `--fault-slow-ms`. Draws come from a xorshift generator seeded with
//! `--fault-seed` and the pid; every injected fault is a line of
//! `faults.jsonl`. While `<state-dir>/calm` exists no fault is injected.

use std::path::PathBuf;

use clap::Parser;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

#[derive(Debug, Parser)]
#[command(
    name = "leasegate-example-tools",
    version,
    about = "The example tool server with counted side effects (quickstart, tests)"
)]
struct Cli {
    /// payments, mailer or all.
    #[arg(long, default_value = "all")]
    tools: ToolSet,
    /// Where side effects are recorded (charges.jsonl, emails.jsonl,
    /// calls.jsonl) and, over stdio, the pid file (<tools>.pid) is written.
    #[arg(long, default_value = ".leasegate-example")]
    state_dir: PathBuf,
    /// Serve Streamable HTTP on this address instead of stdio.
    #[arg(long)]
    http: Option<std::net::SocketAddr>,
    /// Probability of an `isError` "nothing was done" before any effect.
    #[arg(long, default_value_t = 0.0)]
    fault_transient: f64,
    /// Probability of exiting right after a new side effect, before answering.
    #[arg(long, default_value_t = 0.0)]
    fault_crash: f64,
    /// Probability of hanging (`--fault-hang-ms`) after a new side effect.
    #[arg(long, default_value_t = 0.0)]
    fault_hang: f64,
    #[arg(long, default_value_t = 3000)]
    fault_hang_ms: u64,
    /// Probability of a slow answer (up to `--fault-slow-ms`).
    #[arg(long, default_value_t = 0.0)]
    fault_slow: f64,
    #[arg(long, default_value_t = 300)]
    fault_slow_ms: u64,
    /// Seed of the fault draws (mixed with the pid, so restarts differ).
    #[arg(long, default_value_t = 1)]
    fault_seed: u64,
}

/// What faults to inject, and the generator that decides when.
#[derive(Debug, Clone)]
struct Faults {
    transient: f64,
    crash: f64,
    hang: f64,
    hang_ms: u64,
    slow: f64,
    slow_ms: u64,
    rng: Arc<std::sync::Mutex<u64>>,
}

impl Faults {
    fn from_cli(cli: &Cli) -> Self {
        let seed = cli.fault_seed ^ u64::from(std::process::id()).rotate_left(32);
        Self {
            transient: cli.fault_transient,
            crash: cli.fault_crash,
            hang: cli.fault_hang,
            hang_ms: cli.fault_hang_ms,
            slow: cli.fault_slow,
            slow_ms: cli.fault_slow_ms,
            // xorshift must not start at zero.
            rng: Arc::new(std::sync::Mutex::new(
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            )),
        }
    }

    fn any(&self) -> bool {
        self.transient > 0.0 || self.crash > 0.0 || self.hang > 0.0 || self.slow > 0.0
    }

    /// A uniform draw in [0, 1) (xorshift64*).
    fn draw(&self) -> f64 {
        let mut state = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut x = *state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *state = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn hits(&self, probability: f64) -> bool {
        probability > 0.0 && self.draw() < probability
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // MCP goes over stdout: logs (warnings only) go to stderr.
    // It runs as leasegate's child and its stderr is leasegate's: like
    // leasegate, it never logs whole messages (rmcp prints every request at
    // debug) unless LEASEGATE_LOG_BODIES=1.
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let bodies = std::env::var("LEASEGATE_LOG_BODIES").is_ok_and(|v| v == "1" || v == "true");
    let no_bodies = tracing_subscriber::filter::filter_fn(move |meta| {
        bodies || *meta.level() <= tracing::Level::INFO || !meta.target().starts_with("rmcp")
    });
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_filter(filter.and(no_bodies)),
        )
        .init();
    let faults = Faults::from_cli(&cli);
    let served = match cli.http {
        None => serve_stdio(cli.tools, cli.state_dir, faults).await,
        Some(address) => match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                match listener.local_addr() {
                    Ok(bound) => eprintln!("example tools at http://{bound}/mcp"),
                    Err(error) => eprintln!("leasegate-example-tools: {error}"),
                }
                serve_http(cli.tools, cli.state_dir, faults, listener).await
            }
            Err(error) => Err(error.into()),
        },
    };
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("leasegate-example-tools: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Which tools to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolSet {
    Payments,
    Mailer,
    /// payments and mailer.
    All,
    Provisioner,
    Jobs,
    Asker,
    Tasks,
}

impl std::str::FromStr for ToolSet {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "payments" => Ok(ToolSet::Payments),
            "mailer" => Ok(ToolSet::Mailer),
            "all" => Ok(ToolSet::All),
            "provisioner" => Ok(ToolSet::Provisioner),
            "jobs" => Ok(ToolSet::Jobs),
            "asker" => Ok(ToolSet::Asker),
            "tasks" => Ok(ToolSet::Tasks),
            other => Err(format!(
                "{other:?} is not one of payments, mailer, all, provisioner, jobs, asker, tasks"
            )),
        }
    }
}

#[derive(Clone)]
struct ExampleTools {
    set: ToolSet,
    state_dir: Arc<PathBuf>,
    /// Serialises side effects so that counting is exact.
    lock: Arc<Mutex<()>>,
    faults: Faults,
    /// The tasks `export_report` runs as (shared by every clone: the HTTP
    /// server makes one per request).
    tasks: Arc<rmcp::task_manager::TaskManager>,
}

fn schema(value: Value) -> Arc<JsonObject> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

fn tools(set: ToolSet) -> Vec<Tool> {
    let mut tools = Vec::new();
    if matches!(set, ToolSet::Payments | ToolSet::All) {
        tools.push(
            Tool::new(
                "charge",
                "Charge a card. Honours idempotency_key: the same key returns the same charge.",
                schema(json!({"type": "object", "properties": {
                    "amount": {"type": "integer"}, "currency": {"type": "string"},
                    "idempotency_key": {"type": "string"}, "hang_ms": {"type": "integer"}},
                    "required": ["amount", "currency"]})),
            )
            .with_annotations(
                ToolAnnotations::new()
                    .read_only(false)
                    .destructive(false)
                    .idempotent(true),
            ),
        );
        tools.push(
            Tool::new(
                "get_charge",
                "Find a charge by its idempotency key.",
                schema(
                    json!({"type": "object", "properties": {"idempotency_key": {"type": "string"}},
                               "required": ["idempotency_key"]}),
                ),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
        );
    }
    if matches!(set, ToolSet::Mailer | ToolSet::All) {
        tools.push(
            Tool::new(
                "send_email",
                "Send an email. Not idempotent. hang_ms makes it hang after sending.",
                schema(json!({"type": "object", "properties": {
                    "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"},
                    "hang_ms": {"type": "integer"}}, "required": ["to"]})),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(true)),
        );
        tools.push(
            Tool::new(
                "mail_stats",
                "Count sent emails, reporting progress.",
                schema(json!({"type": "object", "properties": {}})),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
        );
    }
    if set == ToolSet::Provisioner {
        tools.push(
            Tool::new(
                "create_bucket",
                "Create a bucket named `name`. Not deduplicated: every create is a new bucket.",
                schema(json!({"type": "object", "properties": {
                    "name": {"type": "string"}, "region": {"type": "string"},
                    "size": {"type": "integer"}}, "required": ["name"]})),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        );
        tools.push(
            Tool::new(
                "get_bucket",
                "Find a bucket by its name.",
                schema(
                    json!({"type": "object", "properties": {"name": {"type": "string"}},
                               "required": ["name"]}),
                ),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
        );
    }
    if set == ToolSet::Jobs {
        tools.push(
            Tool::new(
                "submit_job",
                "Start a job under _meta[\"example.dev/job_id\"] (or job_id). Not deduplicated.",
                schema(json!({"type": "object", "properties": {
                    "name": {"type": "string"}, "job_id": {"type": "string"}}})),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        );
        tools.push(
            Tool::new(
                "get_job",
                "Find a job by its id.",
                schema(
                    json!({"type": "object", "properties": {"job_id": {"type": "string"}},
                               "required": ["job_id"]}),
                ),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
        );
    }
    if set == ToolSet::Asker {
        tools.push(
            Tool::new(
                "send_confirmed",
                "Ask the agent (sampling) whether to send to `to`; send only on \"yes\". Not deduplicated.",
                schema(json!({"type": "object", "properties": {"to": {"type": "string"}},
                              "required": ["to"]})),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(true)),
        );
    }
    if set == ToolSet::Tasks {
        tools.push(
            Tool::new(
                "export_report",
                "Export a report (as a task when the client follows tasks). Not deduplicated.",
                schema(json!({"type": "object", "properties": {
                    "name": {"type": "string"}, "wait": {"type": "boolean"}},
                    "required": ["name"]})),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        );
        tools.push(
            Tool::new(
                "report_status",
                "How many reports were exported (as a task when the client follows tasks).",
                schema(json!({"type": "object", "properties": {}})),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
        );
    }
    tools
}

/// The `_meta` key `submit_job` takes its job id from.
const JOB_ID_META: &str = "example.dev/job_id";

fn internal(error: impl std::fmt::Display) -> McpError {
    McpError::internal_error(error.to_string(), None)
}

impl ExampleTools {
    fn file(&self, name: &str) -> PathBuf {
        self.state_dir.join(name)
    }

    /// The cross-process effect lock, held until the file is dropped: several
    /// tool server processes (one per leasegate process) may share a state
    /// dir, and a read-check-append must not interleave. If the process dies
    /// holding it, the OS releases it.
    fn effects_lock(&self) -> Result<std::fs::File, McpError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.file("effects.lock"))
            .map_err(internal)?;
        file.lock().map_err(internal)?;
        Ok(file)
    }

    fn faults_on(&self) -> bool {
        self.faults.any() && !self.file("calm").exists()
    }

    async fn record_fault(&self, fault: &str, tool: &str) {
        let line = json!({"fault": fault, "tool": tool, "pid": std::process::id()});
        if let Err(error) = self.append("faults.jsonl", &line).await {
            tracing::warn!("recording a fault: {error:?}");
        }
    }

    /// Fault injection before anything is done: "nothing was done, try again".
    async fn transient_failure(&self, tool: &str) -> Option<CallToolResult> {
        if !self.faults_on() || !self.faults.hits(self.faults.transient) {
            return None;
        }
        self.record_fault("transient", tool).await;
        let message = format!("{tool}: temporarily unavailable, nothing was done; try again");
        let mut result = CallToolResult::error(vec![ContentBlock::text(message.clone())]);
        result.structured_content =
            Some(json!({"error": {"code": "unavailable", "message": message}}));
        Some(result)
    }

    /// Fault injection after a new side effect was written: exit before
    /// answering, or hang (a lost answer).
    async fn after_effect(&self, tool: &str) {
        if !self.faults_on() {
            return;
        }
        if self.faults.hits(self.faults.crash) {
            self.record_fault("crash", tool).await;
            std::process::exit(75);
        }
        if self.faults.hits(self.faults.hang) {
            self.record_fault("hang", tool).await;
            tokio::time::sleep(Duration::from_millis(self.faults.hang_ms)).await;
        }
    }

    /// Fault injection before answering: a slow answer.
    async fn maybe_slow(&self, tool: &str) {
        if self.faults_on() && self.faults.hits(self.faults.slow) {
            self.record_fault("slow", tool).await;
            let ms = (self.faults.draw() * self.faults.slow_ms as f64) as u64;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    async fn lines(&self, name: &str) -> Vec<Value> {
        tokio::fs::read_to_string(self.file(name))
            .await
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    async fn append(&self, name: &str, line: &Value) -> Result<(), McpError> {
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.file(name))
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        file.write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        file.sync_data()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }

    async fn charge(
        &self,
        args: &JsonObject,
        trace: Option<&Value>,
        header_key: Option<&str>,
    ) -> Result<CallToolResult, McpError> {
        let amount = args
            .get("amount")
            .and_then(Value::as_i64)
            .ok_or_else(|| McpError::invalid_params("amount must be an integer", None))?;
        let currency = args
            .get("currency")
            .and_then(Value::as_str)
            .unwrap_or("eur");
        // The key comes as an argument, or (over HTTP) as the request's
        // `Idempotency-Key` header, as payment APIs take it.
        let key = args
            .get("idempotency_key")
            .and_then(Value::as_str)
            .or(header_key);
        if let Some(failure) = self.transient_failure("charge").await {
            return Ok(failure);
        }
        let charge = {
            let _guard = self.lock.lock().await;
            let _across_processes = self.effects_lock()?;
            // Every call is logged, so tests can count what reached the tool.
            self.append(
                "calls.jsonl",
                &json!({"tool": "charge", "idempotency_key": key, "traceparent": trace,
                        "arguments": args}),
            )
            .await?;
            let charges = self.lines("charges.jsonl").await;
            if let Some(key) = key
                && let Some(existing) = charges.iter().find(|c| c["idempotency_key"] == key)
            {
                let mut body = existing.clone();
                body["replayed"] = json!(true);
                drop(_across_processes);
                self.maybe_slow("charge").await;
                return Ok(CallToolResult::structured(body));
            }
            let charge = json!({"charge_id": format!("ch_{}", charges.len() + 1), "amount": amount,
                                "currency": currency, "idempotency_key": key, "replayed": false});
            self.append("charges.jsonl", &charge).await?;
            charge
        };
        self.after_effect("charge").await;
        self.maybe_slow("charge").await;
        // A fresh charge may be told to hang after it happened (a lost answer).
        if let Some(hang) = args.get("hang_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(hang)).await;
        }
        Ok(CallToolResult::structured(charge))
    }

    async fn get_charge(&self, args: &JsonObject) -> Result<CallToolResult, McpError> {
        let key = args
            .get("idempotency_key")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(failure) = self.transient_failure("get_charge").await {
            return Ok(failure);
        }
        self.maybe_slow("get_charge").await;
        let charges = self.lines("charges.jsonl").await;
        Ok(
            match charges.into_iter().find(|c| c["idempotency_key"] == key) {
                Some(charge) => {
                    CallToolResult::structured(json!({"found": true, "charge": charge}))
                }
                None => CallToolResult::structured(json!({"found": false})),
            },
        )
    }

    /// Asks the agent (sampling) whether to send, then sends once to
    /// `confirmed.jsonl` if the answer's text is "yes". (Sampling is
    /// deprecated by SEP-2577 but still what handshake-era servers use.)
    #[allow(deprecated)]
    async fn send_confirmed(
        &self,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let to = args.get("to").and_then(Value::as_str).unwrap_or_default();
        self.append("calls.jsonl", &json!({"tool": "send_confirmed", "to": to}))
            .await?;
        let question = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": format!("Send to {to}?")}}],
            "maxTokens": 10}))
        .map_err(internal)?;
        let answer = context
            .peer
            .create_message(question)
            .await
            .map_err(|e| internal(format!("the agent did not answer: {e}")))?;
        let said = serde_json::to_value(&answer)
            .ok()
            .and_then(|v| {
                v.pointer("/content/text")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        if said != "yes" {
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "not confirmed ({said:?}): nothing sent"
            ))]));
        }
        let _guard = self.lock.lock().await;
        let _across_processes = self.effects_lock()?;
        let count = self.lines("confirmed.jsonl").await.len();
        let sent = json!({"message_id": format!("conf_{}", count + 1), "to": to});
        self.append("confirmed.jsonl", &sent).await?;
        Ok(CallToolResult::structured(sent))
    }

    async fn send_email(
        &self,
        args: &JsonObject,
        trace: Option<&Value>,
        cancelled: &tokio_util::sync::CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let to = args.get("to").and_then(Value::as_str).unwrap_or_default();
        self.append(
            "calls.jsonl",
            &json!({"tool": "send_email", "to": to, "traceparent": trace}),
        )
        .await?;
        if !to.contains('@') {
            // A business failure: nothing sent.
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "invalid recipient {to:?}"
            ))]));
        }
        if let Some(failure) = self.transient_failure("send_email").await {
            return Ok(failure);
        }
        let sent = {
            let _guard = self.lock.lock().await;
            let _across_processes = self.effects_lock()?;
            let count = self.lines("emails.jsonl").await.len();
            let email = json!({"message_id": format!("msg_{}", count + 1), "to": to,
                               "subject": args.get("subject"), "body": args.get("body")});
            self.append("emails.jsonl", &email).await?;
            email
        };
        self.after_effect("send_email").await;
        self.maybe_slow("send_email").await;
        if let Some(hang) = args.get("hang_ms").and_then(Value::as_u64) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(hang)) => {}
                _ = cancelled.cancelled() => {
                    // The client cancelled: recorded, so tests see it arrive.
                    let line = json!({"tool": "send_email", "to": to, "cancelled": true});
                    self.append("calls.jsonl", &line).await?;
                    return Err(McpError::internal_error("cancelled", None));
                }
            }
        }
        Ok(CallToolResult::structured(
            json!({"message_id": sent["message_id"], "to": to}),
        ))
    }

    async fn create_bucket(&self, args: &JsonObject) -> Result<CallToolResult, McpError> {
        let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
        self.append(
            "calls.jsonl",
            &json!({"tool": "create_bucket", "name": name}),
        )
        .await?;
        if name.is_empty() {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "a bucket needs a name",
            )]));
        }
        if let Some(failure) = self.transient_failure("create_bucket").await {
            return Ok(failure);
        }
        let bucket = {
            let _guard = self.lock.lock().await;
            let _across_processes = self.effects_lock()?;
            let count = self.lines("buckets.jsonl").await.len();
            let bucket = json!({"bucket_id": format!("bk_{}", count + 1), "name": name,
                                "region": args.get("region"), "size": args.get("size")});
            self.append("buckets.jsonl", &bucket).await?;
            bucket
        };
        self.after_effect("create_bucket").await;
        self.maybe_slow("create_bucket").await;
        Ok(CallToolResult::structured(bucket))
    }

    async fn get_bucket(&self, args: &JsonObject) -> Result<CallToolResult, McpError> {
        let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
        if let Some(failure) = self.transient_failure("get_bucket").await {
            return Ok(failure);
        }
        self.maybe_slow("get_bucket").await;
        let buckets = self.lines("buckets.jsonl").await;
        Ok(match buckets.into_iter().find(|b| b["name"] == name) {
            Some(bucket) => CallToolResult::structured(json!({"found": true, "bucket": bucket})),
            None => CallToolResult::structured(json!({"found": false})),
        })
    }

    async fn submit_job(
        &self,
        args: &JsonObject,
        meta: Option<&Value>,
    ) -> Result<CallToolResult, McpError> {
        let job_id = meta
            .and_then(Value::as_str)
            .or_else(|| args.get("job_id").and_then(Value::as_str))
            .unwrap_or_default();
        self.append(
            "calls.jsonl",
            &json!({"tool": "submit_job", "job_id": job_id}),
        )
        .await?;
        if job_id.is_empty() {
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "a job needs an id (_meta {JOB_ID_META:?} or job_id)"
            ))]));
        }
        if let Some(failure) = self.transient_failure("submit_job").await {
            return Ok(failure);
        }
        let job = {
            let _guard = self.lock.lock().await;
            let _across_processes = self.effects_lock()?;
            let count = self.lines("jobs.jsonl").await.len();
            let job = json!({"job_seq": format!("job_{}", count + 1), "job_id": job_id,
                             "name": args.get("name"), "state": "running"});
            self.append("jobs.jsonl", &job).await?;
            job
        };
        self.after_effect("submit_job").await;
        self.maybe_slow("submit_job").await;
        Ok(CallToolResult::structured(job))
    }

    async fn get_job(&self, args: &JsonObject) -> Result<CallToolResult, McpError> {
        let job_id = args
            .get("job_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(failure) = self.transient_failure("get_job").await {
            return Ok(failure);
        }
        self.maybe_slow("get_job").await;
        let jobs = self.lines("jobs.jsonl").await;
        Ok(match jobs.into_iter().find(|j| j["job_id"] == job_id) {
            Some(job) => CallToolResult::structured(json!({"found": true, "job": job})),
            None => CallToolResult::structured(json!({"found": false})),
        })
    }

    /// One export, once `<state-dir>/release-<name>` exists (or at once).
    async fn export_report(self, args: JsonObject) -> Result<CallToolResult, McpError> {
        let name = args
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let wait = args.get("wait").and_then(Value::as_bool).unwrap_or(true);
        let release = self.file(&format!("release-{name}"));
        while wait && !release.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _guard = self.lock.lock().await;
        let _across_processes = self.effects_lock()?;
        let count = self.lines("exports.jsonl").await.len();
        let export = json!({"export_id": format!("exp_{}", count + 1), "name": name});
        self.append("exports.jsonl", &export).await?;
        Ok(CallToolResult::structured(export))
    }

    async fn mail_stats(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let count = self.lines("emails.jsonl").await.len();
        if let Some(token) = context.meta.get_progress_token() {
            for step in 1..=2u32 {
                let mut params = ProgressNotificationParam::new(token.clone(), f64::from(step));
                params.total = Some(2.0);
                params.message = Some(format!("counting, step {step} of 2"));
                let _ = context.peer.notify_progress(params).await;
            }
        }
        Ok(CallToolResult::structured(json!({"emails_sent": count})))
    }
}

impl ServerHandler for ExampleTools {
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.set == ToolSet::Tasks {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build()
        } else {
            ServerCapabilities::builder().enable_tools().build()
        };
        ServerConfig::new(capabilities).with_server_info(Implementation::new(
            "leasegate-example-tools",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // One tool per page, so that proxies must follow cursors.
        let all = tools(self.set);
        let index: usize = request
            .and_then(|r| r.cursor)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut page =
            ListToolsResult::with_all_items(all.get(index).cloned().into_iter().collect());
        if index + 1 < all.len() {
            page.next_cursor = Some((index + 1).to_string());
        }
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let known = tools(self.set).iter().any(|tool| tool.name == request.name);
        let result = match request.name.as_ref() {
            "charge" if known => {
                let header_key = context
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.headers.get("idempotency-key"))
                    .and_then(|v| v.to_str().ok());
                self.charge(&args, context.meta.get("traceparent"), header_key)
                    .await?
            }
            "get_charge" if known => self.get_charge(&args).await?,
            "send_email" if known => {
                self.send_email(&args, context.meta.get("traceparent"), &context.ct)
                    .await?
            }
            "mail_stats" if known => self.mail_stats(&context).await?,
            "create_bucket" if known => self.create_bucket(&args).await?,
            "get_bucket" if known => self.get_bucket(&args).await?,
            "submit_job" if known => {
                self.submit_job(&args, context.meta.get(JOB_ID_META))
                    .await?
            }
            "get_job" if known => self.get_job(&args).await?,
            "export_report" | "report_status" if known => {
                let follows_tasks = context
                    .client_capabilities()
                    .is_some_and(|c| c.supports_tasks());
                let me = self.clone();
                let work: rmcp::task_manager::TaskFuture = if request.name == "export_report" {
                    self.append(
                        "calls.jsonl",
                        &json!({"tool": "export_report", "name": args.get("name")}),
                    )
                    .await?;
                    Box::pin(async move { me.export_report(args).await.map_err(Into::into) })
                } else {
                    Box::pin(async move {
                        let exports = me.lines("exports.jsonl").await.len();
                        Ok(CallToolResult::structured(json!({"exports": exports})))
                    })
                };
                if !follows_tasks {
                    return work
                        .await
                        .map(CallToolResponse::Complete)
                        .map_err(|exit| match exit {
                            rmcp::task_manager::TaskExit::Error(error) => error,
                            rmcp::task_manager::TaskExit::Cancelled => {
                                McpError::internal_error("cancelled", None)
                            }
                        });
                }
                let task = self.tasks.spawn(
                    rmcp::task_manager::TaskOptions::new().with_poll_interval_ms(50),
                    move |_| work,
                );
                return Ok(CallToolResponse::Task(rmcp::model::CreateTaskResult::new(
                    task,
                )));
            }
            "send_confirmed" if known => self.send_confirmed(&args, &context).await?,
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other:?}"),
                    None,
                ));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        self.tasks
            .get_task(&request.task_id)
            .map(rmcp::model::GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.cancel_task(&request.task_id)
    }
}

/// Serves the example tools over stdio until stdin closes.
async fn serve_stdio(set: ToolSet, state_dir: PathBuf, faults: Faults) -> anyhow::Result<()> {
    std::fs::create_dir_all(&state_dir)?;
    // Lets tests find (and kill) this process.
    std::fs::write(
        state_dir.join(format!("{set:?}.pid").to_lowercase()),
        std::process::id().to_string(),
    )?;
    let server = ExampleTools {
        set,
        state_dir: Arc::new(state_dir),
        lock: Arc::default(),
        faults,
        tasks: Arc::default(),
    };
    server
        .serve(rmcp::transport::stdio())
        .await?
        .waiting()
        .await?;
    Ok(())
}

/// Serves the example tools over Streamable HTTP at `/mcp` on `listener`.
async fn serve_http(
    set: ToolSet,
    state_dir: PathBuf,
    faults: Faults,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    };
    std::fs::create_dir_all(&state_dir)?;
    let server = ExampleTools {
        set,
        state_dir: Arc::new(state_dir),
        lock: Arc::default(),
        faults,
        tasks: Arc::default(),
    };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        NeverSessionManager::default().into(),
        StreamableHttpServerConfig::default().with_legacy_session_mode(false),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    axum::serve(
        axum::serve::ListenerExt::tap_io(listener, leasegate::mcp::no_delay),
        app,
    )
    .await?;
    Ok(())
}
