//! End-to-end harness: leasegate started in-process on 127.0.0.1:0 through
//! `app::run`, the seam `leasegate serve` uses, the example tool server
//! (`leasegate-example-tools`) as real stdio children (or over HTTP), and
//! rmcp clients over real transports.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use leasegate::app::{Listeners, Proxy};
use leasegate::config::Config;
use leasegate::ledger::LeaseClaim;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, Implementation, ProgressNotificationParam, RequestMetaObject, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

pub const LEASEGATE: &str = env!("CARGO_BIN_EXE_leasegate");
/// The example tool server (`examples/example_tools/`).
pub const EXAMPLE_TOOLS: &str = env!("CARGO_BIN_EXE_leasegate-example-tools");

pub const PAYMENTS_ADAPTER: &str = r#"upstream = "payments"
timeout = "2s"
[tools.charge]
capability = "idempotency_key"
operation_id_argument = "idempotency_key"
key_retention = "24h"
remote_id_pointer = "/charge_id"
timeout = "2s"
[tools.get_charge]
read_only = true
"#;

pub const MAILER_ADAPTER: &str = r#"upstream = "mailer"
trust_annotations = true
timeout = "2s"
[tools.send_email]
capability = "none"
timeout = "700ms"
remote_id_pointer = "/message_id"
"#;

/// The top-level keys every test config starts with: `database_url`,
/// tenant `tenant-a`, the MCP listener on an ephemeral port, the control
/// listener at `control_listen` (`127.0.0.1:0` or `off`), adapters in
/// `adapters/`, the policy `policies/test.toml`, no migrations.
pub fn config_head(database_url: &str, control_listen: &str) -> String {
    format!(
        r#"database_url = "{database_url}"
tenant = "tenant-a"
listen = "127.0.0.1:0"
control_listen = "{control_listen}"
adapters = "adapters"
policy = "policies/test.toml"
migrate = false
"#
    )
}

/// A scratch directory with the config, adapters, policy and tool state.
pub struct Scenario {
    pub dir: PathBuf,
}

impl Scenario {
    /// Writes a config for `database_url` with the example tools as two
    /// stdio upstreams, the shipped-style adapters with short timeouts, and
    /// `policy` as the policy file.
    pub fn new(database_url: &str, policy: &str) -> Self {
        Self::with_adapters(database_url, policy, PAYMENTS_ADAPTER, MAILER_ADAPTER)
    }

    /// A scenario with the given adapter files for `payments` and `mailer`.
    pub fn with_adapters(database_url: &str, policy: &str, payments: &str, mailer: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("leasegate-e2e-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("adapters")).unwrap();
        std::fs::create_dir_all(dir.join("policies")).unwrap();
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let state = dir.join("state");
        let config = format!(
            r#"{head}
[upstreams.payments]
transport = "stdio"
command = "{EXAMPLE_TOOLS}"
args = ["--tools", "payments", "--state-dir", "{state}"]

[upstreams.mailer]
transport = "stdio"
command = "{EXAMPLE_TOOLS}"
args = ["--tools", "mailer", "--state-dir", "{state}"]
"#,
            head = config_head(database_url, "127.0.0.1:0"),
            state = state.display()
        );
        std::fs::write(dir.join("leasegate.toml"), config).unwrap();
        std::fs::write(dir.join("adapters/payments.toml"), payments).unwrap();
        std::fs::write(dir.join("adapters/mailer.toml"), mailer).unwrap();
        std::fs::write(dir.join("policies/test.toml"), policy).unwrap();
        Self { dir }
    }

    /// Adds the example tools' `tools` set as a third stdio upstream `name`
    /// with `adapter` as its adapter file.
    pub fn add_upstream(&self, name: &str, tools: &str, adapter: &str) {
        use std::io::Write;
        let state = self.dir.join("state");
        let mut config = std::fs::OpenOptions::new()
            .append(true)
            .open(self.config_path())
            .unwrap();
        write!(
            config,
            "\n[upstreams.{name}]\ntransport = \"stdio\"\ncommand = \"{EXAMPLE_TOOLS}\"\nargs = [\"--tools\", \"{tools}\", \"--state-dir\", \"{state}\"]\n",
            state = state.display()
        )
        .unwrap();
        std::fs::write(self.dir.join(format!("adapters/{name}.toml")), adapter).unwrap();
    }

    /// Puts `lines` (top-level keys) at the head of the config.
    pub fn prepend_config(&self, lines: &str) {
        let config = std::fs::read_to_string(self.config_path()).unwrap();
        std::fs::write(self.config_path(), format!("{lines}\n{config}")).unwrap();
    }

    /// Puts `head` (top-level keys) before the config and `tail` (tables)
    /// after it.
    pub fn surround_config(&self, head: &str, tail: &str) {
        let config = std::fs::read_to_string(self.config_path()).unwrap();
        std::fs::write(self.config_path(), format!("{head}\n{config}\n{tail}")).unwrap();
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("leasegate.toml")
    }

    /// Side effects the example server performed, one JSON value each.
    pub fn side_effects(&self, file: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("state").join(file))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// leasegate serving MCP over HTTP on an ephemeral port.
pub struct RunningProxy {
    pub url: String,
    /// The control API, served beside the MCP front as `leasegate serve`
    /// does; empty when the config says `control_listen = "off"`.
    pub control_url: String,
    /// The background loops' progress counters.
    pub signals: Option<std::sync::Arc<leasegate::reconcile::Signals>>,
    /// The upstream clients, for their health.
    pub upstreams: Arc<leasegate::mcp::Upstreams>,
    /// Cancelled by [`RunningProxy::stop`]: `app::run`'s shutdown signal.
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningProxy {
    pub async fn start(config: &Path) -> Self {
        let config = Config::load(config).expect("the scenario config is valid");
        let proxy = Proxy::start(config).await.expect("leasegate starts");
        let signals = proxy.background_signals();
        let upstreams = proxy.upstreams();
        // Ephemeral ports, and a control listener only where the config has one.
        let control = match proxy.config.http.control_listen {
            Some(_) => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let listeners = Listeners {
            mcp: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            control,
        };
        let url = format!("http://{}/mcp", listeners.mcp.local_addr().unwrap());
        let control_url = listeners
            .control
            .as_ref()
            .map(|control| format!("http://{}", control.local_addr().unwrap()))
            .unwrap_or_default();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(leasegate::app::run(
            proxy,
            listeners,
            shutdown.clone().cancelled_owned(),
        ));
        Self {
            url,
            control_url,
            signals,
            upstreams,
            shutdown,
            task,
        }
    }

    /// A [`Scenario`] for `database_url` with `policy` (the example tools as
    /// its upstreams), served in-process.
    pub async fn serve(database_url: &str, policy: &str) -> (Scenario, Self) {
        let scenario = Scenario::new(database_url, policy);
        let proxy = Self::start(&scenario.config_path()).await;
        (scenario, proxy)
    }

    /// Shuts the proxy down as ctrl-c does `leasegate serve`, and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        crate::common::within("leasegate to shut down", self.task)
            .await
            .expect("the serving task ends")
            .expect("leasegate served and shut down cleanly");
    }
}

/// An MCP client that records the progress notifications it receives.
#[derive(Clone, Default)]
pub struct Agent {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Agent {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("e2e-agent", "0.1.0"),
        )
    }
}

pub type AgentClient = RunningService<RoleClient, Agent>;

/// Connects an agent over Streamable HTTP, with the lease headers if given.
pub async fn connect_http(url: &str, lease_headers: Option<&LeaseClaim>) -> (AgentClient, Agent) {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(lease) = lease_headers {
        let headers = [
            ("leasegate-run-id", lease.run_id.to_string()),
            ("leasegate-owner", lease.owner.clone()),
            ("leasegate-epoch", lease.epoch.to_string()),
        ]
        .into_iter()
        .chain(
            lease
                .token
                .as_ref()
                .map(|token| ("leasegate-lease-token", token.expose().to_owned())),
        )
        .map(|(name, value)| {
            (
                http::HeaderName::from_static(name),
                http::HeaderValue::from_str(&value).unwrap(),
            )
        })
        .collect();
        config = config.custom_headers(headers);
    }
    let agent = Agent::default();
    let client = agent
        .clone()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("connect");
    (client, agent)
}

/// Connects an agent over Streamable HTTP sending `headers` with every request.
pub async fn connect_http_with(url: &str, headers: &[(&'static str, &str)]) -> AgentClient {
    let headers = headers
        .iter()
        .map(|(name, value)| {
            (
                http::HeaderName::from_static(name),
                http::HeaderValue::from_str(value).unwrap(),
            )
        })
        .collect();
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    Agent::default()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("connect")
}

/// Calls a tool with extra `_meta`; returns the result or the JSON-RPC error (code, message).
pub async fn call(
    client: &AgentClient,
    tool: &str,
    arguments: Value,
    meta: Option<Map<String, Value>>,
) -> Result<CallToolResult, (i32, String)> {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let mut options = PeerRequestOptions::no_options();
    if let Some(meta) = meta {
        let mut request_meta = RequestMetaObject::new();
        for (key, value) in meta {
            request_meta.insert(key, value);
        }
        options = options.with_meta(request_meta);
    }
    let handle = client
        .peer()
        .send_request_with_option(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            options,
        )
        .await
        .map_err(|e| (0, e.to_string()))?;
    match handle.await_response().await {
        Ok(ServerResult::CallToolResult(result)) => Ok(result),
        Ok(other) => Err((0, format!("unexpected {other:?}"))),
        Err(ServiceError::McpError(error)) => Err((error.code.0, error.message.to_string())),
        Err(other) => Err((0, other.to_string())),
    }
}

/// Starts `call` of `tool` with `arguments` (no extra `_meta`) in the
/// background, for a test that acts while the call is in flight.
pub fn spawn_call(
    client: &Arc<AgentClient>,
    tool: &'static str,
    arguments: Value,
) -> tokio::task::JoinHandle<Result<CallToolResult, (i32, String)>> {
    let client = client.clone();
    tokio::spawn(async move { call(&client, tool, arguments, None).await })
}

/// Calls the example `payments__charge` for `amount` euros with extra
/// `_meta` (the lease, or none where the headers carry it).
pub async fn charge_eur(
    client: &AgentClient,
    amount: i64,
    meta: Option<Map<String, Value>>,
) -> Result<CallToolResult, (i32, String)> {
    call(
        client,
        "payments__charge",
        json!({"amount": amount, "currency": "eur"}),
        meta,
    )
    .await
}

/// Calls the example `mailer__send_email` to `to` with extra `_meta` (the
/// lease, or none where the headers carry it).
pub async fn send_email(
    client: &AgentClient,
    to: &str,
    meta: Option<Map<String, Value>>,
) -> Result<CallToolResult, (i32, String)> {
    call(client, "mailer__send_email", json!({"to": to}), meta).await
}

/// The names of the tools `client` lists (every page followed), in order.
pub async fn tool_names<H: ClientHandler>(client: &RunningService<RoleClient, H>) -> Vec<String> {
    client
        .peer()
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect()
}

/// `_meta` carrying the lease.
pub fn lease_meta(lease: &LeaseClaim) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(
        "dev.leasegate/lease".into(),
        leasegate::mcp::front::lease_meta(lease),
    );
    meta
}

/// A result's structured content as the tool wrote it: without the
/// sentence leasegate adds to a replay's (`convert::OUTCOME_KEY`).
pub fn tool_fields(structured: Option<&Value>) -> Option<Value> {
    structured.cloned().map(|mut value| {
        if let Some(fields) = value.as_object_mut() {
            fields.remove(leasegate::mcp::convert::OUTCOME_KEY);
        }
        value
    })
}

/// The `dev.leasegate/operation` note of a result.
pub fn operation_note(result: &CallToolResult) -> Value {
    leasegate::mcp::front::operation_of(result).unwrap_or(json!(null))
}

/// A `leasegate serve` child process whose stderr the test reads: the URLs
/// its listeners print, and every line it logs (kept draining, so the child
/// never blocks on a full pipe).
pub struct ServedChild {
    pub child: tokio::process::Child,
    /// `http://…/mcp`.
    pub mcp: String,
    /// The control listener's base URL (without `/v1`).
    pub control: String,
    /// Every stderr line so far.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Ends when stderr does (the child exited).
    pub drained: tokio::task::JoinHandle<()>,
}

impl ServedChild {
    /// `leasegate serve --config <scenario's config>` with `env`.
    pub fn command(scenario: &Scenario, env: &[(&str, &str)]) -> tokio::process::Command {
        Self::serve_with(tokio::process::Command::new(LEASEGATE), scenario, env)
    }

    /// `command` (leasegate, or a wrapper that execs it) given `serve
    /// --config <scenario's config>` and `env`.
    pub fn serve_with(
        mut command: tokio::process::Command,
        scenario: &Scenario,
        env: &[(&str, &str)],
    ) -> tokio::process::Command {
        command
            .arg("serve")
            .arg("--config")
            .arg(scenario.config_path());
        for (name, value) in env {
            command.env(name, value);
        }
        command
    }

    /// Spawns `command` (stderr piped here, killed on drop) and waits, with
    /// the suite's deadline, until both listeners are announced; a child
    /// that exits first fails the test with what it logged.
    pub async fn spawn(mut command: tokio::process::Command) -> ServedChild {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = command
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn leasegate serve");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (mut mcp, mut control) = (None, None);
        super::within("leasegate serve to listen", async {
            while mcp.is_none() || control.is_none() {
                let line = lines.next_line().await.unwrap().unwrap_or_else(|| {
                    panic!("leasegate exited: {}", log.lock().unwrap().join("\n"))
                });
                if let Some(url) = line.strip_prefix("leasegate: serving MCP at ") {
                    mcp = Some(url.to_owned());
                }
                if let Some(url) = line.strip_prefix("leasegate: control API at ") {
                    control = Some(url.trim_end_matches("/v1").to_owned());
                }
                log.lock().unwrap().push(line);
            }
        })
        .await;
        let kept = log.clone();
        let drained = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        ServedChild {
            child,
            mcp: mcp.unwrap(),
            control: control.unwrap(),
            log,
            drained,
        }
    }

    /// Everything logged so far, one line per line.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

/// The example tool server `tools` over Streamable HTTP at `address`
/// (`127.0.0.1:0` for an ephemeral port), recording into `state`; returns
/// the child and the address it listens on. Its stderr is drained.
pub async fn http_tool_server(
    tools: &str,
    address: &str,
    state: &std::path::Path,
    extra: &[&str],
) -> (tokio::process::Child, String) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(EXAMPLE_TOOLS)
        .args(["--tools", tools, "--http", address, "--state-dir"])
        .arg(state)
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = super::within("the tool server to listen", async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the tool server prints its address");
            if let Some(url) = line.strip_prefix("example tools at http://") {
                return url.trim_end_matches("/mcp").to_owned();
            }
        }
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, listening)
}
