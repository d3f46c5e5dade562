//! The upstream's own tool objects, as its `tools/list` answers carried
//! them, for the fields rmcp's typed `Tool` does not know (the `V_2025_11_25`
//! `execution`, vendor fields such as `x-vendor`): rmcp decodes each answer
//! into its model and drops them, so the stdio child's stdout is tapped
//! line by line before rmcp reads it, and a Streamable HTTP upstream's
//! `tools/list` answers (a JSON body, each SSE event's data) are tapped by
//! its HTTP client (`mcp::http_headers::ToolListTap`) before rmcp decodes
//! them.
//!
//! # Invariants
//!
//! 1. Every line reaches rmcp unchanged and in order; the tap only reads.
//! 2. A tool object is kept, by its `name`, when a message answering a
//!    request (a stdio line, an HTTP body or event) carries `result.tools`;
//!    the latest answer naming a tool wins. It is kept before rmcp reads
//!    the message, so once rmcp's `tools/list` returns,
//!    every object of every page it read is here.
//! 3. An object is only ever used for the tool of the same upstream and
//!    name the typed list returned (`Upstreams::tool_object`): a tool the
//!    upstream no longer lists is never shown because it is kept here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};

/// A tool object as the upstream sent it.
pub(crate) type ToolObject = Arc<Map<String, Value>>;

/// One upstream's tool objects by name (shared by its sessions: a restarted
/// child's answers replace them).
#[derive(Clone, Default)]
pub(crate) struct ToolObjects(Arc<Mutex<HashMap<String, ToolObject>>>);

const TOOLS_FIELD: &[u8] = b"\"tools\"";

impl ToolObjects {
    /// The object the upstream last sent for `name`.
    pub(crate) fn get(&self, name: &str) -> Option<ToolObject> {
        self.0.lock().ok()?.get(name).cloned()
    }

    /// The tap of a Streamable HTTP upstream's `tools/list` answers, each
    /// one message (invariant 2).
    pub(super) fn http_tap(&self) -> crate::mcp::http_headers::ToolListTap {
        let objects = self.clone();
        Arc::new(move |message: &[u8]| objects.observe(message))
    }

    /// Keeps the tool objects of `line` (one message) when it answers with `result.tools`
    /// (invariant 2). Lines that do not name the field are not parsed.
    fn observe(&self, line: &[u8]) {
        if !line
            .windows(TOOLS_FIELD.len())
            .any(|window| window == TOOLS_FIELD)
        {
            return;
        }
        let Ok(mut message) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        if message.get("id").is_none() {
            return;
        }
        let Some(Value::Array(tools)) = message.pointer_mut("/result/tools").map(Value::take)
        else {
            return;
        };
        let Ok(mut kept) = self.0.lock() else {
            return;
        };
        for tool in tools {
            if let Value::Object(object) = tool
                && let Some(Value::String(name)) = object.get("name")
            {
                kept.insert(name.clone(), Arc::new(object));
            }
        }
    }
}

/// `stdout` as rmcp should read it, each line seen by `objects` first
/// (invariant 1). Ends when `stdout` ends or fails, or rmcp stops reading.
pub(crate) fn tap<R>(stdout: R, objects: ToolObjects) -> tokio::io::DuplexStream
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (reader, mut writer) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut stdout = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match stdout.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            objects.observe(&line);
            if writer.write_all(&line).await.is_err() {
                return;
            }
        }
    });
    reader
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn lines_pass_unchanged_and_tool_objects_are_kept_whole() {
        let objects = ToolObjects::default();
        let page = json!({"jsonrpc": "2.0", "id": 3, "result": {"tools": [
            {"name": "record", "inputSchema": {"type": "object"},
             "execution": {"taskSupport": "optional"}, "x-vendor": {"tier": 1}}],
            "nextCursor": "1"}});
        let call = json!({"jsonrpc": "2.0", "id": 4, "result": {"content": [
            {"type": "text", "text": "\"tools\""}]}});
        let input = format!("{page}\n{call}\nnot json \"tools\"\n");
        let mut tapped = tap(
            std::io::Cursor::new(input.clone().into_bytes()),
            objects.clone(),
        );
        let mut output = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut tapped, &mut output)
            .await
            .unwrap();
        assert_eq!(output, input);
        let record = objects.get("record").expect("kept");
        assert_eq!(record["execution"], json!({"taskSupport": "optional"}));
        assert_eq!(record["x-vendor"], json!({"tier": 1}));
        assert!(objects.get("echo").is_none());
    }
}
