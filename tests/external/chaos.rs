//! The chaos soak in reduced form, twice. First, 500 intents over two
//! `leasegate serve` processes, tool servers of all four capabilities with
//! fault injection (crash and hang after the effect, transient errors, slow
//! answers), proxies SIGKILLed and SIGSTOPped, database backends
//! terminated, on `DATABASE_URL`'s server (a database of its own, created
//! and dropped through the maintenance database). Then the database's
//! faults — backends terminated and a PostgreSQL crash-restart, on a
//! private cluster — and outages of an HTTP tool server, where every call a
//! tool answered must end with that answer. The harness is the example's own (`bench/chaos/harness.rs`).

#[path = "../../bench/chaos/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Duration;

/// `DATABASE_URL` with its database replaced by `postgres`, or the local default.
pub(crate) fn admin_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) => {
            let (base, query) = match url.split_once('?') {
                Some((base, query)) => (base.to_owned(), format!("?{query}")),
                None => (url.clone(), String::new()),
            };
            let server = match base.rfind('/') {
                Some(slash) if slash > base.find("//").map_or(0, |at| at + 1) => &base[..slash],
                _ => base.as_str(),
            };
            format!("{server}/postgres{query}")
        }
        Err(_) => "postgres://postgres@127.0.0.1:5432/postgres".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_500_intents_under_faults_keeps_every_invariant() {
    let _exclusive = crate::common::exclusive().await;
    let mut settings = harness::Settings::new(
        PathBuf::from(env!("CARGO_BIN_EXE_leasegate")),
        PathBuf::from(env!("CARGO_BIN_EXE_leasegate-example-tools")),
    );
    settings.intents = 500;
    settings.proxies = 2;
    settings.agents = 8;
    settings.seed = 11;
    settings.fault_interval = Duration::from_millis(1200);
    settings.settle = Duration::from_secs(45);
    settings.admin_url = admin_url();
    let outcome = tokio::time::timeout(Duration::from_secs(240), harness::run(settings))
        .await
        .expect("the soak finishes within 4 minutes")
        .unwrap_or_else(|error| {
            panic!("the soak could not run (is PostgreSQL up at DATABASE_URL?): {error:#}")
        });
    println!("{}", outcome.report);
    assert!(
        outcome.violations.is_empty(),
        "invariant violations:\n{}",
        outcome.report
    );
    assert_eq!(outcome.intents, 500);
    // The faults did happen.
    assert!(
        outcome.faults.proxy_kills + outcome.faults.proxy_stops > 0,
        "no proxy fault was injected: {:?}",
        outcome.faults
    );
}

/// The commands that crash-restart a private cluster (`pg_ctl -m
/// immediate restart`, as `postgres` when the suite runs as root).
fn crash_restart(cluster: &leasegate::embedded::Cluster) -> Vec<String> {
    let pg_ctl = leasegate::embedded::find_binaries()
        .expect("the cluster started, so its binaries exist")
        .dir
        .join("pg_ctl");
    let mut command = Vec::new();
    if crate::postgres_binaries::running_as_root() {
        command.extend(["runuser", "-u", "postgres", "--"].map(str::to_owned));
    }
    command.push(pg_ctl.display().to_string());
    for arg in [
        "-D".to_owned(),
        cluster.data().display().to_string(),
        "-l".to_owned(),
        cluster.log().display().to_string(),
        "-m".to_owned(),
        "immediate".to_owned(),
        "-w".to_owned(),
        "-t".to_owned(),
        "60".to_owned(),
        "restart".to_owned(),
    ] {
        command.push(arg);
    }
    command
}

/// The database and one Streamable HTTP tool server fail, nothing else:
/// every backend of the ledger terminated every ~0.4 s and PostgreSQL
/// crash-restarted once, mid-burst, on a private cluster (the shared server
/// is left alone); the payments tool, one HTTP server all proxies share,
/// stopped (connections refused) for 1–3 s at three points. The stdio tools
/// never fail and the proxies are never killed, so every call that reached
/// one was answered to leasegate, and each such operation must end with
/// that answer — a `none` tool's too, which no reconciler query could have
/// settled — with no operator; the payments calls the outages cut converge
/// by same-key retries; a refused call is never sent twice; and every
/// proxy's health says the payments server is up at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_call_converges_through_database_faults_and_http_outages() {
    let _exclusive = crate::common::exclusive().await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    // Short: the server's socket lives in it.
    let dir = std::env::temp_dir().join(format!("lg-chaos-{}", &tag[..8]));
    let cluster = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || leasegate::embedded::Cluster::start(&dir))
            .await
            .expect("the start task")
            .unwrap_or_else(|error| panic!("a private PostgreSQL cluster: {error}"))
    };
    let mut settings = harness::Settings::new(
        PathBuf::from(env!("CARGO_BIN_EXE_leasegate")),
        PathBuf::from(env!("CARGO_BIN_EXE_leasegate-example-tools")),
    );
    settings.intents = 200;
    settings.proxies = 2;
    settings.agents = 16;
    settings.seed = 23;
    settings.tool_transient = 0.0;
    settings.tool_crash = 0.0;
    settings.tool_hang = 0.0;
    settings.tool_slow = 0.0;
    settings.proxy_faults = false;
    settings.http_outages = true;
    settings.fault_interval = Duration::from_millis(400);
    settings.pg_restart = Some(crash_restart(&cluster));
    settings.pg_restart_after = Duration::from_secs(3);
    settings.answers_settle = true;
    settings.settle = Duration::from_secs(60);
    settings.admin_url = cluster.url("postgres");
    let outcome = tokio::time::timeout(Duration::from_secs(240), harness::run(settings)).await;
    let log = cluster.log();
    let stopped = tokio::task::spawn_blocking(move || cluster.stop()).await;
    let outcome = outcome
        .expect("the soak finishes within 4 minutes")
        .unwrap_or_else(|error| {
            crate::postgres_binaries::print_log_tail("private PostgreSQL", &log);
            panic!("the soak could not run: {error:#}")
        });
    println!("{}", outcome.report);
    let _ = stopped;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        outcome.violations.is_empty(),
        "invariant violations:\n{}",
        outcome.report
    );
    assert_eq!(outcome.intents, 200);
    // The faults did happen.
    assert_eq!(outcome.faults.pg_restarts, 1, "{:?}", outcome.faults);
    assert!(
        outcome.faults.http_outages > 0,
        "the HTTP tool server was never stopped: {:?}",
        outcome.faults
    );
    assert!(
        outcome.faults.backends_terminated > 0,
        "no backend was terminated: {:?}",
        outcome.faults
    );
}
