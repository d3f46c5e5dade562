//! The catalog agents see: the upstreams' tools under exposed names
//! (`<upstream><sep><name>`, resources as `<upstream>+<uri>`), replaced
//! whole when an upstream's list changes and re-listed when older than
//! [`CATALOG_MAX_AGE`]; the merged `initialize` answer; leasegate's own
//! pagination of merged lists. Nothing here is durable: a restart lists
//! the upstreams again.

use super::Front;
use super::request::invalid_params;
use crate::mcp::upstream::CatalogEntry;
use crate::mcp::wire::*;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The exposed tools, replaced whole when an upstream's list changes.
pub(super) struct Catalog {
    pub(super) entries: BTreeMap<String, CatalogEntry>,
    /// The entries' tools in name order, for pagination.
    pub(super) tools: Vec<Tool>,
    pub(super) built: std::time::Instant,
}

/// A `tools/list` from an agent re-lists the upstreams when the catalog is
/// older than this. `list_changed` refreshes at once, but an upstream may
/// send it where nobody hears it (a Streamable HTTP server before the
/// client's GET stream is open), so the catalog never stays stale longer.
pub(super) const CATALOG_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a catalog refresh waits for an upstream's `tools/list`.
pub(super) const REFRESH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Front {
    pub(super) fn catalog(&self) -> Arc<Catalog> {
        self.state
            .catalog
            .read()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    pub(super) fn separator(&self) -> &str {
        &self.state.config.naming.separator
    }

    pub(super) fn unprefixed(&self, upstream: &str) -> bool {
        self.state
            .config
            .naming
            .unprefixed
            .iter()
            .any(|u| u == upstream)
    }

    /// `<upstream><separator><own>`, or `own` for unprefixed upstreams.
    pub(super) fn expose(&self, upstream: &str, own: &str, separator: &str) -> String {
        if self.unprefixed(upstream) {
            own.to_owned()
        } else {
            format!("{upstream}{separator}{own}")
        }
    }

    /// The upstream and its own name for an exposed one (prefixed by an
    /// upstream and `separator`, else the unprefixed upstream's own).
    pub(super) fn resolve(&self, exposed: &str, separator: &str) -> Option<(String, String)> {
        for upstream in self.state.upstreams.names() {
            if self.unprefixed(upstream) {
                continue;
            }
            if let Some(rest) = exposed
                .strip_prefix(upstream)
                .and_then(|r| r.strip_prefix(separator))
            {
                return Some((upstream.to_owned(), rest.to_owned()));
            }
        }
        self.state
            .upstreams
            .names()
            .find(|u| self.unprefixed(u))
            .map(|u| (u.to_owned(), exposed.to_owned()))
    }

    /// A tool or prompt name as exposed: `<upstream><sep><name>`.
    pub(super) fn exposed_name(&self, upstream: &str, name: &str) -> String {
        self.expose(upstream, name, self.separator())
    }

    /// The upstream and its own name of an exposed tool or prompt name.
    pub(super) fn resolve_name(&self, exposed: &str) -> Option<(String, String)> {
        self.resolve(exposed, self.separator())
    }

    /// A resource URI (or template) as exposed: `<upstream>+<uri>`.
    pub(super) fn exposed_uri(&self, upstream: &str, uri: &str) -> String {
        self.expose(upstream, uri, URI_SEPARATOR)
    }

    /// The upstream and its own URI of an exposed resource URI.
    pub(super) fn resolve_uri(&self, exposed: &str) -> Option<(String, String)> {
        self.resolve(exposed, URI_SEPARATOR)
    }

    /// Rewrites the resource URIs of a result from `upstream` to their
    /// exposed form: resource links and embedded resources in `content`
    /// (tool results) and in `messages[].content` (prompts), and
    /// `contents[].uri` (resource reads). Nothing else is touched: a tool's
    /// `structuredContent` and `_meta` are the tool's own data.
    pub(super) fn expose_uris(&self, upstream: &str, value: &mut Value) {
        let expose = |uri: Option<&mut Value>| {
            if let Some(Value::String(uri)) = uri {
                *uri = self.exposed_uri(upstream, uri);
            }
        };
        let expose_block = |block: &mut Value| match block.get("type").and_then(Value::as_str) {
            Some("resource_link") => expose(block.get_mut("uri")),
            Some("resource") => expose(block.pointer_mut("/resource/uri")),
            _ => {}
        };
        if let Some(Value::Array(blocks)) = value.get_mut("content") {
            blocks.iter_mut().for_each(expose_block);
        }
        if let Some(Value::Array(messages)) = value.get_mut("messages") {
            for message in messages {
                match message.get_mut("content") {
                    Some(Value::Array(blocks)) => blocks.iter_mut().for_each(expose_block),
                    Some(block) => expose_block(block),
                    None => {}
                }
            }
        }
        if let Some(Value::Array(contents)) = value.get_mut("contents") {
            for content in contents {
                expose(content.get_mut("uri"));
            }
        }
    }

    /// Upstreams whose capabilities satisfy `has`.
    pub(super) fn upstreams_with(&self, has: impl Fn(&ServerCapabilities) -> bool) -> Vec<String> {
        self.state
            .upstreams
            .names()
            .filter(|u| {
                self.state
                    .upstreams
                    .server_info(u)
                    .is_some_and(|info| has(&info.capabilities))
            })
            .map(str::to_owned)
            .collect()
    }
}

/// The server info leasegate answers `initialize` with: the capabilities
/// any upstream has (list changes always announced: leasegate sends them
/// when its merged lists change), and every upstream's instructions under
/// its name.
pub(super) fn merged_info(infos: &[(&str, Arc<rmcp::model::ServerPeerInfo>)]) -> ServerConfig {
    let any = |has: &dyn Fn(&ServerCapabilities) -> bool| {
        infos.iter().any(|(_, info)| has(&info.capabilities))
    };
    let mut capabilities = json!({"tools": {"listChanged": true}});
    if any(&|c| c.resources.is_some()) {
        let subscribe = any(&|c| {
            c.resources
                .as_ref()
                .is_some_and(|r| r.subscribe == Some(true))
        });
        capabilities["resources"] = json!({"listChanged": true, "subscribe": subscribe});
    }
    if any(&|c| c.prompts.is_some()) {
        capabilities["prompts"] = json!({"listChanged": true});
    }
    if any(&|c| c.completions.is_some()) {
        capabilities["completions"] = json!({});
    }
    if any(&|c| c.logging.is_some()) {
        capabilities["logging"] = json!({});
    }
    // Tasks are routed by the upstream that made them (`front::tasks`).
    if any(&|c| c.supports_tasks()) {
        capabilities["extensions"] = json!({ (rmcp::model::TASKS_EXTENSION_ID): {} });
    }
    let capabilities: ServerCapabilities = serde_json::from_value(capabilities).unwrap_or_default();
    let mut instructions = String::from(
        "leasegate fronts these MCP servers; tools and prompts are named <server>__<name>, resources <server>+<uri>. Side-effecting tool calls are recorded once per intent and replayed on retry.",
    );
    for (upstream, info) in infos {
        if let Some(text) = &info.instructions {
            instructions.push_str(&format!("\n\n[{upstream}]\n{text}"));
        }
    }
    ServerConfig::new(capabilities)
        .with_server_info(Implementation::new("leasegate", env!("CARGO_PKG_VERSION")))
        .with_instructions(instructions)
}

impl Front {
    /// Re-lists `upstream`'s tools and replaces its part of the catalog and
    /// the directory.
    pub(super) async fn refresh_tools(&self, upstream: &str) -> Result<(), String> {
        // One refresh at a time: each reads the catalog and replaces it.
        let _one_at_a_time = self.state.refreshing.lock().await;
        self.refresh_locked(upstream).await
    }

    /// Re-lists every upstream if the catalog is older than
    /// `CATALOG_MAX_AGE` (checked again under the lock, so concurrent
    /// `tools/list` calls refresh once).
    pub(super) async fn refresh_if_stale(&self) {
        let _one_at_a_time = self.state.refreshing.lock().await;
        if self.catalog().built.elapsed() <= CATALOG_MAX_AGE {
            return;
        }
        let upstreams: Vec<String> = self.state.upstreams.names().map(str::to_owned).collect();
        for upstream in upstreams {
            if let Err(error) = self.refresh_locked(&upstream).await {
                tracing::warn!(%upstream, error = %crate::logfield::clip_display(&error), "tools/list failed; its tools are served as last listed");
            }
        }
    }

    pub(super) async fn refresh_locked(&self, upstream: &str) -> Result<(), String> {
        let tools =
            tokio::time::timeout(REFRESH_TIMEOUT, self.state.upstreams.list_tools(upstream))
                .await
                .map_err(|_| format!("tools/list took more than {REFRESH_TIMEOUT:?}"))??;
        let current = self.catalog();
        let mut entries: BTreeMap<String, CatalogEntry> = current
            .entries
            .iter()
            .filter(|(_, e)| e.upstream != upstream)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for tool in tools {
            let exposed = self.exposed_name(upstream, &tool.name);
            if let Some(existing) = entries.get(&exposed) {
                tracing::warn!(name = %crate::logfield::clip(&exposed), first = %existing.upstream, second = %upstream,
                    "tool name collision after list_changed; keeping the first");
                continue;
            }
            let mut exposed_tool = tool.clone();
            exposed_tool.name = exposed.clone().into();
            entries.insert(
                exposed,
                CatalogEntry {
                    upstream: upstream.to_owned(),
                    upstream_tool: tool.name.to_string(),
                    object: self.state.upstreams.tool_object(upstream, &tool.name),
                    tool: exposed_tool,
                },
            );
        }
        let directory = crate::mcp::upstream::directory(&entries, &self.state.config);
        crate::mcp::upstream::hide_filled_arguments(&mut entries, &directory);
        self.state.directory.replace(directory);
        if let Ok(mut catalog) = self.state.catalog.write() {
            *catalog = Arc::new(Catalog::new(entries));
        }
        Ok(())
    }

    /// One page of `items` after `cursor` (leasegate's own pagination).
    pub(super) fn page<T: Clone>(
        &self,
        items: &[T],
        cursor: Option<String>,
    ) -> Result<(Vec<T>, Option<String>), McpError> {
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= items.len())
                .ok_or_else(|| invalid_params(format!("invalid cursor {cursor:?}")))?,
        };
        let end = (start + self.state.config.naming.tools_page_size).min(items.len());
        let next = (end < items.len()).then(|| end.to_string());
        Ok((items[start..end].to_vec(), next))
    }

    /// One page of leasegate's own listing of `method` (resources,
    /// templates or prompts): every page of every upstream that offers it,
    /// each item's `renamed` field (`uri`, `uriTemplate` or `name`) in its
    /// exposed form, everything else as the upstream sent it.
    pub(super) async fn merged_list<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        field: &str,
        renamed: &str,
        cursor: Option<String>,
        context: &RequestContext<RoleServer>,
    ) -> Result<T, McpError> {
        let prompts = field == "prompts";
        let offers = |c: &ServerCapabilities| {
            if prompts {
                c.prompts.is_some()
            } else {
                c.resources.is_some()
            }
        };
        let mut items = Vec::new();
        for upstream in self.upstreams_with(offers) {
            let mut upstream_cursor: Option<String> = None;
            loop {
                let params = match &upstream_cursor {
                    Some(c) => json!({"cursor": c}),
                    None => json!({}),
                };
                let result = self.forward(&upstream, method, params, context).await?;
                let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
                if let Some(Value::Array(page)) = value.get_mut(field).map(Value::take) {
                    for mut item in page {
                        if let Some(Value::String(text)) = item.get_mut(renamed) {
                            *text = if prompts {
                                self.exposed_name(&upstream, text)
                            } else {
                                self.exposed_uri(&upstream, text)
                            };
                        }
                        items.push(item);
                    }
                }
                upstream_cursor = value
                    .get("nextCursor")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                if upstream_cursor.is_none() {
                    break;
                }
            }
        }
        let (page, next) = self.page(&items, cursor)?;
        typed_page(json!({field: page, "nextCursor": next}), method)
    }
}

pub(super) fn typed_page<T: serde::de::DeserializeOwned>(
    mut value: Value,
    what: &str,
) -> Result<T, McpError> {
    if value.get("nextCursor").is_some_and(Value::is_null)
        && let Some(map) = value.as_object_mut()
    {
        map.remove("nextCursor");
    }
    value["resultType"] = json!("complete");
    serde_json::from_value(value)
        .map_err(|e| McpError::internal_error(format!("{what}: {e}"), None))
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new(BTreeMap::new())
    }
}

impl Catalog {
    pub(super) fn new(entries: BTreeMap<String, CatalogEntry>) -> Self {
        let tools = entries.values().map(|entry| entry.tool.clone()).collect();
        Self {
            entries,
            tools,
            built: std::time::Instant::now(),
        }
    }
}
