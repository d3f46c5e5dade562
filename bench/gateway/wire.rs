//! Round trips on the wire: [`FrontendCounter`] reads the PostgreSQL
//! frontend protocol a client sends and counts the messages that end a round
//! trip; [`CountingProxy`] sits between leasegate and its ledger and counts
//! them per connection.

use super::*;

/// Counts, in the bytes a PostgreSQL client sends, the messages that end a
/// round trip: `Sync` (`S`, the end of an extended-protocol exchange: one
/// per prepared statement executed, or per pipeline), simple `Query` (`Q`)
/// and the legacy `FunctionCall` (`F`). Startup, SSL and GSS requests (no
/// type byte) and authentication are skipped. Bytes may arrive split
/// anywhere; [`FrontendCounter::feed`] keeps the partial header.
///
/// It also attributes work to SQL text: each `Execute` (`E`) to the
/// statement its `Bind` named (as the `Parse` that prepared it on this
/// connection said, first [`STATEMENT_PREFIX`] bytes), each simple query to
/// its text (`executions`).
///
/// TLS cannot be read: the proxied URL says `sslmode=disable`.
#[derive(Debug, Default)]
pub struct FrontendCounter {
    /// After the StartupMessage: every message has a type byte.
    typed: bool,
    header: Vec<u8>,
    /// The current message's type, when its body is kept (`P`, `B`, `Q`).
    kept_type: Option<u8>,
    /// The start of the current message's body, for `P`, `B` and `Q`.
    body: Vec<u8>,
    /// Bytes of the current message's body still to come.
    remaining: usize,
    /// Prepared statement name → its SQL text (this connection's).
    statements: std::collections::HashMap<String, String>,
    /// The SQL text of the statement last bound.
    bound: Option<String>,
    /// Since the last `Sync`: a `Parse` seen, an `Execute` seen.
    parsed: bool,
    executed: bool,
    pub round_trips: u64,
    pub messages: u64,
    /// SQL text → executions (extended protocol) or simple queries.
    pub executions: BTreeMap<String, u64>,
}

/// [`FrontendCounter::executions`]' name for a `Sync` that ends a `Parse`
/// without an `Execute`: a statement prepared (sqlx: once per connection).
pub const PREPARE: &str = "(Parse + Sync: a statement prepared)";
/// … and for a `Sync` with nothing before it: a connection check (sqlx's
/// pool pings every connection it hands out, `test_before_acquire`).
pub const SYNC_ALONE: &str =
    "(Sync alone: a connection check, e.g. sqlx's test_before_acquire ping)";

/// How much of a statement's text names it in [`FrontendCounter::executions`].
pub const STATEMENT_PREFIX: usize = 120;

impl FrontendCounter {
    pub(super) const SSL_REQUEST: u32 = 80_877_103;
    const GSS_REQUEST: u32 = 80_877_104;
    /// Body bytes kept of a `P`, `B` or `Q` message (names and the SQL's start).
    const KEEP: usize = 1024;

    /// Reads `bytes`, the next piece of the client's stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                if self.kept_type.is_some() {
                    let room = Self::KEEP.saturating_sub(self.body.len()).min(n);
                    self.body.extend_from_slice(&bytes[..room]);
                }
                self.remaining -= n;
                bytes = &bytes[n..];
                if self.remaining == 0 {
                    self.end_of_message();
                }
                continue;
            }
            // Untyped: length (4) + code (4); typed: type (1) + length (4).
            let need = if self.typed { 5 } else { 8 };
            let n = (need - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() < need {
                return;
            }
            self.messages += 1;
            if self.typed {
                let kind = self.header[0];
                let length = u32::from_be_bytes(self.header[1..5].try_into().unwrap()) as usize;
                if matches!(kind, b'S' | b'Q' | b'F') {
                    self.round_trips += 1;
                }
                match kind {
                    b'P' => self.parsed = true,
                    b'E' => {
                        self.executed = true;
                        if let Some(sql) = &self.bound {
                            *self.executions.entry(sql.clone()).or_default() += 1;
                        }
                    }
                    b'S' => {
                        // A Sync that ends no execution is a round trip of its own.
                        if !self.executed {
                            let what = if self.parsed { PREPARE } else { SYNC_ALONE };
                            *self.executions.entry(what.to_owned()).or_default() += 1;
                        }
                        (self.parsed, self.executed) = (false, false);
                    }
                    _ => {}
                }
                self.kept_type = matches!(kind, b'P' | b'B' | b'Q').then_some(kind);
                self.remaining = length.saturating_sub(4);
            } else {
                let length = u32::from_be_bytes(self.header[0..4].try_into().unwrap()) as usize;
                let code = u32::from_be_bytes(self.header[4..8].try_into().unwrap());
                // A StartupMessage (a protocol version) ends the untyped part;
                // an SSL or GSS request is followed by another untyped message.
                self.typed = code != Self::SSL_REQUEST && code != Self::GSS_REQUEST;
                self.kept_type = None;
                self.remaining = length.saturating_sub(8);
            }
            self.header.clear();
            if self.remaining == 0 {
                self.end_of_message();
            }
        }
    }

    fn end_of_message(&mut self) {
        let body = std::mem::take(&mut self.body);
        let mut fields = body.split(|&b| b == 0);
        let text =
            |bytes: Option<&[u8]>| String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned();
        match self.kept_type.take() {
            Some(b'P') => {
                let name = text(fields.next());
                let sql = statement_key(&text(fields.next()));
                self.statements.insert(name, sql);
            }
            Some(b'B') => {
                let _portal = fields.next();
                let name = text(fields.next());
                self.bound = self.statements.get(&name).cloned();
            }
            Some(b'Q') => {
                let sql = statement_key(&text(fields.next()));
                *self.executions.entry(sql).or_default() += 1;
            }
            _ => {}
        }
    }
}

/// SQL text with its whitespace folded, cut to [`STATEMENT_PREFIX`] bytes.
pub(super) fn statement_key(sql: &str) -> String {
    let folded = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut end = folded.len().min(STATEMENT_PREFIX);
    while !folded.is_char_boundary(end) {
        end -= 1;
    }
    folded[..end].to_owned()
}

/// A TCP proxy to PostgreSQL that counts, over all its connections, the
/// round trips clients start ([`FrontendCounter`]). Connections are relayed
/// with `TCP_NODELAY` on both sides; it lives as long as its tasks.
pub struct CountingProxy {
    pub port: u16,
    round_trips: Arc<AtomicU64>,
    /// SQL text → executions, over all connections.
    executions: Arc<Mutex<BTreeMap<String, u64>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    pub async fn start(target: (String, u16)) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let executions = Arc::new(Mutex::new(BTreeMap::new()));
        let counted = round_trips.clone();
        let executed = executions.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                let counted = counted.clone();
                let executed = executed.clone();
                tokio::spawn(async move {
                    let Ok(server) =
                        tokio::net::TcpStream::connect((target.0.as_str(), target.1)).await
                    else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = async move {
                        let mut counter = FrontendCounter::default();
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let n = match client_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let before = counter.round_trips;
                            counter.feed(&buffer[..n]);
                            if !counter.executions.is_empty() {
                                let mut executed = executed.lock().unwrap();
                                for (sql, count) in std::mem::take(&mut counter.executions) {
                                    *executed.entry(sql).or_default() += count;
                                }
                            }
                            counted.fetch_add(counter.round_trips - before, Ordering::Relaxed);
                            if server_write.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = server_write.shutdown().await;
                    };
                    let downstream = async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                        let _ = client_write.shutdown().await;
                    };
                    tokio::join!(upstream, downstream);
                });
            }
        });
        Ok(Self {
            port,
            round_trips,
            executions,
            accept,
        })
    }

    /// Round trips counted so far.
    pub fn count(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Executions per SQL text so far.
    pub fn executions(&self) -> BTreeMap<String, u64> {
        self.executions.lock().unwrap().clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Host and port of a `postgres://` URL (defaults 127.0.0.1 and 5432).
pub fn host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("not a URL: {url}"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => {
            (host, port.parse().context("the URL's port")?)
        }
        _ => (host_port, 5432),
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok((host.trim_matches(['[', ']']).to_owned(), port))
}
