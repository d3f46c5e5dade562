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
