//! The chaos soak in reduced form: 500 intents over two
//! `leasegate serve` processes, tool servers of all four capabilities with
//! fault injection (crash and hang after the effect, transient errors, slow
//! answers), proxies SIGKILLed and SIGSTOPped, database backends
//! terminated; no PostgreSQL restart. The harness is the example's own
//! (`bench/chaos/harness.rs`); it creates and drops its own database
//! through the maintenance database of `DATABASE_URL`'s server.

#[path = "../../bench/chaos/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Duration;

/// `DATABASE_URL` with its database replaced by `postgres`, or the local default.
fn admin_url() -> String {
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
