//! `leasegate-example-tools`: an example MCP tool server with real, counted
//! side effects, for the quickstart and the end-to-end tests. Not part of
//! the product: a separate binary that leasegate runs as an upstream.
//!
//! ```text
//! leasegate-example-tools [--tools payments|mailer|all] [--state-dir DIR] [--http ADDR]
//! ```
//!
//! - `payments`: `charge` honours an `idempotency_key` (the same key returns
//!   the same charge, no new side effect) and `get_charge` (read-only) finds
//!   a charge by its key.
//! - `mailer`: `send_email` has no idempotency at all: every call that
//!   reaches it sends (and it may be told to hang after sending, to play a
//!   lost answer); `mail_stats` (read-only) reports progress as it counts.
//!
//! Every side effect is one JSON line appended to `<state-dir>/charges.jsonl`
//! or `<state-dir>/emails.jsonl`, which is what tests count.

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
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // MCP goes over stdout: logs (warnings only) go to stderr.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let served = match cli.http {
        None => serve_stdio(cli.tools, cli.state_dir).await,
        Some(address) => match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                match listener.local_addr() {
                    Ok(bound) => eprintln!("example tools at http://{bound}/mcp"),
                    Err(error) => eprintln!("leasegate-example-tools: {error}"),
                }
                serve_http(cli.tools, cli.state_dir, listener).await
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
    All,
}

impl std::str::FromStr for ToolSet {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "payments" => Ok(ToolSet::Payments),
            "mailer" => Ok(ToolSet::Mailer),
            "all" => Ok(ToolSet::All),
            other => Err(format!("{other:?} is not one of payments, mailer, all")),
        }
    }
}

#[derive(Clone)]
struct ExampleTools {
    set: ToolSet,
    state_dir: Arc<PathBuf>,
    /// Serialises side effects so that counting is exact.
    lock: Arc<Mutex<()>>,
}

fn schema(value: Value) -> Arc<JsonObject> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

fn tools(set: ToolSet) -> Vec<Tool> {
    let mut tools = Vec::new();
    if set != ToolSet::Mailer {
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
    if set != ToolSet::Payments {
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
    tools
}

impl ExampleTools {
    fn file(&self, name: &str) -> PathBuf {
        self.state_dir.join(name)
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
        let charge = {
            let _guard = self.lock.lock().await;
            // Every call is logged, so tests can count what reached the tool.
            self.append(
                "calls.jsonl",
                &json!({"tool": "charge", "idempotency_key": key, "traceparent": trace}),
            )
            .await?;
            let charges = self.lines("charges.jsonl").await;
            if let Some(key) = key
                && let Some(existing) = charges.iter().find(|c| c["idempotency_key"] == key)
            {
                let mut body = existing.clone();
                body["replayed"] = json!(true);
                return Ok(CallToolResult::structured(body));
            }
            let charge = json!({"charge_id": format!("ch_{}", charges.len() + 1), "amount": amount,
                                "currency": currency, "idempotency_key": key, "replayed": false});
            self.append("charges.jsonl", &charge).await?;
            charge
        };
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
        let sent = {
            let _guard = self.lock.lock().await;
            let count = self.lines("emails.jsonl").await.len();
            let email = json!({"message_id": format!("msg_{}", count + 1), "to": to,
                               "subject": args.get("subject"), "body": args.get("body")});
            self.append("emails.jsonl", &email).await?;
            email
        };
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
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("leasegate-example-tools", env!("CARGO_PKG_VERSION")),
        )
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
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other:?}"),
                    None,
                ));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Serves the example tools over stdio until stdin closes.
async fn serve_stdio(set: ToolSet, state_dir: PathBuf) -> anyhow::Result<()> {
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
