//! The commands README.md gives a newcomer, run as pasted: the quickstart's
//! `serve` line with no database configured (nothing answers at the
//! default, so leasegate starts its private PostgreSQL), then the curl
//! block from "the repository's root in another shell", whose output must
//! be what the README shows below it. `tests/checks/doc_commands.rs` lists
//! which test runs each shell block of the README and docs.
//!
//! Only what a test cannot do as a user would differs: the suite has built
//! the binaries already (debug, where the README builds release), so the
//! "repository root" is a scratch directory whose `target/release` is the
//! suite's build, beside links to the repository's `examples`, `adapters`
//! and `policies`; and the default database URL points at a closed port,
//! because this machine's PostgreSQL answers at the real one.

use crate::common;
use crate::embedded_pg::{
    ClusterGuard, Leasegate, START_DEADLINE, STOP_DEADLINE, assert_stopped, closed_port_url,
};

use std::path::{Path, PathBuf};
use std::process::Stdio;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A scratch "repository root": links to what the quickstart config names,
/// and `target/release` as the directory of the suite's binaries.
fn scratch_root() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasegate-readme-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(dir.join("target")).unwrap();
    for linked in ["examples", "adapters", "policies"] {
        std::os::unix::fs::symlink(Path::new(ROOT).join(linked), dir.join(linked)).unwrap();
    }
    let binaries = Path::new(common::proxy::LEASEGATE).parent().unwrap();
    std::os::unix::fs::symlink(binaries, dir.join("target/release")).unwrap();
    dir
}

/// `text` with every UUID replaced by `<id>`.
fn ids_masked(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if rest.len() >= 36
            && rest.is_char_boundary(36)
            && uuid::Uuid::try_parse(&rest[..36]).is_ok()
        {
            out.push_str("<id>");
            rest = &rest[36..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The README's shown output, with its shortened ids (`5bc383e0-…`) as
/// `<id>`.
fn shown_ids_masked(text: &str) -> String {
    let mut out = String::new();
    for (index, piece) in text.split('…').enumerate() {
        if index == 0 {
            out.push_str(piece);
            continue;
        }
        // The eight hex digits and the dash before this ellipsis.
        let cut = out.len().saturating_sub(9);
        assert!(
            out[cut..].ends_with('-') && out[cut..cut + 8].chars().all(|c| c.is_ascii_hexdigit()),
            "an ellipsis in the README's output that is not a shortened id: {text}"
        );
        out.truncate(cut);
        out.push_str("<id>");
        out.push_str(piece);
    }
    out
}

/// README.md's quickstart, as a newcomer pastes it, on the private
/// cluster: the first call is sent and recorded, the same call again is
/// answered from the ledger (`replayed: true`), and the tool's record holds
/// one charge whose idempotency key is the operation id. SIGTERM then stops
/// leasegate and its cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quickstart_runs_as_pasted_on_a_private_cluster() {
    let _exclusive = common::exclusive().await;
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let (build_and_serve, _) = common::files::block_and_next(
        &readme,
        "sh",
        "cargo build --release --bins && target/release/leasegate serve",
    );
    // The build is the suite's own (see the module docs).
    let serve = build_and_serve
        .trim()
        .split_once(" && ")
        .expect("`cargo build … && target/release/leasegate serve …`")
        .1
        .to_owned();
    let (calls, shown) = common::files::block_and_next(&readme, "sh", "J='content-type");
    let shown = shown.expect("the README shows the calls' output");

    let root = scratch_root();
    // Declared after `root`'s creation and dropped before its removal.
    let guard = ClusterGuard {
        dir: root.join(".leasegate/pg"),
    };
    let mut command = tokio::process::Command::new("bash");
    command
        .args(["-c", &format!("exec {serve}")])
        .current_dir(&root)
        .env_remove("DATABASE_URL")
        .env_remove("LEASEGATE_DATABASE_URL")
        .env_remove("LEASEGATE_STATE_DIR")
        .env_remove("LEASEGATE_PG_BIN_DIRS")
        .env("LEASEGATE_DEFAULT_DATABASE_URL", closed_port_url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut leasegate = Leasegate::spawn(command);
    leasegate
        .line("private PostgreSQL at", START_DEADLINE)
        .await;
    leasegate
        .line("control API at http://127.0.0.1:8641", START_DEADLINE)
        .await;

    let output = tokio::time::timeout(
        common::DEADLINE,
        tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &calls])
            .current_dir(&root)
            .output(),
    )
    .await
    .expect("the README's calls finish")
    .expect("bash and curl run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}\nleasegate:\n{}",
        String::from_utf8_lossy(&output.stderr),
        leasegate.stderr()
    );
    assert_eq!(
        ids_masked(&stdout),
        shown_ids_masked(&shown),
        "the README's calls printed:\n{stdout}"
    );
    // One operation throughout: the call, its replay and the tool's key.
    let id_after = |needle: &str, from: usize| -> String {
        let at = stdout[from..].find(needle).expect(needle) + from + needle.len();
        stdout[at..at + 36].to_owned()
    };
    let second_line = stdout.find('\n').unwrap();
    let first = id_after("\"operation_id\":\"", 0);
    assert_eq!(
        id_after("\"operation_id\":\"", second_line),
        first,
        "{stdout}"
    );
    assert_eq!(id_after("\"idempotency_key\":\"", 0), first, "{stdout}");

    let postmaster = guard.postmaster_pid().expect("the private cluster runs");
    leasegate.signal(nix::sys::signal::Signal::SIGTERM);
    let status = leasegate.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}: {}", leasegate.stderr());
    assert_stopped(&guard, postmaster).await;
    drop(guard);
    let _ = std::fs::remove_dir_all(&root);
}

/// `expected` with `…` standing for any text, matched against the whole of
/// `actual`.
fn matches_shown(actual: &str, expected: &str) -> bool {
    let mut pieces = expected.split('…');
    let first = pieces.next().unwrap();
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    for (index, piece) in pieces.iter().enumerate() {
        if index + 1 == pieces.len() {
            return rest.ends_with(piece);
        }
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// docs/quickstart.md's "Watch a worker lose its lease", as written, on the
/// test's database: a run made with `psql`, the example worker leasing it,
/// frozen, another owner taking the lease over, the worker woken — whose
/// next save is refused and who stops, printing what the page shows. The
/// page's two `sleep`s wait for what they stand for instead of a time: the
/// first until the worker has saved a checkpoint, the second until its
/// lease has expired on the database clock.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_quickstart_worker_loses_its_lease_as_the_page_shows(
    pool: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let db = common::TestDb::new(pool, connect).await;
    let database = db.url.rsplit('/').next().unwrap().to_owned();
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/quickstart.md")).unwrap();
    let (block, shown) = common::files::block_and_next(&page, "sh", "RUN=$(psql ");
    let shown = shown.expect("the page shows the worker's last lines");
    let block = common::replace_exactly(
        &common::replace_exactly(&block, "-d leasegate ", &format!("-d {database} ")),
        "postgres://postgres@127.0.0.1:5432/leasegate",
        &db.url,
    );
    let root = scratch_root();
    let output_file = root.join("worker.out");
    let waits = format!(
        r#"sleep() {{
  local until=$((SECONDS + 60))
  case "$1" in
    2) until grep -q '"event":"saved"' {out}; do
         [ $SECONDS -lt $until ] || {{ echo "no save within 60 s" >&2; exit 1; }}; command sleep 0.05; done ;;
    6) until [ "$(psql -h 127.0.0.1 -U postgres -d {database} -Atc \
         "SELECT expires_at < now() FROM worker_leases WHERE run_id = '$RUN'")" = t ]; do
         [ $SECONDS -lt $until ] || {{ echo "the lease never expired" >&2; exit 1; }}; command sleep 0.1; done ;;
    *) echo "unexpected sleep $1" >&2; exit 1 ;;
  esac
}}
"#,
        out = output_file.display()
    );
    // A worker left frozen by a failing step is woken and stopped on exit.
    let script = format!(
        "trap 'kill -CONT ${{W:-0}} 2>/dev/null; kill ${{W:-0}} 2>/dev/null' EXIT\n{waits}{block}wait $W\n"
    );
    let errors_file = root.join("worker.err");
    let binaries = Path::new(common::proxy::LEASEGATE).parent().unwrap();
    let status = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new("bash")
            .args(["-eu", "-c", &script])
            .current_dir(&root)
            .env_remove("DATABASE_URL")
            .env_remove("LEASEGATE_DATABASE_URL")
            .env("LEASEGATE_DEFAULT_DATABASE_URL", &db.url)
            .env(
                "PATH",
                format!("{}:{}", binaries.display(), std::env::var("PATH").unwrap()),
            )
            .stdout(std::fs::File::create(&output_file).unwrap())
            .stderr(std::fs::File::create(&errors_file).unwrap())
            .status(),
    )
    .await
    .expect("the page's commands finish")
    .expect("bash runs");
    let printed = std::fs::read_to_string(&output_file).unwrap();
    let errors = std::fs::read_to_string(&errors_file).unwrap();
    // The worker exits with a failure once it has lost its lease; `wait`
    // passes that on, so the script's status is the worker's.
    assert!(
        !status.success(),
        "the worker stopped cleanly instead of losing its lease:\n{printed}\n{}",
        errors
    );
    assert!(
        printed
            .lines()
            .any(|line| line.split_whitespace().eq(["epoch", "2"])),
        "`leasegate lease acquire` took the lease at epoch 2 (the page says so):\n{printed}"
    );
    let last: Vec<&str> = printed.lines().rev().take(2).collect();
    let shown: Vec<&str> = shown.lines().collect();
    assert_eq!(last.len(), 2, "{printed}");
    for (actual, expected) in last.iter().rev().zip(&shown) {
        assert!(
            matches_shown(actual, expected),
            "printed {actual}\nthe page shows {expected}\nall:\n{printed}\n{}",
            errors
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Each line of docs/operating.md's operator command list (a synopsis:
/// `[optional]`, `a|b`, `<placeholders>`), the commands the test runs for
/// it with every flag the line names, and the exit status each must end
/// with. The variables come from the seeded ledger: `$RUN` holds `$OP`, an
/// unknown charge, and `$SETTLED`, a succeeded one; `$SPARE` and `$FREE`
/// are runs nobody leases; `$FAILOVER` is a recorded failover.
const OPERATOR_COMMANDS: &[(&str, &str, i32)] = &[
    (
        "leasegate ops show <operation_id>",
        "leasegate ops show $OP && leasegate ops show $SETTLED",
        0,
    ),
    (
        "leasegate ops list [--run <run_id>] [--status unknown] [--tool T] [--limit 100] [--cursor C]",
        "leasegate ops list --run $RUN --status unknown --tool payments__charge --limit 100 && \
         C=$(leasegate ops list --run $RUN --limit 1 --json | grep -o '\"next_cursor\":\"[^\"]*\"' | cut -d'\"' -f4) && \
         test -n \"$C\" && leasegate ops list --run $RUN --limit 1 --cursor \"$C\"",
        0,
    ),
    ("leasegate ops unknown", "leasegate ops unknown", 0),
    (
        "leasegate ops retry <operation_id> --note \"…\" [--actor …]",
        "leasegate ops retry $OP --note 'checked: not at the provider' --actor alice",
        0,
    ),
    (
        "leasegate ops resolve <operation_id> --succeeded|--failed-final --note \"…\" [--remote-id …] [--actor …]",
        "leasegate ops resolve $OP --succeeded --note 'found at the provider' --remote-id ch_42 --actor alice",
        0,
    ),
    (
        "leasegate ops failovers [--unresolved]",
        "leasegate ops failovers --unresolved",
        0,
    ),
    (
        "leasegate ops failover-resolve <failover_id> --reason \"…\" [--by …]",
        "leasegate ops failover-resolve $FAILOVER --reason 'compared the standby' --by alice",
        0,
    ),
    (
        "leasegate ops archive --older-than 30d [--delete] [--batch 1000] [--max-batches N]",
        "leasegate ops archive --older-than 30d --delete --batch 1000 --max-batches 2",
        0,
    ),
    (
        "leasegate runs create --task T [--tenant X] [--owner O --ttl-ms N]",
        "leasegate runs create --task order-7 --tenant tenant-a --owner worker-9 --ttl-ms 30000",
        0,
    ),
    (
        "leasegate runs show <run_id>",
        "leasegate runs show $RUN",
        0,
    ),
    (
        "leasegate runs cancel <run_id> [--reason \"…\"] [--actor …]",
        "leasegate runs cancel $SPARE --reason 'order withdrawn' --actor alice",
        0,
    ),
    (
        "leasegate lease acquire|renew|release <run_id> …",
        "OUT=$(leasegate lease acquire $FREE --ttl-ms 30000 --owner worker-2) && \
         T=$(echo \"$OUT\" | awk '$1 == \"lease_token\" { print $2 }') && \
         E=$(echo \"$OUT\" | awk '$1 == \"epoch\" { print $2 }') && \
         leasegate lease renew $FREE --owner worker-2 --epoch \"$E\" --lease-token \"$T\" --ttl-ms 30000 && \
         leasegate lease release $FREE --owner worker-2 --epoch \"$E\" --lease-token \"$T\"",
        0,
    ),
];

/// A shell block's commands: continuation lines joined, comments and
/// blank lines dropped.
fn commands_of(block: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = match line.find("   #") {
            Some(at) => &line[..at],
            None => line,
        }
        .trim_end();
        if let Some(continued) = line.strip_suffix('\\') {
            current.push_str(continued);
            continue;
        }
        current.push_str(line);
        if !current.trim().is_empty() {
            commands.push(current.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        current.clear();
    }
    commands
}

/// docs/operating.md's operator command list, every line run with each
/// flag it names against a seeded ledger, through the CLI the page
/// documents (the default database URL is the test's).
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_operator_commands_the_docs_list_run_with_every_flag_they_name(
    pool: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    use leasegate::ledger::UnknownCause;
    let db = common::TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("worker-1", 600_000).await;
    let unknown = db
        .claim(
            &lease,
            &common::intents::unplanned_charge(lease.run_id, 500, "eur"),
            "proxy-1",
            60_000,
        )
        .await;
    db.holder_marks_unknown(&unknown, UnknownCause::TimedOut, &serde_json::json!({}))
        .await;
    let settled = db
        .claim(
            &lease,
            &common::intents::unplanned_charge(lease.run_id, 700, "eur"),
            "proxy-1",
            60_000,
        )
        .await;
    db.settle_succeeded(&settled, Some("ch_7"), &serde_json::json!({"content": []}))
        .await;
    let (failover,): (i64,) = sqlx::query_as(
        "SELECT failover_id FROM failover_record('test', '1', NULL, 1, 2, NULL, '0/10')",
    )
    .fetch_one(&db.admin)
    .await
    .unwrap();
    let spare = db.pending_run().await;
    let free = db.pending_run().await;

    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/operating.md")).unwrap();
    let (block, _) = common::files::block_and_next(&page, "sh", "leasegate ops show");
    // Compared as sets: the test runs them in an order that leaves each
    // something to act on (a retry before the resolution).
    let mut documented = commands_of(&block);
    documented.sort();
    let mut listed: Vec<&str> = OPERATOR_COMMANDS.iter().map(|(line, _, _)| *line).collect();
    listed.sort();
    assert_eq!(
        documented, listed,
        "docs/operating.md's operator commands changed: update OPERATOR_COMMANDS to run each"
    );
    let binaries = Path::new(common::proxy::LEASEGATE).parent().unwrap();
    let path = format!("{}:{}", binaries.display(), std::env::var("PATH").unwrap());
    for (line, run, expected) in OPERATOR_COMMANDS {
        // Each flag the line names (of `--a|--b`, one of them) is run.
        for word in line
            .split([' ', '[', ']'])
            .filter(|word| word.starts_with("--"))
        {
            assert!(
                word.split('|')
                    .any(|flag| run.split_whitespace().any(|w| w == flag)),
                "{line}: the test runs no {word}"
            );
        }
        let output = tokio::time::timeout(
            common::DEADLINE,
            tokio::process::Command::new("bash")
                .args(["-euo", "pipefail", "-c", run])
                .env_remove("DATABASE_URL")
                .env_remove("LEASEGATE_DATABASE_URL")
                .env("LEASEGATE_DEFAULT_DATABASE_URL", &db.url)
                .env("PATH", &path)
                .env("RUN", lease.run_id.to_string())
                .env("OP", unknown.operation_id.as_str())
                .env("SETTLED", settled.operation_id.as_str())
                .env("SPARE", spare.to_string())
                .env("FREE", free.to_string())
                .env("FAILOVER", failover.to_string())
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{line}: did not finish"))
        .unwrap();
        assert_eq!(
            output.status.code(),
            Some(*expected),
            "{line}\nran: {run}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let resolved = db.operation_view(&unknown.operation_id).await;
    assert_eq!(
        resolved.operation.status.as_str(),
        "succeeded",
        "{resolved:?}"
    );
}

/// docs/operating.md's token commands, as written, against a leasegate
/// whose control API requires tokens (the page's address and database are
/// the test's): the minted token reads a run of its tenant, the listing
/// names it without its secret, and once revoked it is refused.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_token_commands_the_docs_give_mint_use_list_and_revoke(
    pool: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let db = common::TestDb::new(pool, connect).await;
    let scenario = common::proxy::Scenario::new(&db.url, "");
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        common::replace_exactly(&config, "tenant = \"tenant-a\"", "tenant = \"quickstart\""),
    )
    .unwrap();
    scenario.surround_config("", "[auth]\nmode = \"required\"\n");
    let proxy = common::proxy::RunningProxy::start(&scenario.config_path()).await;
    let run = db.pending_run_in("quickstart").await;

    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/operating.md")).unwrap();
    let (block, _) = common::files::block_and_next(&page, "sh", "TOKEN=$(leasegate tokens create");
    let script = common::replace_exactly(
        &common::replace_exactly(
            &block,
            "postgres://postgres@127.0.0.1:5432/leasegate",
            &db.url,
        ),
        "http://10.0.0.5:8641",
        &proxy.control_url,
    );
    // After the page's commands: the revoked token, tried again.
    let script = format!(
        "{script}echo\ncurl -s -o /dev/null -w '%{{http_code}}' {}/v1/runs/$RUN -H \"authorization: Bearer $TOKEN\"\n",
        proxy.control_url
    );
    let binaries = Path::new(common::proxy::LEASEGATE).parent().unwrap();
    let output = tokio::time::timeout(
        common::DEADLINE,
        tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .env_remove("DATABASE_URL")
            .env_remove("LEASEGATE_DATABASE_URL")
            .env(
                "PATH",
                format!("{}:{}", binaries.display(), std::env::var("PATH").unwrap()),
            )
            .env("RUN", run.to_string())
            .output(),
    )
    .await
    .expect("the page's token commands finish")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // The run, read with the new token (curl prints no newline after it).
    assert!(
        lines[0].starts_with("{\"active\":true,")
            && lines[0].contains(&format!("\"run_id\":\"{run}\"")),
        "{stdout}"
    );
    // The listing: a header and the token, named, without its secret.
    assert!(lines[0].ends_with("REVOKED"), "{stdout}");
    let row = lines[1].split_whitespace().collect::<Vec<_>>();
    assert_eq!(&row[1..4], ["quickstart", "agent", "worker-1"], "{stdout}");
    assert!(!stdout.contains("lgt_"), "a secret was printed: {stdout}");
    assert_eq!(lines[2], format!("token {} revoked", row[0]), "{stdout}");
    // Revoked: refused.
    assert_eq!(lines.last().unwrap().trim(), "401", "{stdout}");
    proxy.stop().await;
}

/// docs/adapters-and-policies.md's "Front your own MCP server": `init`
/// in front of the example tools, `check-config` and `serve` of what it
/// wrote (on the test's database), the served tools listed through it;
/// then `init` in front of the pinned server-everything (the page's `npx`
/// line, with the suite's installed copy of that version) reports what the
/// page says it reports.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_front_your_own_server_commands_init_check_and_serve(
    pool: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let _exclusive = common::exclusive().await;
    let db = common::TestDb::new(pool, connect).await;
    let page =
        std::fs::read_to_string(Path::new(ROOT).join("docs/adapters-and-policies.md")).unwrap();
    let (init, _) = common::files::block_and_next(&page, "sh", "leasegate init --dir my-proxy");
    let (check_and_serve, _) =
        common::files::block_and_next(&page, "sh", "leasegate check-config my-proxy");
    let (everything, _) =
        common::files::block_and_next(&page, "sh", "leasegate init --dir everything");
    let root = scratch_root();
    let binaries = Path::new(common::proxy::LEASEGATE).parent().unwrap();
    let path = format!("{}:{}", binaries.display(), std::env::var("PATH").unwrap());
    let bash = |script: &str| {
        let mut command = tokio::process::Command::new("bash");
        command
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(&root)
            .env_remove("DATABASE_URL")
            .env_remove("LEASEGATE_DATABASE_URL")
            .env_remove("RUST_LOG")
            .env("LEASEGATE_DEFAULT_DATABASE_URL", &db.url)
            .env("PATH", &path);
        command
    };
    let run = |script: String| {
        let mut command = bash(&script);
        async move {
            let output =
                tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
                    .await
                    .unwrap_or_else(|_| panic!("{script}: did not finish"))
                    .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "{script}\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            stdout
        }
    };
    run(init).await;
    let mut commands = commands_of(&check_and_serve).into_iter();
    let check = commands.next().unwrap();
    let serve = commands.next().unwrap();
    assert_eq!(commands.next(), None, "{check_and_serve}");
    let checked = run(check).await;
    assert!(checked.starts_with("ok "), "{checked}");

    let mut command = bash(&format!("exec {serve}"));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut served = Leasegate::spawn(command);
    let line = served.line("serving MCP at ", START_DEADLINE).await;
    let url = line
        .split("serving MCP at ")
        .nth(1)
        .unwrap()
        .trim()
        .to_owned();
    let (agent, _) = common::proxy::connect_http(&url, None).await;
    let mut tools = common::proxy::tool_names(&agent).await;
    tools.sort();
    assert_eq!(tools, ["payments__charge", "payments__get_charge"]);
    drop(agent);
    served.signal(nix::sys::signal::Signal::SIGTERM);
    let status = served.exit(STOP_DEADLINE).await;
    assert!(status.success(), "{status}: {}", served.stderr());

    // The suite's copy of the pinned server-everything stands for `npx -y`.
    let pinned = "npx -y @modelcontextprotocol/server-everything@2026.8.31";
    let installed = format!("node {}", common::peers::server_everything().display());
    let printed = run(common::replace_exactly(&everything, pinned, &installed)).await;
    let reported = page
        .split("```sh\nleasegate init --dir everything")
        .nth(1)
        .and_then(|rest| rest.split("reports `").nth(1))
        .and_then(|rest| rest.split('`').next())
        .expect("the page says what the everything init reports")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        printed.contains(&format!("): {reported}\n")),
        "the page says {reported:?}; init printed:\n{printed}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Each command line of docs/benchmarks.md's block and of docs/testing.md's
/// chaos block, and the short round the test runs for it: the same program
/// and every flag the line names, with small numbers (`$DB` is a database
/// name of the test's, `$ADMIN` the server's admin URL). The release build
/// the lines start with is the suite's debug build (`target/release` links
/// to it, as in the quickstart test).
const BENCHMARK_COMMANDS: &[(&str, &str)] = &[
    (
        "cargo build --release --bins --example bench_gateway && target/release/examples/bench_gateway",
        "target/release/examples/bench_gateway --quick --callers 1 --duration 1 \
         --upstream example-tools --db-prefix ${DB}_gateway",
    ),
    (
        "cargo run --release --example bench_ledger",
        "target/release/examples/bench_ledger 20 ${ADMIN%/*}/${DB}_ledger",
    ),
    (
        "cargo run --release --example bench_operations",
        "LEASEGATE_BENCH_DB=${DB}_operations target/release/examples/bench_operations 1 $ADMIN",
    ),
    (
        "cargo build --release --bins --example bench_latency && target/release/examples/bench_latency",
        "target/release/examples/bench_latency 20 $ADMIN 2 2",
    ),
    (
        "bench/sql-ab.sh A_DIR B_DIR [ROUNDS] [CLIENTS] [SECONDS]",
        "SQL_AB_DB_PREFIX=${DB}_sqlab bench/sql-ab.sh . . 1 1 1",
    ),
    (
        "bench/pinned.sh target/release/examples/bench_gateway …",
        "bench/pinned.sh true",
    ),
    (
        "cargo run --release --example bench_scale -- scale --rows 10000,10000000",
        "target/release/examples/bench_scale scale --rows 100 --clients 1 --seconds 1 --repeat 1 \
         --db ${DB}_scale --url $ADMIN",
    ),
    (
        "cargo run --release --example bench_scale -- renew --leases 10000 --hosts 4",
        "target/release/examples/bench_scale renew --leases 10 --rounds 1 --hosts 2 \
         --db ${DB}_renew --url $ADMIN",
    ),
    // Run with small counts by `duplicates::retries_under_faults_…`.
    (
        "bench/duplicates/run.sh --intents 2000 --agents 48 --seed 7",
        "",
    ),
    // Run with small counts by `duplicates::a_re_planning_agent_…`.
    (
        "bench/duplicates/run.sh --retry replan --intents 2000 --agents 48 --seed 7",
        "",
    ),
    ("cargo build --release --bins --example chaos", ""),
    (
        "target/release/examples/chaos --intents 10000 --proxies 3 --agents 12 --seed 10",
        "target/release/examples/chaos --intents 30 --proxies 1 --agents 2 --seed 10",
    ),
];

/// Drops, when dropped (also when the test fails), every database whose
/// name starts with its prefix: what the benchmarks made.
struct DropDatabases(String);

impl Drop for DropDatabases {
    fn drop(&mut self) {
        let sql = format!(
            "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', datname) \
               FROM pg_database WHERE datname LIKE '{}%' \\gexec\n",
            self.0
        );
        let _ = std::process::Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qX"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child.stdin.take().unwrap().write_all(sql.as_bytes())?;
                child.wait()
            });
    }
}

/// Every benchmark command the docs give, a short round each: they start,
/// measure and finish (their figures are not judged here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_benchmark_command_the_docs_give_runs_a_short_round() {
    let _exclusive = common::exclusive().await;
    let mut documented = Vec::new();
    for (page, starts) in [
        (
            "docs/benchmarks.md",
            "cargo build --release --bins --example bench_gateway",
        ),
        (
            "docs/testing.md",
            "cargo build --release --bins --example chaos",
        ),
    ] {
        let text = std::fs::read_to_string(Path::new(ROOT).join(page)).unwrap();
        let (block, _) = common::files::block_and_next(&text, "sh", starts);
        documented.extend(commands_of(&block));
    }
    // The lines without their trailing comments' alignment.
    let documented: Vec<String> = documented
        .iter()
        .map(|line| match line.split_once(" # ") {
            Some((command, _)) => command.trim_end().to_owned(),
            None => line.clone(),
        })
        .collect();
    let listed: Vec<&str> = BENCHMARK_COMMANDS.iter().map(|(line, _)| *line).collect();
    assert_eq!(
        documented, listed,
        "the docs' benchmark commands changed: update BENCHMARK_COMMANDS to run each"
    );

    let root = scratch_root();
    std::os::unix::fs::symlink(Path::new(ROOT).join("bench"), root.join("bench")).unwrap();
    for tree in ["migrations", "sql", "src"] {
        std::os::unix::fs::symlink(Path::new(ROOT).join(tree), root.join(tree)).unwrap();
    }
    let database = format!("bench_docs_{}", uuid::Uuid::new_v4().simple());
    let _dropped = DropDatabases(database.clone());
    let admin = "postgres://postgres@127.0.0.1:5432/postgres";
    for (line, run) in BENCHMARK_COMMANDS {
        // The program's own flags, not cargo's.
        let program = match (line.split_once(" && "), line.split_once(" -- ")) {
            (Some((_, program)), _) | (None, Some((_, program))) => program,
            _ if line.starts_with("cargo ") => "",
            _ => line,
        };
        // An empty entry: a build line, or a command another test runs.
        if run.is_empty() {
            continue;
        }
        for word in program
            .split([' ', '[', ']'])
            .filter(|w| w.starts_with("--"))
        {
            assert!(
                run.split_whitespace().any(|w| w == word),
                "{line}: the test runs no {word}"
            );
        }
        let output = tokio::time::timeout(
            std::time::Duration::from_secs(300),
            tokio::process::Command::new("bash")
                .args(["-euo", "pipefail", "-c", run])
                .current_dir(&root)
                .env("DB", &database)
                .env("ADMIN", admin)
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{run}: did not finish"))
        .unwrap();
        assert!(
            output.status.success(),
            "{line}\nran: {run}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
