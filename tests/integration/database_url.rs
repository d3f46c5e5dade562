//! How every command finds the ledger, and what it says when it cannot
//! open it: the `leasegate` binary run as a process, with the test suite's
//! `DATABASE_URL` removed from (or set to garbage in) its environment.
//!
//! Order: `--database-url`, `LEASEGATE_DATABASE_URL`, `database_url` of
//! `--config`, the default. Failures: unreachable (exit 6), database missing
//! (8), schema missing (9), login refused (7: a role that does not exist,
//! SQLSTATE 28000; a wrong password, 28P01, cannot be provoked on a server
//! whose pg_hba.conf trusts 127.0.0.1 and is unit-tested in
//! `src/cli/failure.rs`) — each provoked for real.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The URL of a `#[sqlx::test]` database.
/// A URL on 127.0.0.1 where nothing listens.
fn closed_port_url(database: &str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("postgres://postgres:sekret@127.0.0.1:{port}/{database}")
}

/// Runs `leasegate` with neither `DATABASE_URL` nor `LEASEGATE_DATABASE_URL`
/// inherited, then `env` set.
fn leasegate(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasegate"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env("RUST_LOG", "error");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_mentions(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

/// A valid leasegate.toml (its upstream is never started by the operator
/// commands) in a fresh directory.
fn config_file(database_url: &str) -> PathBuf {
    write_config(&format!(
        "database_url = \"{database_url}\"\ntenant = \"tenant-a\"\n\
         [upstreams.tools]\ntransport = \"stdio\"\ncommand = \"/bin/true\"\n"
    ))
}

/// `text` as the leasegate.toml of a fresh directory.
fn write_config(text: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("leasegate-dburl-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("leasegate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn remove_config(path: &Path) {
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn an_unreachable_server_is_named_without_its_password_with_how_to_fix_it() {
    let url = closed_port_url("leasegate");
    let target = url.replace(":sekret@", "@");
    for args in [
        vec!["ops", "unknown", "--database-url", &url],
        vec!["migrate", "--database-url", &url],
    ] {
        let output = leasegate(&args, &[]);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(6), "{args:?}: {text}");
        assert_mentions(
            &text,
            &[
                &format!("no PostgreSQL server answers at {target}"),
                "the URL came from --database-url",
                "Start PostgreSQL",
                "point --database-url (or LEASEGATE_DATABASE_URL, or database_url in --config)",
                "(ledger_unavailable)",
            ],
        );
        assert!(!text.contains("sekret"), "the password leaked: {text}");
    }
    // `serve` too, before it starts anything; the URL from the config file.
    let config = config_file(&url);
    let output = leasegate(&["serve", "--config", config.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(6), "{text}");
    assert_mentions(
        &text,
        &[
            "no PostgreSQL server answers",
            &format!("the URL came from database_url in {}", config.display()),
        ],
    );
    // --json: the error as the API's JSON on stdout.
    let output = leasegate(&["ops", "unknown", "--json", "--database-url", &url], &[]);
    assert_eq!(output.status.code(), Some(6));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["code"], "ledger_unavailable");
    remove_config(&config);
}

#[sqlx::test(migrations = false)]
async fn a_refused_login_a_missing_database_and_a_database_without_the_ledger_are_told_apart(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // A database that does not exist on a server that runs.
    let missing = format!(
        "postgres://{}@{}:{}/leasegate_missing_{}",
        connect.get_username(),
        connect.get_host(),
        connect.get_port(),
        uuid::Uuid::new_v4().simple()
    );
    let output = leasegate(&["runs", "show", "x", "--database-url", &missing], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(8), "{text}");
    assert_mentions(
        &text,
        &[
            &format!("PostgreSQL at {missing} answered: database \"leasegate_missing_"),
            &format!("`leasegate migrate --database-url {missing}` creates the database"),
            "(database_missing)",
        ],
    );

    // A login the server refuses: a role that does not exist.
    let stranger = format!(
        "postgres://leasegate_no_such_role_{}@{}:{}/postgres",
        uuid::Uuid::new_v4().simple(),
        connect.get_host(),
        connect.get_port(),
    );
    let output = leasegate(&["migrate", "--database-url", &stranger], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(7), "{text}");
    assert_mentions(
        &text,
        &[
            &format!("PostgreSQL refused the login at {stranger}"),
            "Check the user and password",
            "(database_auth_failed)",
        ],
    );

    // An empty database (as the `postgres` database is): schema missing.
    let empty = crate::common::database_url(&connect);
    let output = leasegate(&["ops", "unknown"], &[("LEASEGATE_DATABASE_URL", &empty)]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(9), "{text}");
    assert_mentions(
        &text,
        &[
            &format!("{empty} holds no leasegate ledger"),
            "missing the ledger tables",
            "the URL came from LEASEGATE_DATABASE_URL",
            &format!("Run `leasegate migrate --database-url {empty}`"),
            "(schema_missing)",
        ],
    );
    // The fix it names works, and then the command does.
    let migrated = leasegate(&["migrate"], &[("LEASEGATE_DATABASE_URL", &empty)]);
    assert_eq!(migrated.status.code(), Some(0), "{}", stderr(&migrated));
    let output = leasegate(
        &["ops", "unknown", "--json"],
        &[("LEASEGATE_DATABASE_URL", &empty)],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["count"], 0);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_flag_wins_over_the_environment_which_wins_over_the_config_and_database_url_is_never_read(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let admin = pool.connect_with(connect.clone()).await.unwrap();
    let good = crate::common::database_url(&connect);
    let closed = closed_port_url("leasegate");
    let ok = |output: Output| {
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };

    // The test suite's DATABASE_URL is not the CLI's: garbage there is ignored.
    ok(leasegate(
        &["ops", "unknown", "--json"],
        &[
            ("DATABASE_URL", "garbage://"),
            ("LEASEGATE_DATABASE_URL", &good),
        ],
    ));
    // ... and with nothing else set, the CLI does not fall back to it.
    let output = leasegate(
        &["ops", "unknown", "--json"],
        &[("DATABASE_URL", &good), ("LEASEGATE_DATABASE_URL", &closed)],
    );
    assert_eq!(output.status.code(), Some(6), "{}", stderr(&output));

    // LEASEGATE_DATABASE_URL wins over --config.
    let bad_config = config_file(&closed);
    let config = bad_config.to_str().unwrap();
    ok(leasegate(
        &["ops", "unknown", "--json", "--config", config],
        &[("LEASEGATE_DATABASE_URL", &good)],
    ));
    // --database-url wins over both.
    ok(leasegate(
        &[
            "ops",
            "unknown",
            "--json",
            "--config",
            config,
            "--database-url",
            &good,
        ],
        &[("LEASEGATE_DATABASE_URL", &closed)],
    ));
    // The config alone is used, and said to be the source when it fails.
    let output = leasegate(&["ops", "unknown", "--config", config], &[]);
    assert_eq!(output.status.code(), Some(6));
    assert_mentions(
        &stderr(&output),
        &[&format!("the URL came from database_url in {config}")],
    );
    remove_config(&bad_config);

    // With --config, the operator acts for the config's tenant.
    let good_config = config_file(&good);
    let config = good_config.to_str().unwrap();
    let created = ok(leasegate(
        &[
            "runs", "create", "--task", "t1", "--json", "--config", config,
        ],
        &[],
    ));
    let tenant: String =
        sqlx::query_scalar("SELECT tenant_id FROM agent_runs WHERE run_id = $1::uuid")
            .bind(created["run_id"].as_str().unwrap())
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(tenant, "tenant-a");
    let refused = leasegate(
        &[
            "runs", "create", "--task", "t2", "--tenant", "tenant-b", "--config", config,
        ],
        &[],
    );
    assert_eq!(refused.status.code(), Some(2));
    assert_mentions(
        &stderr(&refused),
        &[
            "expected tenant \"tenant-a\"",
            "found \"tenant-b\"",
            "(tenant_mismatch)",
        ],
    );
    remove_config(&good_config);
}

#[test]
fn help_says_the_order_in_which_the_database_is_found() {
    for command in [
        &["ops", "--help"][..],
        &["runs", "create", "--help"],
        &["migrate", "--help"],
        &["serve", "--help"],
        &["stdio", "--help"],
    ] {
        let output = leasegate(command, &[]);
        assert_eq!(output.status.code(), Some(0), "{command:?}");
        let help = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert_mentions(
            &help,
            &[
                "--database-url, then $LEASEGATE_DATABASE_URL, then database_url in the --config file, then postgres://postgres@127.0.0.1:5432/leasegate",
                "($DATABASE_URL is not read)",
            ],
        );
    }
}

/// Runs `leasegate` (environment as [`leasegate`]), killing it if it has
/// not exited within the test deadline.
fn leasegate_within(args: &[&str], deadline: std::time::Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "leasegate {args:?} still running after {deadline:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut text).unwrap();
    (status.code(), text)
}

#[test]
fn serve_gives_up_on_a_database_that_never_answers_and_says_which_and_why() {
    let url = crate::common::silent_server_url();
    let target = url.replace(":sekret@", "@");
    let dir =
        std::env::temp_dir().join(format!("leasegate-dburl-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("leasegate.toml");
    std::fs::write(
        &config,
        "database_connect_timeout = \"2s\"\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"off\"\n\
         [upstreams.tools]\ntransport = \"stdio\"\ncommand = \"/bin/true\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    // With migrate on (the default: create the database, then migrate),
    // then with it off (connect only): each step would wait on the server.
    let (code, text) = leasegate_within(
        &["serve", "--config", config, "--database-url", &url],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(code, Some(6), "{text}");
    assert_mentions(
        &text,
        &[
            &format!("no PostgreSQL server answers at {target}"),
            "the server accepted the connection but did not answer as PostgreSQL within 2s",
            "(database_connect_timeout)",
            "the URL came from --database-url",
            "(ledger_unavailable)",
        ],
    );
    assert!(!text.contains("sekret"), "the password leaked: {text}");
    // Longer than the pool's own wait for a connection (5 s): the wait
    // applied and reported is still the one configured.
    std::fs::write(
        dir.join("leasegate.toml"),
        "database_connect_timeout = \"6s\"\nmigrate = false\nlisten = \"127.0.0.1:0\"\n\
         control_listen = \"off\"\n[upstreams.tools]\ntransport = \"stdio\"\ncommand = \"/bin/true\"\n",
    )
    .unwrap();
    let (code, text) = leasegate_within(
        &["serve", "--config", config, "--database-url", &url],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(code, Some(6), "{text}");
    assert_mentions(&text, &["did not answer as PostgreSQL within 6s"]);

    // A URL that is not PostgreSQL's is refused before anything is tried.
    let (code, text) = leasegate_within(
        &[
            "serve",
            "--config",
            config,
            "--database-url",
            "mysql://root:sekret@127.0.0.1/x",
        ],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(code, Some(2), "{text}");
    assert_mentions(&text, &["is not a PostgreSQL URL: the scheme is \"mysql\""]);
    assert!(!text.contains("sekret"), "the password leaked: {text}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `leasegate stdio` that cannot open its ledger answers the client's
/// `initialize` with `-31013`, naming the database and the fix, before it
/// exits 6 — the client sees the cause, not "connection closed".
#[test]
fn stdio_that_cannot_start_answers_the_clients_initialize_with_the_cause() {
    use std::io::{BufRead, Write};
    let url = crate::common::silent_server_url();
    let config = write_config(
        "database_connect_timeout = \"2s\"\nmigrate = false\n\
         [upstreams.tools]\ntransport = \"stdio\"\ncommand = \"/bin/true\"\n",
    );
    let mut child = std::process::Command::new(crate::common::proxy::LEASEGATE)
        .args(["stdio", "--config"])
        .arg(&config)
        .args(["--database-url", &url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
    )
    .unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut answer)
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("one JSON-RPC answer");
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["error"]["code"], -31013, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no PostgreSQL server answers")
            && message.contains("within 2s (database_connect_timeout)")
            && !message.contains("sekret"),
        "{message}"
    );
    drop(stdin);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(6));
    remove_config(&config);
}
