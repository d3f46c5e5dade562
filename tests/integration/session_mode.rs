//! Lease mode `session`: an agent that knows nothing of leases spawns
//! `leasegate stdio --task <key>` or sends `Leasegate-Task`; leasegate holds
//! the task run's lease, shared by every process and connection serving the
//! agent's task. A restarted agent's predecessor, frozen, is removed once
//! its liveness lapses and never sends again: the seed's stale-worker story
//! with no agent changes. An agent's own parallel calls, connections and
//! processes are never fenced.

use crate::common;
use crate::common::proxy::charge_eur;

use common::proxy::{
    Agent, AgentClient, LEASEGATE, RunningProxy, Scenario, call, connect_http_with, operation_note,
};
use common::{TestDb, wait_until, within};
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "claim_ttl = \"4s\"\nin_flight_wait = \"1s\"\ndispatch_interval = \"100ms\"\n\
                      claim_expiry_interval = \"200ms\"\nreconcile_interval = \"100ms\"\n";

/// A session lease whose members lapse 3 s after their last renewal; each
/// leasegate process opens at most four ledger sessions (several processes
/// per test, several tests at once, one PostgreSQL).
fn short_sessions(scenario: &Scenario, extra: &str) {
    scenario.surround_config(
        &format!("{extra}\ndatabase_max_connections = 4"),
        "[session]\nttl = \"3s\"\n",
    );
}

/// `leasegate stdio --task <task>` as the agent's MCP server; returns the
/// client and leasegate's pid.
async fn spawn_session(scenario: &Scenario, task: &str) -> (AgentClient, i32) {
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .arg("stdio")
        .arg("--config")
        .arg(scenario.config_path())
        .args(["--task", task])
        .env_remove("LEASEGATE_TASK");
    let transport = TokioChildProcess::new(command).unwrap();
    let pid = transport.id().expect("leasegate stdio runs") as i32;
    let agent = within("leasegate stdio to answer initialize", async {
        Agent::default().serve(transport).await.unwrap()
    })
    .await;
    (agent, pid)
}

fn signal(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
}

/// (owner, epoch) of the task's run lease.
async fn task_lease(db: &TestDb, task: &str) -> (Option<String>, i64) {
    db
        .row(
            "SELECT l.owner, l.epoch FROM worker_leases l JOIN agent_tasks t ON t.active_run_id = l.run_id \
         WHERE t.task_id = $1 AND t.kind = 'session'",
            task,
        )
        .await
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_restarted_stdio_agent_fences_its_frozen_predecessor_and_the_charge_happens_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    short_sessions(&scenario, "");

    // The first agent's leasegate takes the task's run; the agent sends no
    // lease of its own.
    let (first, first_pid) = spawn_session(&scenario, "nightly-invoices").await;
    let (owner, epoch) = task_lease(&db, "nightly-invoices").await;
    assert_eq!((owner.as_deref(), epoch), (Some("leasegate:session"), 1));
    let charge = json!({"amount": 7, "currency": "eur", "hang_ms": 3000});
    let in_flight = tokio::spawn({
        let charge = charge.clone();
        async move {
            let result = call(&first, "payments__charge", charge, None).await;
            (first, result)
        }
    });
    wait_until("the charge to happen at the tool", || async {
        (scenario.side_effects("charges.jsonl").len() == 1).then_some(())
    })
    .await;
    // The first leasegate freezes with the call in flight (its answer is
    // still on the way).
    signal(first_pid, nix::sys::signal::Signal::SIGSTOP);

    // The agent is restarted: a new leasegate for the same task joins the
    // lease beside the frozen one (it cannot tell a restart from a parallel
    // connection yet).
    let (second, second_pid) = spawn_session(&scenario, "nightly-invoices").await;
    let members = db.row_count("lease_members").await;
    assert_eq!(
        members, 2,
        "both processes are members until one is proven gone"
    );

    // The restarted agent makes the same call again: same run (resumed),
    // same derived step, same operation. Its first call waits until the
    // frozen process is proven gone (its liveness lapsed), then answers
    // once the frozen claim has lapsed and the reconciler proved the charge.
    let answer = wait_until("the restarted agent's call to succeed", || async {
        match call(&second, "payments__charge", charge.clone(), None).await {
            Ok(answer) if operation_note(&answer)["status"] == "succeeded" => Some(answer),
            // Still being reconciled: an agent asks again.
            Ok(answer) if operation_note(&answer)["status"] == "unknown" => None,
            Ok(answer) => panic!("unexpected answer {answer:?}"),
            Err((-31006, _)) => None,
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    })
    .await;
    assert_eq!(answer.structured_content.clone().unwrap()["amount"], 7);
    let removed: Vec<Value> = db
        .query_scalars(
            "SELECT detail FROM ledger_events WHERE subject = 'lease' AND detail ? 'member_removed'",
        )
        .await;
    assert_eq!(
        removed.len(),
        1,
        "the frozen member is removed, once: {removed:?}"
    );
    assert_eq!(
        task_lease(&db, "nightly-invoices").await.1,
        1,
        "the lease was held throughout"
    );

    // The first leasegate thaws: its late answer settles nothing, and a new
    // side-effecting call of its agent is refused before anything is sent.
    signal(first_pid, nix::sys::signal::Signal::SIGCONT);
    let (first, late) = within("the frozen call to end", in_flight).await.unwrap();
    if let Ok(late) = &late {
        assert_ne!(
            operation_note(late)["status"],
            "failed_final",
            "a late answer never turns into a failure: {late:?}"
        );
    }
    let refused = charge_eur(&first, 8, None)
        .await
        .expect_err("the stale session must not send");
    assert_eq!(refused.0, -31002, "{refused:?}");

    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1, "one charge in all: {charges:?}");
    assert_eq!(charges[0]["amount"], 7);
    let operations: Vec<(String, Value)> = db
        .query_rows("SELECT status, request_body FROM tool_operations")
        .await;
    assert_eq!(operations.len(), 1, "{operations:?}");
    assert_eq!(operations[0].0, "succeeded");

    // The restarted agent goes away: the last member out frees the lease
    // (the run stays running for the next session).
    second.cancel().await.unwrap();
    wait_until("the second session to release the lease", || async {
        (task_lease(&db, "nightly-invoices").await.0.is_none()).then_some(())
    })
    .await;
    let status: String = db
        .query_scalar(
            "SELECT r.status FROM agent_runs r JOIN agent_tasks t ON t.active_run_id = r.run_id \
         WHERE t.task_id = 'nightly-invoices'",
        )
        .await;
    assert_eq!(status, "running");
    let _ = second_pid;
    first.cancel().await.unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_session_resumes_its_run_and_replays_and_an_agents_own_lease_still_wins(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    let charge = json!({"amount": 9, "currency": "eur"});

    let (agent, pid) = spawn_session(&scenario, "weekly").await;
    let first = call(&agent, "payments__charge", charge.clone(), None)
        .await
        .unwrap();
    assert_eq!(operation_note(&first)["replayed"], false);
    // The client closes its stdio server with SIGTERM (as some do): the
    // session ends and leaves the lease, so the next one need not wait.
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    wait_until("the session to release the lease", || async {
        (task_lease(&db, "weekly").await.0.is_none()).then_some(())
    })
    .await;
    drop(agent);

    // The agent comes back later and repeats what it did: the same run,
    // the recorded answer, no second charge.
    let (agent, _) = spawn_session(&scenario, "weekly").await;
    assert_eq!(task_lease(&db, "weekly").await.1, 2, "same run, epoch + 1");
    let again = call(&agent, "payments__charge", charge, None)
        .await
        .unwrap();
    assert_eq!(operation_note(&again)["replayed"], true);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // An agent that sends its own lease is not overridden by the session.
    let (lease, _) = db.running_run("explicit-agent", 60_000).await;
    let own = charge_eur(&agent, 10, Some(common::proxy::lease_meta(&lease)))
        .await
        .unwrap();
    assert_eq!(operation_note(&own)["replayed"], false);
    let run: String = db
        .query_scalar(
            "SELECT run_id::text FROM tool_operations WHERE request_body->>'amount' = '10'",
        )
        .await;
    assert_eq!(run, lease.run_id.to_string());
    agent.cancel().await.unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn session_mode_without_a_task_key_refuses_to_start_and_names_the_ways_to_give_one(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    scenario.prepend_config("lease_mode = \"session\"");
    let output = within(
        "leasegate stdio to refuse",
        tokio::process::Command::new(LEASEGATE)
            .arg("stdio")
            .arg("--config")
            .arg(scenario.config_path())
            .env_remove("LEASEGATE_TASK")
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("needs a task key")
            && stderr.contains("--task")
            && stderr.contains("LEASEGATE_TASK"),
        "{stderr}"
    );
    let runs = db.row_count("agent_runs").await;
    assert_eq!(runs, 0, "nothing written");
}

/// `count` charges of distinct amounts from `base`, all at once through
/// `agent`; each must succeed.
async fn parallel_charges(agent: &AgentClient, base: i64, count: i64) {
    let calls = (0..count).map(|i| {
        call(
            agent,
            "payments__charge",
            json!({"amount": base + i, "currency": "eur"}),
            None,
        )
    });
    for (i, answer) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        let answer = answer.unwrap_or_else(|e| panic!("call {i} refused: {e:?}"));
        assert_eq!(operation_note(&answer)["status"], "succeeded", "{answer:?}");
    }
}

/// No lease of the task was ever taken over, and no member removed.
async fn assert_never_fenced(db: &TestDb) {
    let (expired, removed): (i64, i64) = db
        .query_row(
            "SELECT count(*) FILTER (WHERE from_status = 'expired'), \
                count(*) FILTER (WHERE detail ? 'member_removed') \
           FROM ledger_events WHERE subject = 'lease'",
        )
        .await;
    assert_eq!((expired, removed), (0, 0), "no takeover, no member removed");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn over_http_an_agents_sessions_and_stateless_requests_share_the_tasks_lease(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    short_sessions(&scenario, "lease_mode = \"session\"\nhttp_sessions = true");
    let proxy = RunningProxy::start(&scenario.config_path()).await;

    // No task key anywhere: the call needs a lease, and says how to get one.
    let anonymous = connect_http_with(&proxy.url, &[]).await;
    let (code, message) = charge_eur(&anonymous, 1, None).await.unwrap_err();
    assert_eq!(code, -31001);
    assert!(message.contains("lease_mode"), "{message}");

    let first = connect_http_with(&proxy.url, &[("leasegate-task", "monthly-close")]).await;
    let charge = json!({"amount": 11, "currency": "eur"});
    let answer = call(&first, "payments__charge", charge.clone(), None)
        .await
        .unwrap();
    assert_eq!(operation_note(&answer)["status"], "succeeded");
    assert_eq!(task_lease(&db, "monthly-close").await.1, 1);

    // The agent opens a second connection (a new MCP session for the same
    // task): it shares the lease. Its repeat replays; both connections go
    // on calling, in parallel, and none is refused.
    let second = connect_http_with(&proxy.url, &[("leasegate-task", "monthly-close")]).await;
    let again = call(&second, "payments__charge", charge, None)
        .await
        .unwrap();
    assert_eq!(operation_note(&again)["replayed"], true);
    tokio::join!(
        parallel_charges(&first, 100, 4),
        parallel_charges(&second, 200, 4)
    );
    assert_eq!(task_lease(&db, "monthly-close").await.1, 1);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 9);
    assert_never_fenced(&db).await;

    // Sessions end: the process's membership is left once no call uses it,
    // and the lease is free for the task's next session.
    second.cancel().await.unwrap();
    first.cancel().await.unwrap();
    wait_until("the idle membership to be left", || async {
        (task_lease(&db, "monthly-close").await.0.is_none()).then_some(())
    })
    .await;
    anonymous.cancel().await.unwrap();
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn over_stateless_http_an_agents_parallel_calls_share_the_lease_and_none_is_fenced(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    short_sessions(&scenario, "lease_mode = \"session\"");
    // A process of its own: its /metrics counts only its own calls.
    let served =
        common::proxy::ServedChild::spawn(common::proxy::ServedChild::command(&scenario, &[]))
            .await;

    // Each request is its own MCP context (no session): 2026-07-28 clients
    // and stateless handshake-era ones.
    let agent = connect_http_with(&served.mcp, &[("leasegate-task", "write-files")]).await;
    parallel_charges(&agent, 1, 6).await;
    parallel_charges(&agent, 1, 6).await;
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        6,
        "the repeat replays"
    );

    // A second leasegate behind the same load balancer: the agent's
    // requests land on both at once; the two processes share the lease.
    let other = RunningProxy::start(&scenario.config_path()).await;
    let elsewhere = connect_http_with(&other.url, &[("leasegate-task", "write-files")]).await;
    tokio::join!(
        parallel_charges(&agent, 100, 4),
        parallel_charges(&elsewhere, 200, 4)
    );
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 14);
    let (runs, members): (i64, i64) = db
        .query_row("SELECT (SELECT count(*) FROM agent_runs), (SELECT count(*) FROM lease_members)")
        .await;
    assert_eq!((runs, members), (1, 2), "one run, one member per process");
    assert_never_fenced(&db).await;
    elsewhere.cancel().await.unwrap();
    other.stop().await;
    let metrics = common::http::get(&format!("{}/metrics", served.control)).await;
    assert!(
        !metrics.body.contains("outcome=\"taken_over\""),
        "no takeover counted: {}",
        metrics.body
    );
    agent.cancel().await.unwrap();
    drop(served);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn several_stdio_processes_of_one_agent_share_the_lease_and_none_is_fenced(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    short_sessions(&scenario, "");

    // An agent framework that starts a server process per tool call, with
    // the model asking for parallel calls.
    let spawned =
        futures::future::join_all((0..4).map(|_| spawn_session(&scenario, "inbox"))).await;
    futures::future::join_all(
        spawned
            .iter()
            .enumerate()
            .map(|(i, (agent, _))| parallel_charges(agent, 10 * (i as i64 + 1), 2)),
    )
    .await;
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 8);
    let runs = db.row_count("agent_runs").await;
    assert_eq!(runs, 1);
    assert_never_fenced(&db).await;
    for (agent, _) in spawned {
        agent.cancel().await.unwrap();
    }
    wait_until("the last member out to free the lease", || async {
        (task_lease(&db, "inbox").await.0.is_none()).then_some(())
    })
    .await;
}

/// Runs `tests/sdk/frameworks.py` (an agent framework's MCP client, no
/// model) once; returns one JSON object per call.
async fn run_framework(args: &[String]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/frameworks.py");
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new(common::peers::frameworks_python())
            .arg(script)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("frameworks.py {args:?} did not finish in 120 s"))
    .expect("the frameworks' Python runs");
    assert!(
        output.status.success(),
        "frameworks.py {args:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        common::peers::stderr_tail(&output)
    );
    common::peers::json_lines(&output)
}

/// The MCP clients of the agent frameworks people run — langchain-mcp-adapters
/// (a new session per tool call: over stdio a new `leasegate stdio` per call)
/// and the OpenAI Agents SDK's MCP servers — each make 16 calls at once, in
/// session mode (one task key) and in key mode (a key per call), over stdio
/// and HTTP, then repeat them: every call is answered, none is refused, no
/// lease is taken over, exactly one charge per intent, and the repeat replays.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn agent_frameworks_calling_in_parallel_are_answered_once_each_and_never_fenced(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    for mode in ["session", "key"] {
        for transport in ["stdio", "http"] {
            for framework in ["langchain", "openai"] {
                let tag = format!("{framework}-{transport}-{mode}");
                let scenario = Scenario::new(&db.url, POLICY);
                // Up to 17 processes at once (langchain over stdio), each
                // with two ledger sessions, against one PostgreSQL. Nothing
                // here waits for a lapse, so the lease keeps the default
                // ttl: a renewal slowed by 17 processes on a small host is
                // not a lost lease.
                scenario.surround_config(
                    &format!("lease_mode = \"{mode}\"\ndatabase_max_connections = 2"),
                    "",
                );
                let mut args: Vec<String> = [
                    "--framework",
                    framework,
                    "--transport",
                    transport,
                    "--mode",
                    mode,
                    "--calls",
                    "16",
                    "--repeat",
                    "2",
                    "--tool",
                    "payments__charge",
                    "--arguments-json",
                    r#"{"amount": "{i}", "currency": "eur"}"#,
                    "--key-prefix",
                    &tag,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let proxy = match transport {
                    "http" => {
                        let proxy = RunningProxy::start(&scenario.config_path()).await;
                        args.extend(["--url".into(), proxy.url.clone()]);
                        if mode == "session" {
                            args.extend(["--header".into(), format!("leasegate-task={tag}")]);
                        }
                        Some(proxy)
                    }
                    _ => {
                        let mut command = vec![
                            LEASEGATE.to_owned(),
                            "stdio".into(),
                            "--config".into(),
                            scenario.config_path().display().to_string(),
                        ];
                        if mode == "session" {
                            command.extend(["--task".into(), tag.clone()]);
                        }
                        args.extend([
                            "--stdio-command".into(),
                            serde_json::to_string(&command).unwrap(),
                        ]);
                        None
                    }
                };
                let calls = run_framework(&args).await;
                assert_eq!(calls.len(), 32, "{tag}: {calls:?}");
                for answer in &calls {
                    assert_eq!(answer["ok"], true, "{tag}: {answer}");
                    if answer["batch"] == 1 && !answer["operation"].is_null() {
                        assert_eq!(answer["operation"]["replayed"], true, "{tag}: {answer}");
                    }
                }
                let charges = scenario.side_effects("charges.jsonl");
                assert_eq!(charges.len(), 16, "{tag}: one charge per intent");
                if let Some(proxy) = proxy {
                    proxy.stop().await;
                }
            }
        }
    }
    assert_never_fenced(&db).await;
    let (session_runs, key_runs): (i64, i64) = db
        .query_row(
            "SELECT count(*) FILTER (WHERE kind = 'session'), count(*) FILTER (WHERE kind = 'key') \
           FROM agent_runs",
        )
        .await;
    assert_eq!(
        (session_runs, key_runs),
        (4, 64),
        "one run per task key, one per idempotency key"
    );
}

/// Migration 0013 moves the lease modes' existing tasks to their
/// namespaces: a key-mode task (`idempotency-key:<principal>:<key>`, leased
/// by leasegate's key owner) to its principal's, a session-mode task (leased
/// by a `…:session` owner) to `anonymous`; control-API tasks, even one named
/// like a key, stay where they are. The next member resumes a moved run (its
/// recorded calls replay) and starts it if it was pending.
#[sqlx::test(migrations = false)]
async fn a_ledger_from_before_namespaces_moves_lease_mode_tasks_and_resumes_their_runs(
    pool: sqlx::PgPool,
) {
    use sqlx::migrate::Migrator;
    Migrator::with_migrations(
        leasegate::ledger::MIGRATOR
            .iter()
            .filter(|m| m.version <= 12)
            .cloned()
            .collect(),
    )
    .run(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(
        "INSERT INTO agent_tasks (tenant_id, task_id) VALUES
           ('t', 'idempotency-key:abc123:order-1'), ('t', 'nightly'),
           ('t', 'idempotency-key:looks:like'), ('t', 'plain');
         INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status) VALUES
           ('00000000-0000-7000-8000-000000000001', 't', 'idempotency-key:abc123:order-1', 1, 'running'),
           ('00000000-0000-7000-8000-000000000002', 't', 'nightly', 1, 'pending'),
           ('00000000-0000-7000-8000-000000000003', 't', 'idempotency-key:looks:like', 1, 'running'),
           ('00000000-0000-7000-8000-000000000004', 't', 'plain', 1, 'running');
         UPDATE agent_tasks SET active_run_id = ('00000000-0000-7000-8000-00000000000' ||
           CASE task_id WHEN 'nightly' THEN '2' WHEN 'plain' THEN '4'
                        WHEN 'idempotency-key:looks:like' THEN '3' ELSE '1' END)::uuid;
         INSERT INTO worker_leases (run_id, owner, epoch, expires_at)
           SELECT run_id, CASE run_id::text WHEN '00000000-0000-7000-8000-000000000001' THEN 'leasegate:idempotency-key'
                                            WHEN '00000000-0000-7000-8000-000000000002' THEN 'leasegate-7-ab12cd34:session'
                                            ELSE 'worker-1' END, 1, clock_timestamp() + interval '1 hour'
             FROM agent_runs;
         INSERT INTO ledger_events (run_id, subject, from_status, to_status, actor_kind, actor, epoch)
           SELECT run_id, 'lease', 'free', 'held', 'worker', owner, 1 FROM worker_leases;
         INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                      request_digest, request_body, status, dispatch_count, result)
           VALUES ('op-1', '00000000-0000-7000-8000-000000000001', 'idempotency-key', 1, 'payments__charge',
                   encode(sha256('x'), 'hex'), '{}', 'succeeded', 1, '{\"charged\": true}');",
    )
    .execute(&pool)
    .await
    .unwrap();

    leasegate::ledger::MIGRATOR.run(&pool).await.unwrap();

    let tasks: Vec<(String, String, String, bool)> = sqlx::query_as(
        "SELECT t.kind, t.principal, t.task_id, l.held_by_members FROM agent_tasks t
           JOIN worker_leases l ON l.run_id = t.active_run_id ORDER BY t.kind, t.task_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let tasks: Vec<(&str, &str, &str, bool)> = tasks
        .iter()
        .map(|(k, p, t, m)| (k.as_str(), p.as_str(), t.as_str(), *m))
        .collect();
    assert_eq!(
        tasks,
        [
            ("key", "abc123", "order-1", true),
            ("session", "anonymous", "nightly", true),
            ("task", "", "idempotency-key:looks:like", false),
            ("task", "", "plain", false),
        ]
    );

    // The next members resume the moved runs: the key's recorded call is
    // found under its run; the pending session run is started.
    let ledger = leasegate::ledger::Ledger::connect_with(
        pool.connect_options().as_ref().clone(),
        leasegate::ledger::LedgerOptions::default(),
    )
    .await
    .unwrap();
    let key = leasegate::ledger::TaskRef {
        tenant: "t",
        kind: leasegate::ledger::TaskKind::Key,
        principal: "abc123",
        task: "order-1",
    };
    let joined = ledger
        .lease_member_join(
            &key,
            "process-1",
            30_000,
            Some(std::time::Duration::from_secs(86_400)),
        )
        .await
        .unwrap();
    assert_eq!(
        joined.claim.run_id.to_string(),
        "00000000-0000-7000-8000-000000000001"
    );
    let session = leasegate::ledger::TaskRef {
        tenant: "t",
        kind: leasegate::ledger::TaskKind::Session,
        principal: "anonymous",
        task: "nightly",
    };
    let joined = ledger
        .lease_member_join(&session, "process-1", 30_000, None)
        .await
        .unwrap();
    assert_eq!(
        joined.claim.run_id.to_string(),
        "00000000-0000-7000-8000-000000000002"
    );
    assert_eq!(joined.run_status, leasegate::ledger::RunStatus::Running);
    // The control API's lease calls find neither.
    let taken = ledger
        .lease_acquire(joined.claim.run_id, "intruder", 30_000)
        .await
        .unwrap();
    assert!(
        matches!(taken, leasegate::ledger::AcquireOutcome::NotFound),
        "{taken:?}"
    );
}

/// Whether process `pid` has exited (gone, or a zombie not yet reaped).
fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S …": the state follows the command's closing paren.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// SIGTERM, SIGINT and SIGHUP each end `leasegate stdio` as the end of its
/// stdin does, with a call in flight: the session's lease is free for the
/// task's next session, the call (its tool still working when the signal
/// came) is settled from the tool's answer rather than left `dispatching`,
/// and the process exits. One charge per signal.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_stop_signal_with_a_call_in_flight_frees_the_lease_and_records_the_call(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    short_sessions(&scenario, "");
    let signals = [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ];
    for (n, stop) in signals.into_iter().enumerate() {
        let task = format!("signalled-{n}");
        let (agent, pid) = spawn_session(&scenario, &task).await;
        let agent = std::sync::Arc::new(agent);
        // The charge is made, then the tool takes a while to answer.
        let amount = 100 + n as i64;
        let in_flight = common::proxy::spawn_call(
            &agent,
            "payments__charge",
            json!({"amount": amount, "currency": "eur", "hang_ms": 1200}),
        );
        wait_until("the tool to make the charge", || async {
            (scenario.side_effects("charges.jsonl").len() == n + 1).then_some(())
        })
        .await;
        signal(pid, stop);
        wait_until("the signalled session to free its lease", || async {
            (task_lease(&db, &task).await.0.is_none()).then_some(())
        })
        .await;
        wait_until("the call in flight to be recorded", || async {
            let status: Option<String> = db
                .scalar(
                    "SELECT status FROM tool_operations WHERE request_body->>'amount' = $1",
                    amount.to_string(),
                )
                .await;
            (status.as_deref() == Some("succeeded")).then_some(())
        })
        .await;
        wait_until("leasegate stdio to exit", || async {
            exited(pid).then_some(())
        })
        .await;
        in_flight.abort();
    }
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 3);
}
