//! Lease mode `session`: an agent that knows nothing of leases spawns
//! `leasegate stdio --task <key>`; leasegate holds the task run's lease for
//! the life of the process. A restarted agent (a new `leasegate stdio` for
//! the same task) takes the lease over at once and fences its predecessor:
//! the seed's stale-worker story with no agent changes.

mod common;

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
    sqlx::query_as(
        "SELECT l.owner, l.epoch FROM worker_leases l JOIN agent_tasks t ON t.active_run_id = l.run_id \
         WHERE t.task_id = $1",
    )
    .bind(task)
    .fetch_one(&db.admin)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_restarted_stdio_agent_fences_its_frozen_predecessor_and_the_charge_happens_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);

    // The first agent's leasegate takes the task's run; the agent sends no
    // lease of its own.
    let (first, first_pid) = spawn_session(&scenario, "nightly-invoices").await;
    let (owner, epoch) = task_lease(&db, "nightly-invoices").await;
    assert_eq!(epoch, 1);
    let first_owner = owner.expect("the session holds the lease");
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

    // The agent is restarted: a new leasegate for the same task.
    let (second, second_pid) = spawn_session(&scenario, "nightly-invoices").await;
    let (owner, epoch) = task_lease(&db, "nightly-invoices").await;
    assert_eq!(epoch, 2, "taken over at once, not after the ttl");
    assert_ne!(owner.as_deref(), Some(first_owner.as_str()));
    let forced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ledger_events WHERE subject = 'lease' AND detail->>'forced' = 'true'",
    )
    .fetch_one(&db.admin)
    .await
    .unwrap();
    assert_eq!(forced, 1, "the takeover is recorded as forced");

    // The restarted agent makes the same call again: same run (resumed),
    // same derived step, same operation. It answers once the frozen
    // process's claim has lapsed and the reconciler has proved the charge.
    let answer = wait_until("the restarted agent's call to succeed", || async {
        match call(&second, "payments__charge", charge.clone(), None).await {
            Ok(answer) if operation_note(&answer)["status"] == "succeeded" => Some(answer),
            // Still being reconciled: an agent asks again.
            Ok(answer) if operation_note(&answer)["status"] == "unknown" => None,
            Ok(answer) => panic!("unexpected answer {answer:?}"),
            Err((-32006, _)) => None,
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    })
    .await;
    assert_eq!(answer.structured_content.clone().unwrap()["amount"], 7);

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
    let refused = call(
        &first,
        "payments__charge",
        json!({"amount": 8, "currency": "eur"}),
        None,
    )
    .await
    .expect_err("the stale session must not send");
    assert_eq!(refused.0, -32002, "{refused:?}");

    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1, "one charge in all: {charges:?}");
    assert_eq!(charges[0]["amount"], 7);
    let operations: Vec<(String, Value)> =
        sqlx::query_as("SELECT status, request_body FROM tool_operations")
            .fetch_all(&db.admin)
            .await
            .unwrap();
    assert_eq!(operations.len(), 1, "{operations:?}");
    assert_eq!(operations[0].0, "succeeded");

    // The restarted agent goes away: its session releases the lease (the
    // run stays running for the next session).
    second.cancel().await.unwrap();
    wait_until("the second session to release the lease", || async {
        (task_lease(&db, "nightly-invoices").await.0.is_none()).then_some(())
    })
    .await;
    let status: String = sqlx::query_scalar(
        "SELECT r.status FROM agent_runs r JOIN agent_tasks t ON t.active_run_id = r.run_id \
         WHERE t.task_id = 'nightly-invoices'",
    )
    .fetch_one(&db.admin)
    .await
    .unwrap();
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

    let (agent, _) = spawn_session(&scenario, "weekly").await;
    let first = call(&agent, "payments__charge", charge.clone(), None)
        .await
        .unwrap();
    assert_eq!(operation_note(&first)["replayed"], false);
    agent.cancel().await.unwrap();
    wait_until("the session to release the lease", || async {
        (task_lease(&db, "weekly").await.0.is_none()).then_some(())
    })
    .await;

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
    let own = call(
        &agent,
        "payments__charge",
        json!({"amount": 10, "currency": "eur"}),
        Some(common::proxy::lease_meta(&lease)),
    )
    .await
    .unwrap();
    assert_eq!(operation_note(&own)["replayed"], false);
    let run: String = sqlx::query_scalar(
        "SELECT run_id::text FROM tool_operations WHERE request_body->>'amount' = '10'",
    )
    .fetch_one(&db.admin)
    .await
    .unwrap();
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
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_runs")
        .fetch_one(&db.admin)
        .await
        .unwrap();
    assert_eq!(runs, 0, "nothing written");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn over_http_sessions_each_mcp_session_holds_its_tasks_lease_and_a_new_one_takes_it_over(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    scenario.prepend_config("lease_mode = \"session\"\nhttp_sessions = true");
    let proxy = RunningProxy::start(&scenario.config_path()).await;

    // No task key anywhere: the call needs a lease, and says how to get one.
    let anonymous = connect_http_with(&proxy.url, &[]).await;
    let (code, message) = call(
        &anonymous,
        "payments__charge",
        json!({"amount": 1, "currency": "eur"}),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(code, -32001);
    assert!(message.contains("lease_mode"), "{message}");

    let first = connect_http_with(&proxy.url, &[("leasegate-task", "monthly-close")]).await;
    let charge = json!({"amount": 11, "currency": "eur"});
    let answer = call(&first, "payments__charge", charge.clone(), None)
        .await
        .unwrap();
    assert_eq!(operation_note(&answer)["status"], "succeeded");
    assert_eq!(task_lease(&db, "monthly-close").await.1, 1);

    // The agent reconnects (a new MCP session for the same task): the lease
    // is taken over; the old session's calls are refused, the new one's
    // repeat replays.
    let second = connect_http_with(&proxy.url, &[("leasegate-task", "monthly-close")]).await;
    let again = call(&second, "payments__charge", charge, None)
        .await
        .unwrap();
    assert_eq!(operation_note(&again)["replayed"], true);
    assert_eq!(task_lease(&db, "monthly-close").await.1, 2);
    let stale = call(
        &first,
        "payments__charge",
        json!({"amount": 12, "currency": "eur"}),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(stale.0, -32002, "{stale:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // The session ends: its lease is released.
    second.cancel().await.unwrap();
    wait_until("the ended session to release the lease", || async {
        (task_lease(&db, "monthly-close").await.0.is_none()).then_some(())
    })
    .await;
    first.cancel().await.unwrap();
    anonymous.cancel().await.unwrap();
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn session_mode_over_stateless_http_is_refused_at_start(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    scenario.prepend_config("lease_mode = \"session\"");
    let output = within(
        "leasegate serve to refuse",
        tokio::process::Command::new(LEASEGATE)
            .arg("serve")
            .arg("--config")
            .arg(scenario.config_path())
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("needs http_sessions = true"), "{stderr}");
}
