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
            r#"database_url = "{database_url}"
tenant = "tenant-a"
listen = "127.0.0.1:0"
control_listen = "127.0.0.1:0"
adapters = "adapters"
policy = "policies/test.toml"
migrate = false

[upstreams.payments]
transport = "stdio"
command = "{EXAMPLE_TOOLS}"
args = ["--tools", "payments", "--state-dir", "{state}"]

[upstreams.mailer]
transport = "stdio"
command = "{EXAMPLE_TOOLS}"
args = ["--tools", "mailer", "--state-dir", "{state}"]
"#,
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
        let control = match proxy.config.control_listen {
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

/// `_meta` carrying the lease.
pub fn lease_meta(lease: &LeaseClaim) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(
        "dev.leasegate/lease".into(),
        leasegate::mcp::front::lease_meta(lease),
    );
    meta
}

/// The `dev.leasegate/operation` note of a result.
pub fn operation_note(result: &CallToolResult) -> Value {
    leasegate::mcp::front::operation_of(result).unwrap_or(json!(null))
}
