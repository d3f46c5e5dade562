//! Progress on long waits (src/progress.rs): drawn on a terminal, and not a
//! byte of it when stderr is a pipe (CI) — the output is what it was before
//! progress existed. `leasegate migrate` run as a process, once with pipes
//! and once under a pseudo-terminal (`script` from util-linux).

use std::process::{Command, Output};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn migrate(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasegate"));
    command
        .args(["migrate", "--database-url", url])
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env_remove("LEASEGATE_NO_PROGRESS")
        .env("RUST_LOG", "error");
    command
}

/// `command` under a pseudo-terminal: stdout and stderr are the terminal;
/// what it wrote comes back on `script`'s stdout.
fn on_a_terminal(command: &Command, env: &[(&str, &str)]) -> Output {
    let line = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| format!("'{}'", part.to_str().unwrap()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = Command::new("script");
    script
        .args(["-qec", &line, "/dev/null"])
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env_remove("LEASEGATE_NO_PROGRESS")
        .env("RUST_LOG", "error");
    for (name, value) in env {
        script.env(name, value);
    }
    script
        .output()
        .expect("`script` (util-linux) runs; .ci/run installs it")
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn migrate_draws_progress_only_on_a_terminal(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let url = crate::common::database_url(&connect);
    let migrations = leasegate::ledger::MIGRATOR.iter().count();
    let expected = format!("ledger migrated ({migrations} migrations)\n");

    // Pipes (CI): the answer on stdout, and nothing else anywhere.
    let piped = migrate(&url).output().unwrap();
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert_eq!(piped.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&piped.stdout), expected);
    assert_eq!(stderr, "", "no progress, no escape codes on a pipe");

    // A terminal: the spinner is drawn (and cleared), the answer follows.
    let shown = on_a_terminal(&migrate(&url), &[]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(shown.status.code(), Some(0), "{text}");
    assert!(text.contains("migrating the ledger"), "{text:?}");
    assert!(text.contains(expected.trim_end()), "{text:?}");

    // LEASEGATE_NO_PROGRESS turns it off on a terminal too.
    let quiet = on_a_terminal(&migrate(&url), &[("LEASEGATE_NO_PROGRESS", "1")]);
    let text = String::from_utf8_lossy(&quiet.stdout);
    assert_eq!(quiet.status.code(), Some(0), "{text}");
    assert!(!text.contains("migrating the ledger"), "{text:?}");
    assert_eq!(text.replace("\r\n", "\n"), expected);
}
