//! The embedded default: `leasegate serve` with no
//! database configured and nothing answering at the default URL starts a
//! private PostgreSQL cluster in its state directory (socket only), migrates
//! it, serves, stops it on SIGTERM, reuses its data at the next start, finds
//! and reuses a server a killed leasegate left running, and refuses with
//! exit 10 when there are no PostgreSQL binaries. A default where something
//! answers is used as before; `leasegate stdio` does the same as `serve`
//! (stdout stays MCP only); a second process on the same directory shares
//! the server and only its starter stops it.
//!
//! The binary runs as a process with `DATABASE_URL` and
//! `LEASEGATE_DATABASE_URL` removed, a config without `database_url`, and
//! the default pointed at a closed port (`LEASEGATE_DEFAULT_DATABASE_URL`:
//! this machine's PostgreSQL answers at the real default). Every wait has a
//! deadline; a guard stops the cluster (`pg_ctl stop -m immediate`) even
//! when the test panics.

use crate::common;
use crate::postgres_binaries;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http;
use common::proxy::{LEASEGATE, Scenario};
use tokio::io::AsyncBufReadExt;

/// Starting includes initdb on a loaded machine.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(180);
pub(crate) const STOP_DEADLINE: Duration = Duration::from_secs(90);

/// The newest PostgreSQL's binaries (only the guard uses them; leasegate
/// finds its own).
fn pg_bin() -> PathBuf {
    postgres_binaries::newest_with(
        "pg_ctl",
        "the embedded tests need PostgreSQL under /usr/lib/postgresql, or PG_BIN",
    )
}

/// Stops the private cluster in `dir` (immediate) if it still runs, even on
/// panic; printing the server log's tail when panicking.
pub(crate) struct ClusterGuard {
    pub(crate) dir: PathBuf,
}

impl ClusterGuard {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The postmaster's pid, from `postmaster.pid`.
    pub(crate) fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if self.data().join("postmaster.pid").exists() {
            let pg_ctl = pg_bin().join("pg_ctl");
            let _ = postgres_binaries::as_postgres(&pg_ctl, postgres_binaries::running_as_root())
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "-t", "30", "stop"])
                .output();
        }
        if std::thread::panicking() {
            postgres_binaries::print_log_tail(
                "private PostgreSQL log",
                &self.dir.join("postgres.log"),
            );
        }
    }
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    state != Some("Z")
}

/// Processes whose command line names `needle` or whose parent is `parent`.
fn processes_of(needle: &str, parent: Option<i32>) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !alive(pid) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
            .unwrap_or_default();
        let ppid = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        if cmdline.contains(needle) || (parent.is_some() && ppid == parent) {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

/// A leasegate process with its stderr collected line by line.
pub(crate) struct Leasegate {
    pub(crate) child: tokio::process::Child,
    pub(crate) lines: Arc<Mutex<Vec<String>>>,
}

/// A URL on 127.0.0.1 where nothing listens.
pub(crate) fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("postgres://postgres@127.0.0.1:{port}/leasegate")
}

/// `leasegate serve` with no database configured: neither URL variable,
/// the default at `default_url`, the state directory `state`; `env` last.
fn serve(config: &Path, default_url: &str, state: &Path, env: &[(&str, &str)]) -> Leasegate {
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env_remove("LEASEGATE_PG_BIN_DIRS")
        .env("LEASEGATE_DEFAULT_DATABASE_URL", default_url)
        .env("LEASEGATE_STATE_DIR", state)
        .env("RUST_LOG", "info,rmcp=warn")
        .current_dir(config.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    Leasegate::spawn(command)
}

impl Leasegate {
    /// Spawns `command` (stderr piped) and collects its stderr lines.
    pub(crate) fn spawn(mut command: tokio::process::Command) -> Leasegate {
        let mut child = command.spawn().expect("spawn leasegate");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut reader = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Leasegate { child, lines }
    }

    pub(crate) fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The first stderr line containing `needle`, within `deadline`.
    pub(crate) async fn line(&mut self, needle: &str, deadline: Duration) -> String {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader drain what is left.
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "leasegate exited ({status}) before printing {needle:?}:\n{}",
                    self.stderr()
                );
            }
            if tokio::time::Instant::now() >= until {
                panic!(
                    "no {needle:?} within {deadline:?}; stderr so far:\n{}",
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The control API's base URL (`http://…/v1`), once it serves.
    async fn control(&mut self) -> String {
        let line = self.line("control API at ", START_DEADLINE).await;
        line.split("control API at ")
            .nth(1)
            .unwrap()
            .trim()
            .to_owned()
    }

    pub(crate) fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id().expect("still running") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
    }

    pub(crate) async fn exit(&mut self, deadline: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!(
                "leasegate did not exit within {deadline:?}:\n{}",
                self.stderr()
            ),
        }
    }
}

/// Waits until the cluster's postmaster (`pid`) and its children are gone
/// and `postmaster.pid` is removed.
pub(crate) async fn assert_stopped(guard: &ClusterGuard, pid: i32) {
    let data = guard.data();
    let needle = data.to_string_lossy().into_owned();
    let until = tokio::time::Instant::now() + STOP_DEADLINE;
    loop {
        let left = processes_of(&needle, Some(pid));
        let pid_file = data.join("postmaster.pid").exists();
        if left.is_empty() && !alive(pid) && !pid_file {
            return;
        }
        if tokio::time::Instant::now() >= until {
            panic!(
                "the private PostgreSQL still runs after {STOP_DEADLINE:?} (postmaster {pid} \
                 alive: {}, postmaster.pid: {pid_file}): {left:?}",
                alive(pid)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `leasegate runs show RUN --database-url URL --json` (the operator CLI,
/// over the cluster's socket).
fn show_run_over_socket(url: &str, run_id: &str) -> String {
    let out = std::process::Command::new(LEASEGATE)
        .args(["runs", "show", run_id, "--json", "--database-url", url])
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "runs show over the socket: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The scenario's config without `database_url`.
fn scenario_without_database() -> Scenario {
    let scenario = Scenario::new("postgres://unused", "");
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    let config = common::replace_exactly(&config, "database_url = \"postgres://unused\"\n", "");
    assert!(!config.contains("database_url"));
    std::fs::write(scenario.config_path(), config).unwrap();
    scenario
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_database_configured_starts_a_private_cluster_and_stops_it() {
    let _exclusive = common::exclusive().await;
    let scenario = scenario_without_database();
    let state = scenario.dir.join("lg-state");
    let pg_dir = state.join("pg");
    // Declared after the scenario: dropped first, before its directory goes.
    let guard = ClusterGuard {
        dir: pg_dir.clone(),
    };
    let default_url = closed_port_url();
    let config = scenario.config_path();

    // First life: initdb, start, migrate, serve.
    let mut first = serve(&config, &default_url, &state, &[]);
    let line = first.line("private PostgreSQL at", START_DEADLINE).await;
    assert_eq!(
        line,
        format!(
            "leasegate: private PostgreSQL at {} (socket), stopped on exit",
            pg_dir.display()
        )
    );
    let url_line = first.line("ledger URL ", START_DEADLINE).await;
    let socket_url = url_line
        .split("ledger URL ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert!(
        socket_url.contains(&format!("host={}", pg_dir.display())),
        "{socket_url}"
    );
    let control = first.control().await;
    let upstreams = http::get(&format!("{control}/upstreams")).await;
    assert_eq!(upstreams.status, 200, "{}", upstreams.body);
    assert!(upstreams.body.contains("payments"), "{}", upstreams.body);
    let created = http::post(
        &format!("{control}/runs"),
        &[("content-type", "application/json")],
        r#"{"tenant_id":"tenant-a","task_id":"embedded-1"}"#,
    )
    .await;
    assert!(
        created.status == 200 || created.status == 201,
        "{}",
        created.body
    );
    let created: serde_json::Value = serde_json::from_str(&created.body).unwrap();
    let run_id = created["run_id"].as_str().unwrap().to_owned();
    // The operator CLI reaches the same ledger over the socket.
    assert!(show_run_over_socket(&socket_url, &run_id).contains(&run_id));
    // Socket only: no TCP listener configured.
    let settings = std::fs::read_to_string(guard.data().join("leasegate.conf")).unwrap();
    assert!(settings.contains("listen_addresses = ''"), "{settings}");
    let postmaster = guard
        .postmaster_pid()
        .expect("postmaster.pid while serving");
    assert!(alive(postmaster));
    assert!(
        first
            .stderr()
            .contains("created the private PostgreSQL cluster"),
        "{}",
        first.stderr()
    );

    // SIGTERM: leasegate stops, and stops the cluster.
    first.signal(nix::sys::signal::Signal::SIGTERM);
    let status = first.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}:\n{}", first.stderr());
    assert_stopped(&guard, postmaster).await;

    // Second life: the same cluster, its data kept.
    let mut second = serve(&config, &default_url, &state, &[]);
    second.line("private PostgreSQL at", START_DEADLINE).await;
    let control = second.control().await;
    let shown = http::get(&format!("{control}/runs/{run_id}")).await;
    assert_eq!(shown.status, 200, "the first life's run: {}", shown.body);
    assert!(
        !second
            .stderr()
            .contains("created the private PostgreSQL cluster")
            && !second
                .stderr()
                .contains("reusing the private PostgreSQL server"),
        "{}",
        second.stderr()
    );
    let postmaster = guard
        .postmaster_pid()
        .expect("postmaster.pid while serving");
    // leasegate dies without stopping anything: the server stays up.
    second.signal(nix::sys::signal::Signal::SIGKILL);
    second.exit(STOP_DEADLINE).await;
    assert!(
        alive(postmaster),
        "the postmaster survives a killed leasegate"
    );

    // Third life: finds the running server (postmaster.pid) and reuses it.
    let mut third = serve(&config, &default_url, &state, &[]);
    third.line("private PostgreSQL at", START_DEADLINE).await;
    let control = third.control().await;
    assert_eq!(guard.postmaster_pid(), Some(postmaster), "the same server");
    assert!(
        third
            .stderr()
            .contains("reusing the private PostgreSQL server already running"),
        "{}",
        third.stderr()
    );
    let shown = http::get(&format!("{control}/runs/{run_id}")).await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    third.signal(nix::sys::signal::Signal::SIGTERM);
    let status = third.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}:\n{}", third.stderr());
    assert_stopped(&guard, postmaster).await;
    drop(guard);
}

#[tokio::test]
async fn no_postgresql_binaries_is_refused_with_exit_10() {
    let _exclusive = common::exclusive().await;
    let scenario = scenario_without_database();
    let state = scenario.dir.join("lg-state");
    let nowhere = scenario.dir.join("no-postgres-here");
    let mut leasegate = serve(
        &scenario.config_path(),
        &closed_port_url(),
        &state,
        &[
            ("PATH", ""),
            ("LEASEGATE_PG_BIN_DIRS", nowhere.to_str().unwrap()),
        ],
    );
    let status = leasegate.exit(START_DEADLINE).await;
    // Let the reader drain the last lines.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = leasegate.stderr();
    assert_eq!(status.code(), Some(10), "{text}");
    for needle in [
        "no database is configured and nothing answers at the default (postgres://postgres@127.0.0.1:",
        "no PostgreSQL server binaries (initdb, pg_ctl)",
        &format!("LEASEGATE_PG_BIN_DIRS ({})", nowhere.display()),
        "Install PostgreSQL (e.g. `apt-get install postgresql`",
        "point --database-url",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert!(!state.join("pg").exists(), "nothing created: {text}");
}

#[tokio::test]
async fn a_default_where_something_answers_is_used_as_before() {
    let _exclusive = common::exclusive().await;
    // Something accepts connections at the default (and hangs up): no
    // private cluster, the normal connect failure instead.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let scenario = scenario_without_database();
    let state = scenario.dir.join("lg-state");
    let mut leasegate = serve(
        &scenario.config_path(),
        &format!("postgres://postgres@127.0.0.1:{port}/leasegate"),
        &state,
        &[],
    );
    let status = leasegate.exit(START_DEADLINE).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = leasegate.stderr();
    assert!(!status.success(), "{text}");
    assert!(
        status.code() != Some(10) && status.code() != Some(11),
        "{status}: {text}"
    );
    assert!(!text.contains("private PostgreSQL"), "{text}");
    assert!(!state.join("pg").exists(), "no cluster created: {text}");
}

#[tokio::test]
async fn stdio_starts_the_private_cluster_and_stops_it_at_eof() {
    let _exclusive = common::exclusive().await;
    let scenario = scenario_without_database();
    let state = scenario.dir.join("lg-state");
    let guard = ClusterGuard {
        dir: state.join("pg"),
    };
    let mut child = tokio::process::Command::new(LEASEGATE)
        .args(["stdio", "--config"])
        .arg(scenario.config_path())
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env_remove("LEASEGATE_PG_BIN_DIRS")
        .env("LEASEGATE_DEFAULT_DATABASE_URL", closed_port_url())
        .env("LEASEGATE_STATE_DIR", &state)
        .env("RUST_LOG", "info,rmcp=warn")
        .current_dir(&scenario.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + START_DEADLINE;
    // Serving: the upstreams are connected after the ledger.
    loop {
        let line = tokio::time::timeout_at(until, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("stdio did not start: {seen:#?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("stderr ended: {seen:#?}"));
        let done = line.contains("upstreams connected");
        seen.push(line);
        if done {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l
            == &format!(
                "leasegate: private PostgreSQL at {} (socket), stopped on exit",
                guard.dir.display()
            )),
        "{seen:#?}"
    );
    let postmaster = guard
        .postmaster_pid()
        .expect("postmaster.pid while serving");
    // An MCP handshake over stdio, then EOF: leasegate stdio ends, and
    // stops the cluster.
    let mut stdin = stdin;
    {
        use tokio::io::AsyncWriteExt;
        let handshake = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"embedded-test","version":"0"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n"
        );
        stdin.write_all(handshake.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }
    let stdout = child.stdout.take().unwrap();
    let mut answers = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(STOP_DEADLINE, answers.next_line())
        .await
        .expect("an answer to initialize")
        .unwrap()
        .expect("stdout open");
    let answer: serde_json::Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("not JSON ({e}): {first}"));
    assert_eq!(answer["id"], 1, "{first}");
    assert!(answer.get("result").is_some(), "{first}");
    drop(stdin);
    let status = tokio::time::timeout(STOP_DEADLINE, child.wait())
        .await
        .expect("stdio exits at EOF")
        .unwrap();
    let mut rest = Vec::new();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(2), lines.next_line()).await
    {
        rest.push(line);
    }
    assert!(status.success(), "{status}: {seen:#?}\n{rest:#?}");
    // Nothing but MCP may reach stdout: pg_ctl's output is captured.
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(2), answers.next_line()).await
    {
        assert!(
            serde_json::from_str::<serde_json::Value>(&line).is_ok(),
            "not MCP on stdout: {line}"
        );
    }
    assert_stopped(&guard, postmaster).await;
}

#[tokio::test]
async fn a_second_leasegate_shares_the_server_and_the_first_one_stops_it() {
    let _exclusive = common::exclusive().await;
    let scenario = scenario_without_database();
    let state = scenario.dir.join("lg-state");
    let guard = ClusterGuard {
        dir: state.join("pg"),
    };
    let default_url = closed_port_url();
    let config = scenario.config_path();
    let mut owner = serve(&config, &default_url, &state, &[]);
    owner.control().await;
    let postmaster = guard
        .postmaster_pid()
        .expect("postmaster.pid while serving");
    let mut sharer = serve(&config, &default_url, &state, &[]);
    let line = sharer.line("private PostgreSQL at", START_DEADLINE).await;
    assert!(
        line.ends_with("(socket), shared with the leasegate process that started it"),
        "{line}"
    );
    let control = sharer.control().await;
    assert_eq!(http::get(&format!("{control}/upstreams")).await.status, 200);
    // The sharer leaves the server running.
    sharer.signal(nix::sys::signal::Signal::SIGTERM);
    let status = sharer.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}:\n{}", sharer.stderr());
    assert!(alive(postmaster), "the owner's server survives the sharer");
    assert_eq!(guard.postmaster_pid(), Some(postmaster));
    // The owner stops it.
    owner.signal(nix::sys::signal::Signal::SIGTERM);
    let status = owner.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}:\n{}", owner.stderr());
    assert_stopped(&guard, postmaster).await;
}

/// `database_url = "embedded"` asks for the private cluster even where a
/// server answers at the default (the machine's PostgreSQL here): `serve`
/// starts it, and an operator command given the same config reaches the
/// ledger in it over its socket while `serve` runs; SIGTERM stops both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_url_embedded_starts_the_private_cluster_where_a_server_answers() {
    let _exclusive = common::exclusive().await;
    let scenario = scenario_without_database();
    scenario.prepend_config("database_url = \"embedded\"");
    let state = scenario.dir.join("lg-state");
    let guard = ClusterGuard {
        dir: state.join("pg"),
    };
    // The machine's PostgreSQL answers at this default.
    let answering = "postgres://postgres@127.0.0.1:5432/leasegate_not_used";
    let mut leasegate = serve(&scenario.config_path(), answering, &state, &[]);
    leasegate
        .line("private PostgreSQL at", START_DEADLINE)
        .await;
    let control = leasegate.control().await;
    let postmaster = guard.postmaster_pid().expect("the private cluster runs");
    let created = http::post(
        &format!("{control}/runs"),
        &[("content-type", "application/json")],
        r#"{"tenant_id":"tenant-a","task_id":"embedded-task"}"#,
    )
    .await;
    assert!(
        created.status == 200 || created.status == 201,
        "{}",
        created.body
    );
    let run_id = serde_json::from_str::<serde_json::Value>(&created.body).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let shown = std::process::Command::new(LEASEGATE)
        .args(["runs", "show", &run_id, "--json", "--config"])
        .arg(scenario.config_path())
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env("LEASEGATE_DEFAULT_DATABASE_URL", answering)
        .env("LEASEGATE_STATE_DIR", &state)
        .output()
        .unwrap();
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("embedded-task"),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );
    leasegate.signal(nix::sys::signal::Signal::SIGTERM);
    let status = leasegate.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}: {}", leasegate.stderr());
    assert_stopped(&guard, postmaster).await;
}
