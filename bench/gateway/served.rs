//! The upstream and `leasegate serve` as a child process: the tool server
//! chosen and its configuration, the served proxy's config, start and stop,
//! and its resident memory.

use super::*;

/// The tool calls of the chosen upstream: exposed names and a check of the answer.
#[derive(Clone, Debug)]
pub(super) struct Tools {
    pub(super) description: String,
    /// Side-effecting (`capability = "none"`) under the upstream `fx`.
    pub(super) gated: &'static str,
    /// The same tool read-only under the upstream `ro`.
    pub(super) pass_through: &'static str,
    everything: bool,
}

impl Tools {
    pub(super) fn arguments(&self, unique: &str) -> Value {
        if self.everything {
            json!({ "message": unique })
        } else {
            json!({ "job_id": unique })
        }
    }

    /// Whether `answer` is the tool's answer to `unique`.
    pub(super) fn answered(&self, answer: &str, unique: &str) -> bool {
        if self.everything {
            answer.contains(&format!("Echo: {unique}"))
        } else {
            answer.contains("\"found\":false")
        }
    }
}

/// The upstream's config lines (`[upstreams.ro]`, `[upstreams.fx]`) and adapters.
pub(super) struct UpstreamConfig {
    pub(super) tools: Tools,
    toml: String,
    adapter_ro: String,
    adapter_fx: String,
}

pub(super) fn upstream_config(settings: &Settings, state: &Path) -> anyhow::Result<UpstreamConfig> {
    let everything = match &settings.upstream {
        UpstreamChoice::ExampleTools => None,
        UpstreamChoice::Everything(path) => Some(
            path.clone()
                .or_else(default_server_everything)
                .ok_or_else(|| anyhow!("server-everything not found (see docs/benchmarks.md)"))?,
        ),
        UpstreamChoice::Auto => default_server_everything().filter(|_| node_available()),
    };
    Ok(match everything {
        Some(entry) => {
            let stdio = format!(
                "transport = \"stdio\"\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\n",
                entry.display().to_string()
            );
            UpstreamConfig {
                tools: Tools {
                    description: format!(
                        "@modelcontextprotocol/server-everything `echo` over stdio ({})",
                        entry.display()
                    ),
                    gated: "fx__echo",
                    pass_through: "ro__echo",
                    everything: true,
                },
                toml: format!("[upstreams.ro]\n{stdio}\n[upstreams.fx]\n{stdio}"),
                adapter_ro: "upstream = \"ro\"\n[tools.echo]\nread_only = true\n".to_owned(),
                adapter_fx: "upstream = \"fx\"\n[tools.echo]\ncapability = \"none\"\n".to_owned(),
            }
        }
        None => {
            let stdio = format!(
                "transport = \"stdio\"\ncommand = {:?}\nargs = [\"--tools\", \"jobs\", \"--state-dir\", {:?}]\n",
                settings.example_tools.display().to_string(),
                state.display().to_string()
            );
            UpstreamConfig {
                tools: Tools {
                    description:
                        "leasegate-example-tools `get_job` over stdio (no server-everything)"
                            .to_owned(),
                    gated: "fx__get_job",
                    pass_through: "ro__get_job",
                    everything: false,
                },
                toml: format!("[upstreams.ro]\n{stdio}\n[upstreams.fx]\n{stdio}"),
                adapter_ro: "upstream = \"ro\"\n[tools.get_job]\nread_only = true\n".to_owned(),
                adapter_fx: "upstream = \"fx\"\n[tools.get_job]\ncapability = \"none\"\n"
                    .to_owned(),
            }
        }
    })
}

/// `LEASEGATE_SERVER_EVERYTHING`, else the suite's install under `target/sdk-node`.
pub(super) fn default_server_everything() -> Option<PathBuf> {
    std::env::var_os("LEASEGATE_SERVER_EVERYTHING")
        .map(PathBuf::from)
        .or_else(|| {
            Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
                "target/sdk-node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            ))
        })
        .filter(|path| path.is_file())
}

pub(super) fn node_available() -> bool {
    std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// How one `leasegate serve` child is configured.
pub(super) struct ServeOptions<'a> {
    pub(super) name: &'a str,
    pub(super) database_url: String,
    pub(super) control: bool,
    pub(super) http_sessions: bool,
}

/// A `leasegate serve` child: its listeners and its pid (for `VmRSS`).
pub(super) struct Served {
    pub(super) child: tokio::process::Child,
    pub(super) mcp: String,
    /// Base URL without `/v1`; empty with the control API off.
    pub(super) control: String,
    /// The last lines it logged (for a failure's message).
    log: Arc<Mutex<Vec<String>>>,
    dir: PathBuf,
    /// The ledger it serves.
    pub(super) database_url: String,
}

impl Served {
    pub(super) async fn start(
        settings: &Settings,
        upstream: &UpstreamConfig,
        options: ServeOptions<'_>,
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "leasegate-bench-gateway-{}-{}",
            options.name,
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join("adapters"))?;
        std::fs::create_dir_all(dir.join("policies"))?;
        std::fs::write(dir.join("policies/bench.toml"), "claim_ttl = \"60s\"\n")?;
        std::fs::write(dir.join("adapters/ro.toml"), &upstream.adapter_ro)?;
        std::fs::write(dir.join("adapters/fx.toml"), &upstream.adapter_fx)?;
        let config = format!(
            r#"database_url = "{url}"
database_max_connections = {pool}
group_commit = {group_commit}
tenant = "bench"
listen = "127.0.0.1:0"
control_listen = "{control}"
adapters = "adapters"
policy = "policies/bench.toml"
migrate = false
http_sessions = {sessions}
{extra}
[limits]
max_sessions = {max_sessions}

{upstreams}"#,
            url = options.database_url,
            pool = settings.db_pool,
            group_commit = settings.group_commit,
            control = if options.control {
                "127.0.0.1:0"
            } else {
                "off"
            },
            sessions = options.http_sessions,
            extra = settings
                .config_lines
                .iter()
                .map(|line| format!("{line}\n"))
                .collect::<String>(),
            max_sessions = settings.sessions.max(1000) + 100,
            upstreams = upstream.toml,
        );
        std::fs::write(dir.join("leasegate.toml"), config)?;
        let mut child = tokio::process::Command::new(&settings.leasegate)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("leasegate.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", settings.leasegate.display()))?;
        let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (mut mcp, mut control) = (None, None);
        let started = tokio::time::timeout(Duration::from_secs(120), async {
            while mcp.is_none() || (options.control && control.is_none()) {
                let Some(line) = lines.next_line().await? else {
                    bail!(
                        "leasegate serve ({}) exited:\n{}",
                        options.name,
                        log.lock().unwrap().join("\n")
                    );
                };
                if let Some(url) = line.strip_prefix("leasegate: serving MCP at ") {
                    mcp = Some(url.to_owned());
                }
                if let Some(url) = line.strip_prefix("leasegate: control API at ") {
                    control = Some(url.trim_end_matches("/v1").to_owned());
                }
                log.lock().unwrap().push(line);
            }
            anyhow::Ok(())
        })
        .await;
        match started {
            Ok(result) => result?,
            Err(_) => bail!(
                "leasegate serve ({}) did not listen within 120 s:\n{}",
                options.name,
                log.lock().unwrap().join("\n")
            ),
        }
        let kept = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = kept.lock().unwrap();
                if log.len() >= 200 {
                    log.drain(..100);
                }
                log.push(line);
            }
        });
        Ok(Self {
            child,
            mcp: mcp.expect("announced"),
            control: control.unwrap_or_default(),
            log,
            dir,
            database_url: options.database_url.clone(),
        })
    }

    /// Resident memory in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub(super) fn rss_kib(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().ok_or_else(|| anyhow!("leasegate exited"))?;
        rss_kib(pid)
    }

    pub(super) fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after 30 s.
    pub(super) async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// `VmRSS` of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_vm_rss(&status).ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// The `VmRSS:  1234 kB` line of a `/proc/<pid>/status` text, in KiB.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}
