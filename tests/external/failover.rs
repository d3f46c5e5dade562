//! Experiment H (seed section 11): failover under the two durability
//! contracts, on a real primary and streaming standby built on loopback
//! with the PostgreSQL binaries (initdb, pg_basebackup, pg_ctl; separate
//! ports and data directories). leasegate runs in-process against the
//! primary's address; the failover restarts the promoted standby at that
//! address, so the same leasegate process reconnects and must notice.
//!
//! * `sync_replica`: no acknowledged settle is lost, the failover is
//!   recorded clean, and the contract is refused or held whenever the server
//!   does not provide it.
//! * `local` with an asynchronous standby: the acknowledged writes made
//!   after the standby stopped are lost; leasegate records the lossy window,
//!   holds dispatch until an operator resolves it, and the test prints the
//!   epoch, ledger and remote high-water marks.
//!
//! The PostgreSQL binaries are required: a machine without them fails these
//! tests loudly. As root (CI), every PostgreSQL command runs as the
//! `postgres` user through `runuser` (initdb refuses root).

use crate::common;
use crate::postgres_binaries;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use common::proxy::{RunningProxy, Scenario, call, connect_http, lease_meta, operation_note};
use common::{TestDb, http, wait_until};
use leasegate::app::Proxy;
use leasegate::config::Config;
use leasegate::ledger::{AcquireOutcome, Fenced, LeaseClaim, Ledger};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The two tests run one after the other: the durability metrics are
/// process-wide gauges (both in-process proxies would write them), and two
/// clusters at once would only crowd a small machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The newest PostgreSQL's server binaries.
fn pg_bin() -> PathBuf {
    postgres_binaries::newest_with(
        "initdb",
        "the failover tests need the PostgreSQL server binaries under /usr/lib/postgresql \
         (apt-get install postgresql), or PG_BIN",
    )
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One PostgreSQL instance of the test cluster.
#[derive(Debug, Clone)]
struct Node {
    name: &'static str,
    data: PathBuf,
    log: PathBuf,
}

/// A scratch directory with the nodes; stops every node (immediate) when
/// dropped, even on panic, then removes the directory.
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    root: bool,
    nodes: std::sync::Mutex<Vec<Node>>,
    /// The socket directory every node uses (not /var/run/postgresql).
    sockets: PathBuf,
}

impl Cluster {
    fn new() -> Cluster {
        let bin = pg_bin();
        let root = postgres_binaries::running_as_root();
        let dir =
            std::env::temp_dir().join(format!("leasegate-fo-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("sockets")).unwrap();
        if root {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("chown the scratch directory");
            assert!(status.success(), "chown -R postgres {}", dir.display());
        }
        Cluster {
            sockets: dir.join("sockets"),
            dir,
            bin,
            root,
            nodes: Default::default(),
        }
    }

    /// Runs a PostgreSQL binary (as `postgres` when root); panics with its
    /// output when it fails.
    async fn pg(&self, program: &str, args: &[&str]) -> String {
        let binary = self.bin.join(program);
        let mut command =
            tokio::process::Command::from(postgres_binaries::as_postgres(&binary, self.root));
        command.args(args).current_dir(&self.dir).kill_on_drop(true);
        let out = common::within(&format!("{program} {args:?}"), command.output())
            .await
            .unwrap_or_else(|e| panic!("run {} (runuser missing?): {e}", binary.display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{program} {args:?} failed:\n{text}");
        text
    }

    fn node(&self, name: &'static str) -> Node {
        let node = Node {
            name,
            data: self.dir.join(name),
            log: self.dir.join(format!("{name}.log")),
        };
        self.nodes.lock().unwrap().push(node.clone());
        node
    }

    /// initdb + the settings a primary with standbys needs.
    async fn init_primary(&self, name: &'static str, extra: &str) -> Node {
        let node = self.node(name);
        self.pg(
            "initdb",
            &[
                "-D",
                path(&node.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )
        .await;
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             wal_level = replica\nmax_wal_senders = 10\nhot_standby = on\nfsync = off\n\
             wal_sender_timeout = '5s'\nwal_receiver_status_interval = '1s'\n{extra}\n",
            self.sockets.display()
        );
        append(&node.data.join("postgresql.conf"), &conf);
        node
    }

    /// pg_basebackup of `from` (at `port`) into a new standby (`-R`:
    /// standby.signal and primary_conninfo).
    async fn base_backup(&self, name: &'static str, port: u16) -> Node {
        let node = self.node(name);
        self.pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-D",
                path(&node.data),
                "-X",
                "stream",
                "-R",
                "--checkpoint=fast",
                "--no-sync",
            ],
        )
        .await;
        node
    }

    async fn start(&self, node: &Node, port: u16) {
        self.pg(
            "pg_ctl",
            &[
                "-D",
                path(&node.data),
                "-l",
                path(&node.log),
                "-o",
                &format!("-p {port}"),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .await;
    }

    async fn stop(&self, node: &Node, mode: &str) {
        self.pg(
            "pg_ctl",
            &["-D", path(&node.data), "-m", mode, "-w", "-t", "60", "stop"],
        )
        .await;
    }

    async fn promote(&self, node: &Node) {
        self.pg(
            "pg_ctl",
            &["-D", path(&node.data), "-w", "-t", "60", "promote"],
        )
        .await;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let nodes = std::mem::take(&mut *self.nodes.lock().unwrap_or_else(|e| e.into_inner()));
        for node in &nodes {
            if !node.data.join("postmaster.pid").exists() {
                continue;
            }
            let binary = self.bin.join("pg_ctl");
            let _ = postgres_binaries::as_postgres(&binary, self.root)
                .args(["-D", path(&node.data), "-m", "immediate", "-w", "stop"])
                .output();
        }
        if std::thread::panicking() {
            for node in &nodes {
                postgres_binaries::print_log_tail(&format!("{} log", node.name), &node.log);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
    f.write_all(text.as_bytes()).unwrap();
}

fn url(port: u16, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{database}")
}

/// A superuser pool on one node's `postgres` database.
async fn superuser(port: u16) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&url(port, "postgres"))
        .await
        .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
}

/// The ledger database on the primary at `port`: created and migrated.
async fn ledger_db(port: u16) -> TestDb {
    let url = url(port, "leasegate");
    Ledger::create_database_if_missing(&url).await.unwrap();
    Ledger::migrate(&url).await.expect("migrate the ledger");
    connect_db(port).await
}

async fn connect_db(port: u16) -> TestDb {
    TestDb::new(
        PgPoolOptions::new(),
        PgConnectOptions::from_str(&url(port, "leasegate")).unwrap(),
    )
    .await
}

/// `synchronous_standby_names` = `'*'` (any standby is synchronous) or `''`.
async fn set_sync_names(pool: &sqlx::PgPool, any: bool) {
    let statement = if any {
        "ALTER SYSTEM SET synchronous_standby_names = '*'"
    } else {
        "ALTER SYSTEM SET synchronous_standby_names = ''"
    };
    sqlx::query(statement).execute(pool).await.unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(pool)
        .await
        .unwrap();
}

/// Waits until the primary has `count` standbys streaming as `sync`.
async fn wait_sync_standbys(pool: &sqlx::PgPool, count: i64) {
    wait_until(&format!("{count} synchronous standby(s) streaming"), || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'",
        )
        .fetch_one(pool)
        .await
        .ok()?;
        (n == count).then_some(())
    })
    .await
}

async fn durability(proxy: &RunningProxy) -> Value {
    let answer = http::get(&format!("{}/v1/durability", proxy.control_url)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

async fn wait_durability(proxy: &RunningProxy, what: &str, ok: bool, reason: &str) -> Value {
    wait_until(what, || async {
        let report = durability(proxy).await;
        let reasons = report["reasons"].to_string();
        (report["ok"] == json!(ok) && reasons.contains(reason)).then_some(report)
    })
    .await
}

/// The recorded failovers, newest first; `None` while the ledger does not
/// answer (503 during the failover).
async fn failovers(proxy: &RunningProxy) -> Option<Vec<Value>> {
    let answer = http::get(&format!("{}/v1/failovers", proxy.control_url)).await;
    if answer.status == 503 {
        return None;
    }
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str::<Value>(&answer.body).unwrap()["failovers"]
        .as_array()
        .cloned()
}

/// One charge through leasegate: (operation id, charge id).
async fn charge(
    agent: &common::proxy::AgentClient,
    lease: &LeaseClaim,
    amount: u32,
) -> Result<(String, String, Value), (i32, String)> {
    let result = call(
        agent,
        "payments__charge",
        json!({"amount": amount, "currency": "eur"}),
        Some(lease_meta(lease)),
    )
    .await?;
    assert_ne!(result.is_error, Some(true), "charge {amount}: {result:?}");
    let note = operation_note(&result);
    let charge_id = result.structured_content.as_ref().unwrap()["charge_id"]
        .as_str()
        .unwrap()
        .to_owned();
    Ok((
        note["operation_id"].as_str().unwrap().to_owned(),
        charge_id,
        note,
    ))
}

/// (status) of each operation id on the ledger, `None` when absent.
async fn statuses(db: &TestDb, ids: &[String]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for id in ids {
        out.push(
            sqlx::query_scalar("SELECT status FROM tool_operations WHERE operation_id = $1")
                .bind(id)
                .fetch_optional(&db.admin)
                .await
                .unwrap(),
        );
    }
    out
}

/// Restarts a stopped standby alone (no upstream) at `port`, promotes it.
async fn promote_at(cluster: &Cluster, standby: &Node, port: u16) {
    append(
        &standby.data.join("postgresql.auto.conf"),
        "\nprimary_conninfo = ''\n",
    );
    cluster.start(standby, port).await;
    cluster.promote(standby).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replica_failover_loses_no_acknowledged_settle_and_never_degrades() {
    let _exclusive = common::exclusive().await;
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::new();
    let (primary_port, standby_port) = (free_port(), free_port());
    let primary = cluster
        .init_primary(
            "primary",
            "synchronous_standby_names = ''\nsynchronous_commit = on",
        )
        .await;
    cluster.start(&primary, primary_port).await;
    let db = ledger_db(primary_port).await;
    let standby = cluster.base_backup("standby", primary_port).await;
    cluster.start(&standby, standby_port).await;
    let admin = superuser(primary_port).await;

    // Without a synchronous standby named, sync_replica refuses to start.
    let scenario = Scenario::new(
        &url(primary_port, "leasegate"),
        "durability = \"sync_replica\"\nclaim_ttl = \"60s\"\n",
    );
    let config = Config::load(&scenario.config_path()).unwrap();
    let refused = Proxy::start(config)
        .await
        .err()
        .expect("sync_replica refuses a server without synchronous replication")
        .to_string();
    println!("refused to start: {refused}");
    assert!(refused.contains("sync_replica"), "{refused}");
    assert!(
        refused.contains("synchronous_standby_names is empty"),
        "{refused}"
    );

    set_sync_names(&admin, true).await;
    wait_sync_standbys(&admin, 1).await;
    // A database default that would weaken commits: every leasegate session
    // overrides it.
    sqlx::query("ALTER DATABASE leasegate SET synchronous_commit = 'local'")
        .execute(&admin)
        .await
        .unwrap();
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let report = durability(&proxy).await;
    assert_eq!(report["ok"], json!(true), "{report}");
    assert_eq!(report["durability"], "sync_replica");
    assert_eq!(
        report["facts"]["synchronous_commit"], "on",
        "the database default 'local' is overridden: {report}"
    );
    let (lease, _) = db.running_run("worker-a", 600_000).await;
    let (agent, _) = connect_http(&proxy.url, None).await;

    let mut acknowledged = Vec::new();
    for amount in 101..=105 {
        let (operation_id, charge_id, note) = charge(&agent, &lease, amount).await.unwrap();
        assert_eq!(note["status"], "succeeded");
        acknowledged.push((amount, operation_id, charge_id));
    }
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 5);

    // Synchronous replication switched off under a running process: calls
    // are refused before anything is recorded, and the API says why.
    set_sync_names(&admin, false).await;
    let report = wait_durability(
        &proxy,
        "the durability report to name the empty synchronous_standby_names",
        false,
        "synchronous_standby_names is empty",
    )
    .await;
    println!("held: {}", report["reasons"]);
    let operations_before = db.row_count("tool_operations").await;
    let (code, message) = charge(&agent, &lease, 999).await.unwrap_err();
    assert_eq!(code, -31010, "{message}");
    assert!(message.contains("durability hold"), "{message}");
    let operations_after = db.row_count("tool_operations").await;
    assert_eq!(operations_after, operations_before, "nothing registered");
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        5,
        "nothing sent"
    );
    let metrics = http::get(&format!("{}/metrics", proxy.control_url)).await;
    assert!(
        metrics.body.contains("leasegate_durability_ok 0"),
        "{}",
        metrics.body
    );
    set_sync_names(&admin, true).await;
    wait_durability(&proxy, "durability met again", true, "").await;

    // Failover: the primary dies, the synchronous standby is promoted at the
    // primary's address; the same leasegate process reconnects.
    admin.close().await;
    drop(db);
    cluster.stop(&primary, "immediate").await;
    cluster.stop(&standby, "fast").await;
    promote_at(&cluster, &standby, primary_port).await;
    let db = connect_db(primary_port).await;

    // Recorded as a clean failover; the new primary has no synchronous
    // standby yet, so sync_replica holds instead of degrading.
    let failover = wait_until("the failover to be recorded", || async {
        failovers(&proxy).await?.into_iter().next()
    })
    .await;
    println!("failover: {failover}");
    assert_eq!(failover["lossy"], json!(false), "{failover}");
    assert_eq!(
        (
            failover["old_timeline"].clone(),
            failover["new_timeline"].clone()
        ),
        (json!(1), json!(2))
    );
    assert!(failover["resolved_at"].is_string(), "{failover}");
    wait_durability(
        &proxy,
        "sync_replica held on the new primary without a standby",
        false,
        "synchronous_standby_names is empty",
    )
    .await;
    let (code, _) = charge(&agent, &lease, 101).await.unwrap_err();
    assert_eq!(code, -31010);

    // Every acknowledged settle survived.
    let ids: Vec<String> = acknowledged.iter().map(|(_, id, _)| id.clone()).collect();
    assert_eq!(
        statuses(&db, &ids).await,
        vec![Some("succeeded".to_owned()); 5],
        "every acknowledged settle is on the promoted standby"
    );

    // A new synchronous standby of the new primary: the contract is met
    // again, and re-calls replay their recorded answers.
    let standby2_port = free_port();
    let standby2 = cluster.base_backup("standby2", primary_port).await;
    cluster.start(&standby2, standby2_port).await;
    let admin = superuser(primary_port).await;
    set_sync_names(&admin, true).await;
    wait_sync_standbys(&admin, 1).await;
    wait_durability(&proxy, "durability met with the new standby", true, "").await;
    for (amount, operation_id, charge_id) in &acknowledged {
        let (again_id, again_charge, note) = charge(&agent, &lease, *amount).await.unwrap();
        assert_eq!(&again_id, operation_id);
        assert_eq!(&again_charge, charge_id);
        assert_eq!(note["replayed"], json!(true), "{note}");
    }
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(
        charges.len(),
        5,
        "each side effect exactly once: {charges:?}"
    );
    admin.close().await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_failover_reports_lost_acknowledged_writes_and_holds_until_resolved() {
    let _exclusive = common::exclusive().await;
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::new();
    let (primary_port, standby_port) = (free_port(), free_port());
    let primary = cluster
        .init_primary("primary", "synchronous_standby_names = ''")
        .await;
    cluster.start(&primary, primary_port).await;
    let db = ledger_db(primary_port).await;
    let standby = cluster.base_backup("standby", primary_port).await;
    cluster.start(&standby, standby_port).await;
    let standby_admin = superuser(standby_port).await;

    let scenario = Scenario::new(&url(primary_port, "leasegate"), "claim_ttl = \"60s\"\n");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    assert_eq!(durability(&proxy).await["durability"], "local");
    let (lease_a, _) = db.running_run("worker-a", 600_000).await;
    let (agent, _) = connect_http(&proxy.url, None).await;

    // Replicated: acknowledged, and replayed on the standby.
    let mut replicated = Vec::new();
    for amount in 201..=203 {
        let (operation_id, charge_id, _) = charge(&agent, &lease_a, amount).await.unwrap();
        replicated.push((amount, operation_id, charge_id));
    }
    let primary_lsn: String = db
        .query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .await;
    wait_until("the standby to replay the first calls", || async {
        let replayed: bool = sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
            .bind(&primary_lsn)
            .fetch_one(&standby_admin)
            .await
            .ok()?;
        replayed.then_some(())
    })
    .await;
    standby_admin.close().await;
    cluster.stop(&standby, "fast").await;

    // Acknowledged to the agent, never replicated: two charges, then the
    // worker hands the run to worker-b (epoch + 1).
    let mut unreplicated = Vec::new();
    for amount in 204..=205 {
        let (operation_id, charge_id, _) = charge(&agent, &lease_a, amount).await.unwrap();
        unreplicated.push((amount, operation_id, charge_id));
    }
    assert!(matches!(
        db.ledger.lease_release(&lease_a).await.unwrap(),
        Fenced::Applied(_)
    ));
    let AcquireOutcome::Acquired(grant_b) = db
        .ledger
        .lease_acquire(lease_a.run_id, "worker-b", 600_000)
        .await
        .unwrap()
    else {
        panic!("worker-b acquires the released lease");
    };
    let held_epoch = grant_b.claim.epoch;
    assert_eq!(held_epoch, lease_a.epoch + 1);
    // The process's high-water covers the acknowledged calls already (each
    // answer is sampled before the agent hears it).
    let before_crash = durability(&proxy).await;
    println!("before the crash: {}", before_crash["high_water"]);

    // The primary dies; the lagging standby is promoted at its address.
    drop(db);
    cluster.stop(&primary, "immediate").await;
    promote_at(&cluster, &standby, primary_port).await;
    let db = connect_db(primary_port).await;

    // leasegate reports the lost window and holds dispatch.
    let failover = wait_until("the lossy failover to be recorded", || async {
        failovers(&proxy).await?.into_iter().next()
    })
    .await;
    println!("failover: {failover}");
    assert_eq!(failover["lossy"], json!(true), "{failover}");
    assert_eq!(
        (
            failover["old_timeline"].clone(),
            failover["new_timeline"].clone()
        ),
        (json!(1), json!(2))
    );
    let lsn = |value: &Value| -> u64 {
        let (high, low) = value.as_str().unwrap().split_once('/').unwrap();
        (u64::from_str_radix(high, 16).unwrap() << 32) | u64::from_str_radix(low, 16).unwrap()
    };
    let switch = lsn(&failover["switch_lsn"]);
    let acknowledged = lsn(&failover["acknowledged_lsn"]);
    assert!(
        switch >= lsn(&json!(primary_lsn)),
        "the replicated calls are before the switch point"
    );
    assert!(acknowledged > switch, "{failover}");
    let report = wait_durability(
        &proxy,
        "dispatch held by the unresolved failover",
        false,
        "unresolved failover",
    )
    .await;
    println!("held: {}", report["reasons"]);
    let (code, message) = charge(&agent, &lease_a, 204).await.unwrap_err();
    assert_eq!(code, -31010, "{message}");
    assert!(message.contains("unresolved failover"), "{message}");

    // The three high-water marks after the failover.
    // Epoch: what the workers held vs what the ledger says now.
    let (ledger_owner, ledger_epoch): (Option<String>, i64) = db
        .row(
            "SELECT owner, epoch FROM worker_leases WHERE run_id = $1",
            lease_a.run_id.as_uuid(),
        )
        .await;
    println!(
        "epoch high-water: worker-b held epoch {held_epoch}; the ledger says {ledger_owner:?} \
         at epoch {ledger_epoch}"
    );
    assert_eq!(
        (ledger_owner.as_deref(), ledger_epoch),
        (Some("worker-a"), lease_a.epoch),
        "the epoch rolled back: the takeover after the standby stopped is lost"
    );
    // Ledger: which acknowledged operations survived.
    let kept: Vec<String> = replicated.iter().map(|(_, id, _)| id.clone()).collect();
    let lost: Vec<String> = unreplicated.iter().map(|(_, id, _)| id.clone()).collect();
    let kept_status = statuses(&db, &kept).await;
    let lost_status = statuses(&db, &lost).await;
    println!(
        "ledger high-water: replicated {kept_status:?}, after the standby stopped {lost_status:?}"
    );
    assert_eq!(kept_status, vec![Some("succeeded".to_owned()); 3]);
    assert_eq!(
        lost_status,
        vec![None, None],
        "exactly the unreplicated calls are lost"
    );
    // Remote: the tool server's own record has all five charges.
    let charges = scenario.side_effects("charges.jsonl");
    println!("remote high-water: {} charges: {charges:?}", charges.len());
    assert_eq!(charges.len(), 5);

    let metrics = http::get(&format!("{}/metrics", proxy.control_url)).await;
    assert!(
        metrics.body.contains("leasegate_failovers_unresolved 1"),
        "{}",
        metrics.body
    );

    // An operator compares and resolves (the operator CLI: one request to
    // the same API); dispatch resumes.
    let id = failover["failover_id"].as_i64().unwrap().to_string();
    let resolve = |reason: &str| {
        std::process::Command::new(common::proxy::LEASEGATE)
            .args([
                "ops",
                "failover-resolve",
                &id,
                "--by",
                "ops",
                "--reason",
                reason,
            ])
            .args(["--database-url", &url(primary_port, "leasegate")])
            .output()
            .expect("run leasegate ops failover-resolve")
    };
    let out = resolve("charges 204 and 205 exist at the provider; re-sent with the same keys");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.contains("\"resolved_by\""), "{printed}");
    let again = resolve("twice");
    assert_eq!(
        again.status.code(),
        Some(4),
        "resolving twice is a conflict"
    );
    wait_durability(&proxy, "dispatch to resume after the resolution", true, "").await;

    // The lost calls, re-called with the same run and step by the worker the
    // ledger knows: the same operation ids, answered by the provider from
    // its idempotency record — no second charge. The kept ones replay.
    for (amount, operation_id, charge_id) in unreplicated.iter().chain(&replicated) {
        let (again_id, again_charge, _) = charge(&agent, &lease_a, *amount).await.unwrap();
        assert_eq!(&again_id, operation_id);
        assert_eq!(&again_charge, charge_id, "the provider's own charge");
    }
    assert_eq!(
        statuses(&db, &lost).await,
        vec![Some("succeeded".to_owned()); 2]
    );
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 5, "no double charge: {charges:?}");
    proxy.stop().await;
}
