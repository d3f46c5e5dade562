//! `leasegate init`'s look at an MCP server before it is fronted: start it,
//! list its tools, describe each for the adapter file `init` writes.

use super::StartError;
use super::client::UpstreamClient;
use super::connection::{
    EXIT_GRACE, HANDSHAKE_TIMEOUT, Session, end_child, handshake, open_http, spawn_stdio,
};
use super::routes::CallRoutes;
use crate::config::init::ToolSummary;
use crate::config::{EnvValue, UpstreamTransport};
use rmcp::model::Tool;
use rmcp::transport::async_rw::AsyncRwTransport;
use serde_json::Value;
use std::collections::BTreeMap;
use tokio::sync::broadcast;

/// What `leasegate init` learns of one upstream.
#[derive(Debug, Clone)]
pub struct Inspected {
    /// The server's `name version` from `initialize`, if it said.
    pub server: Option<String>,
    /// Every tool, every page, in the order listed.
    pub tools: Vec<ToolSummary>,
}

/// Connects to one upstream the way [`Upstreams::connect`] does (spawn and
/// `initialize` over stdio, or a Streamable HTTP session), lists its tools
/// (every page), and closes the session again (a stdio child gets its
/// closed stdin, then is killed). For `leasegate init`.
pub async fn inspect_upstream(
    name: &str,
    transport: &UpstreamTransport,
) -> Result<Inspected, StartError> {
    let (events, _) = broadcast::channel(16);
    let handler = UpstreamClient {
        name: name.to_owned(),
        routes: CallRoutes::default(),
        events,
        tool_objects: Default::default(),
        roots_outside_calls: Default::default(),
    };
    // rmcp's transport errors start with the transport's type name.
    let connect_error = |message: String| StartError::Connect {
        upstream: name.to_owned(),
        message: match message.split_once("] error: ") {
            Some((_, rest)) if message.starts_with("Send message error Transport [") => {
                rest.to_owned()
            }
            _ => message,
        },
    };
    let (mut session, child) = match transport {
        UpstreamTransport::Stdio { command, args, env } => {
            let (session, child) = inspect_stdio(&handler, command, args, env)
                .await
                .map_err(connect_error)?;
            (session, Some(child))
        }
        UpstreamTransport::StreamableHttp { url } => {
            (open_http(&handler, url).await.map_err(connect_error)?, None)
        }
    };
    let server = session
        .peer()
        .peer_info()
        .and_then(|info| info.server_info.clone())
        .map(|server| format!("{} {}", server.name, server.version));
    let listed = tokio::time::timeout(HANDSHAKE_TIMEOUT, session.peer().list_all_tools())
        .await
        .map_err(|_| format!("no answer to tools/list within {HANDSHAKE_TIMEOUT:?}"))
        .and_then(|listed| listed.map_err(|e| e.to_string()));
    let _ = session.close_with_timeout(EXIT_GRACE).await;
    if let Some(mut child) = child {
        end_child(&mut child, EXIT_GRACE).await;
    }
    let tools = listed.map_err(|message| StartError::List {
        upstream: name.to_owned(),
        message,
    })?;
    Ok(Inspected {
        server,
        tools: tools.iter().map(tool_summary).collect(),
    })
}

/// [`open_stdio`] with the child's stderr kept rather than shown: a server
/// that fails to start gets its last words quoted in the error, one that
/// works (and complains when its stdout is closed under it) stays quiet.
pub(super) async fn inspect_stdio(
    handler: &UpstreamClient,
    command: &std::path::Path,
    args: &[String],
    env: &BTreeMap<String, EnvValue>,
) -> Result<(Session, tokio::process::Child), String> {
    use tokio::io::AsyncReadExt;
    let mut child = spawn_stdio(command, args, env, std::process::Stdio::piped())?;
    let (Some(stdin), Some(stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the child's stdin, stdout or stderr is not piped".into());
    };
    // The last 2 KB the child wrote to stderr.
    let said = tokio::spawn(async move {
        const KEEP: usize = 2048;
        let mut kept = Vec::new();
        let mut buffer = [0u8; 1024];
        while let Ok(read) = stderr.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            kept.extend_from_slice(&buffer[..read]);
            if kept.len() > KEEP {
                kept.drain(..kept.len() - KEEP);
            }
        }
        String::from_utf8_lossy(&kept).into_owned()
    });
    match handshake(handler, AsyncRwTransport::new_client(stdout, stdin)).await {
        Ok(session) => Ok((session, child)),
        Err(error) => {
            let exit = end_child(&mut child, EXIT_GRACE).await;
            let said = tokio::time::timeout(EXIT_GRACE, said)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
            if said.is_empty() {
                Err(format!("{error} (the command {exit})"))
            } else {
                Err(format!("{error} (the command {exit}; its stderr: {said})"))
            }
        }
    }
}

/// What `init` needs of a listed tool.
pub(super) fn tool_summary(tool: &Tool) -> ToolSummary {
    let annotations = tool.annotations.as_ref();
    ToolSummary {
        name: tool.name.to_string(),
        title: tool
            .title
            .clone()
            .or_else(|| annotations.and_then(|a| a.title.clone())),
        description: tool.description.as_ref().map(|d| d.to_string()),
        read_only_hint: annotations.and_then(|a| a.read_only_hint),
        destructive_hint: annotations.and_then(|a| a.destructive_hint),
        idempotent_hint: annotations.and_then(|a| a.idempotent_hint),
        input_schema: Value::Object((*tool.input_schema).clone()),
    }
}
