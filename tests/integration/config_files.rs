//! Every shipped configuration file validates, and broken ones get an error
//! naming the file and the field (from the library and from the CLI).

use std::path::{Path, PathBuf};
use std::process::Command;

use leasegate::config::{Config, check_file};

#[test]
fn every_shipped_adapter_policy_and_example_file_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["adapters", "policies", "examples"] {
        crate::common::files::with_extension(&root.join(dir), "toml", &mut files);
    }
    assert!(files.len() >= 4, "found the shipped files: {files:?}");
    for file in &files {
        if let Err(error) = check_file(file) {
            panic!("{error}");
        }
    }
    let quickstart = Config::load(&root.join("examples/quickstart/leasegate.toml")).unwrap();
    assert_eq!(quickstart.adapters.len(), 2);
}

fn scratch(files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasegate-config-{}",
        uuid::Uuid::new_v4().simple()
    ));
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// (files to write, the culprit file, the expected message).
type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);

const MAIN: &str =
    "adapters = \"adapters\"\n[upstreams.mail]\ntransport = \"stdio\"\ncommand = \"true\"\n";

#[test]
fn broken_files_name_the_file_and_the_field() {
    // (files to write, the file the error must name, the message it must contain)
    let cases: &[Case] = &[
        (
            &[(
                "c.toml",
                "listen = \"here\"\n[upstreams.a]\ntransport = \"stdio\"\ncommand = \"x\"\n",
            )],
            "c.toml",
            "listen: \"here\" is not an address",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\nnot_done_errors = [{ pointer = \"error.code\", values = [\"busy\"] }]\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.not_done_errors: \"error.code\" is not a JSON pointer",
        ),
        (
            &[("c.toml", "colour = \"blue\"\n")],
            "c.toml",
            "unknown field `colour`",
        ),
        (
            &[("c.toml", "[upstreams.a]\ntransport = \"carrier-pigeon\"\n")],
            "c.toml",
            "unknown variant `carrier-pigeon`",
        ),
        (
            &[("c.toml", "")],
            "c.toml",
            "upstreams: at least one upstream is needed",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"idempotency_key\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.capability: idempotency_key needs operation_id_argument, operation_id_meta or operation_id_header",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\noperation_id_header = \"Idempotency-Key\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.operation_id_header: upstream \"mail\" runs over stdio, which has no HTTP headers",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\noperation_id_header = \"Idem Key\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.operation_id_header: \"Idem Key\" is not an HTTP header name",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\noperation_id_meta = \"k\"\noperation_id_header = \"Idempotency-Key\"\n",
                ),
            ],
            "adapters/mail.toml",
            "give one of operation_id_argument, operation_id_meta, operation_id_header",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\ntimeout = \"soon\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.timeout: \"soon\" is not a duration",
        ),
        (
            &[
                ("c.toml", MAIN),
                ("adapters/mail.toml", "upstream = \"post\"\n"),
            ],
            "adapters/mail.toml",
            "upstream: \"post\" is not an upstream of",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\nread_only = true\ncapability = \"none\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.capability: a read_only tool has no side effect to adapt",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\nidentity = [\"to\"]\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.identity: \"to\" is not a JSON pointer into the arguments",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"idempotency_key\"\noperation_id_argument = \"key\"\nkey_retention = \"1h\"\nidentity = [\"/to\", \"/key\"]\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.identity: \"/key\" is the operation id argument leasegate fills",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\non_rephrase = \"conflict\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.on_rephrase: only with identity",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\nidentity = []\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.identity: name at least one field",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\nresource_id_pointer = \"/name\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.resource_id_pointer: only for capability resource_id",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.make]\ncapability = \"resource_id\"\nresource_id_pointer = \"name\"\nquery_tool = \"get\"\nquery_argument = \"name\"\nmatch_fields = [\"name\"]\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.make.resource_id_pointer: a JSON pointer starts with '/'",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.make]\ncapability = \"operation_query\"\nquery_tool = \"get\"\nquery_argument = \"id\"\ntimeout = \"30s\"\nresend_after_not_found = \"100s\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.make.resend_after_not_found: must be at least the policy's claim_ttl (120s)",
        ),
        (
            &[
                ("c.toml", MAIN),
                (
                    "adapters/mail.toml",
                    "upstream = \"mail\"\n[tools.send]\ncapability = \"none\"\nresend_after_not_found = \"5m\"\n",
                ),
            ],
            "adapters/mail.toml",
            "tools.send.resend_after_not_found: only for capability operation_query or resource_id",
        ),
        (
            &[
                ("c.toml", &format!("policy = \"p.toml\"\n{MAIN}")),
                ("p.toml", "request_body = \"masked\"\n"),
                ("adapters/.keep", ""),
            ],
            "p.toml",
            "masked_fields: \"masked\" needs a non-empty list",
        ),
    ];
    for (files, culprit, message) in cases {
        let dir = scratch(files);
        let error = Config::load(&dir.join("c.toml")).expect_err(message);
        let text = error.to_string();
        assert!(
            error.file.ends_with(culprit),
            "{text}: expected the file {culprit}"
        );
        assert!(text.contains(message), "{text}: expected {message:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn check_config_cli_exits_non_zero_and_names_the_problem() {
    let dir = scratch(&[(
        "adapters/bad.toml",
        "upstream = \"x\"\n[tools.t]\ncapability = \"sometimes\"\n",
    )]);
    let output = Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .arg("check-config")
        .arg(dir.join("adapters/bad.toml"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/default.toml"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("FAIL")
            && stdout.contains("bad.toml")
            && stdout.contains("unknown variant `sometimes`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok   ") && stdout.contains("default.toml (policy)"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("1 of 2 files invalid"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_config_judges_a_file_by_what_it_holds_not_by_its_folder() {
    let dir = scratch(&[
        (
            "conf/strict.toml",
            "claim_ttl = \"1m\"\nreconcile_retries = 5\n",
        ),
        (
            "conf/pay.toml",
            "upstream = \"pay\"\n[tools.charge]\ncapability = \"none\"\n",
        ),
        ("conf/broken-policy.toml", "claim_ttl = \"soon\"\n"),
    ]);
    let output = Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .arg("check-config")
        .arg(dir.join("conf/strict.toml"))
        .arg(dir.join("conf/pay.toml"))
        .arg(dir.join("conf/broken-policy.toml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("strict.toml (policy)"), "{stdout}");
    assert!(stdout.contains("pay.toml (adapter)"), "{stdout}");
    assert!(
        stdout.contains("broken-policy.toml")
            && stdout.contains("claim_ttl: \"soon\" is not a duration"),
        "a policy outside policies/ is checked as a policy: {stdout}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `check-config` with its exit code, stdout and stderr.
fn check_config(files: &[PathBuf]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .arg("check-config")
        .args(files)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_config_refuses_missing_commands_bad_database_urls_and_claims_shorter_than_calls() {
    use std::os::unix::fs::PermissionsExt;
    let adapter = "upstream = \"pay\"\ntimeout = \"2s\"\n[tools.charge]\ncapability = \"none\"\ntimeout = \"30s\"\n";
    let upstream = |command: &str| {
        format!(
            "adapters = \"adapters\"\npolicy = \"policies/p.toml\"\n\
             [upstreams.pay]\ntransport = \"stdio\"\ncommand = \"{command}\"\n"
        )
    };
    let dir = scratch(&[
        ("bin/tools", "#!/bin/sh\n"),
        ("bin/not-executable", "#!/bin/sh\n"),
        ("adapters/pay.toml", adapter),
        ("policies/p.toml", "claim_ttl = \"2m\"\n"),
        ("ok.toml", &upstream("./bin/tools")),
        ("missing.toml", &upstream("./bin/no-such-tool")),
        ("not-executable.toml", &upstream("bin/not-executable")),
        ("directory.toml", &upstream("./bin")),
        ("bare-missing.toml", &upstream("leasegate-no-such-tool")),
        // The bare name found on PATH, as `serve` would spawn it.
        ("bare-on-path.toml", &upstream("sh")),
    ]);
    std::fs::set_permissions(
        dir.join("bin/tools"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        dir.join("bin/not-executable"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let (code, stdout, _) = check_config(&[dir.join("ok.toml"), dir.join("bare-on-path.toml")]);
    assert_eq!(code, Some(0), "{stdout}");

    for (file, expected) in [
        ("missing.toml", "bin/no-such-tool does not exist"),
        (
            "not-executable.toml",
            "bin/not-executable is not executable (mode 644)",
        ),
        ("directory.toml", "bin is not a file"),
        (
            "bare-missing.toml",
            "\"leasegate-no-such-tool\" is found neither beside leasegate (",
        ),
    ] {
        let (code, stdout, stderr) = check_config(&[dir.join(file)]);
        assert_eq!(code, Some(12), "{file}: {stdout}");
        assert!(
            stdout.contains(&format!(
                "FAIL {}: upstreams.pay.command: ",
                dir.join(file).display()
            )) && stdout.contains(expected),
            "{file}: {stdout}"
        );
        assert!(stderr.contains("1 of 1 files invalid"), "{stderr}");
    }

    // The database URL: not a URL, not PostgreSQL; the password is never printed.
    for (url, expected) in [
        ("127.0.0.1:5432/leasegate", "is not a URL"),
        (
            "mysql://root:hunter2@127.0.0.1/leasegate",
            "is not a PostgreSQL URL: the scheme is \"mysql\"",
        ),
        (
            "postgres://postgres:hunter2@127.0.0.1:notaport/x",
            "does not parse",
        ),
    ] {
        let file = dir.join("url.toml");
        std::fs::write(
            &file,
            format!("database_url = \"{url}\"\n{}", upstream("./bin/tools")),
        )
        .unwrap();
        let (code, stdout, _) = check_config(std::slice::from_ref(&file));
        assert_eq!(code, Some(13), "{url}: {stdout}");
        assert!(
            stdout.contains("url.toml: database_url: ") && stdout.contains(expected),
            "{url}: {stdout}"
        );
        assert!(!stdout.contains("hunter2"), "{stdout}");
    }
    for url in [
        "postgres://u@h/db",
        "postgresql://u:p@h:5433/db?sslmode=disable",
    ] {
        let file = dir.join("url.toml");
        std::fs::write(
            &file,
            format!("database_url = \"{url}\"\n{}", upstream("./bin/tools")),
        )
        .unwrap();
        let (code, stdout, _) = check_config(std::slice::from_ref(&file));
        assert_eq!(code, Some(0), "{url}: {stdout}");
    }

    // Claims shorter than the calls they cover: the dispatcher's and the
    // reconciler's, for a tool with its own timeout and for an upstream
    // without an adapter file (the default 30s).
    for (policy, culprit, expected) in [
        (
            "claim_ttl = \"30s\"\n",
            "adapters/pay.toml",
            "tools.charge.timeout: 30s plus a margin of 1s does not fit in the policy's claim_ttl (30s, in ",
        ),
        (
            "reconcile_claim_ttl = \"10s\"\n",
            "adapters/pay.toml",
            "tools.charge.timeout: 30s plus a margin of 1s does not fit in the policy's reconcile_claim_ttl (10s, in ",
        ),
    ] {
        std::fs::write(dir.join("policies/p.toml"), policy).unwrap();
        let (code, stdout, _) = check_config(&[dir.join("ok.toml")]);
        assert_eq!(code, Some(14), "{policy}: {stdout}");
        assert!(
            stdout.contains(&format!("FAIL {}: ", dir.join(culprit).display()))
                && stdout.contains(expected)
                && stdout.contains("policies/p.toml)"),
            "{policy}: {stdout}"
        );
    }
    std::fs::write(
        dir.join("policies/p.toml"),
        "reconcile_claim_ttl = \"20s\"\n",
    )
    .unwrap();
    let no_adapter = dir.join("no-adapter.toml");
    std::fs::write(
        &no_adapter,
        "policy = \"policies/p.toml\"\n[upstreams.mail]\ntransport = \"stdio\"\ncommand = \"sh\"\n",
    )
    .unwrap();
    let (code, stdout, _) = check_config(std::slice::from_ref(&no_adapter));
    assert_eq!(code, Some(14), "{stdout}");
    assert!(
        stdout.contains("no-adapter.toml: upstreams.mail (no adapter file: the default tool timeout): 30s plus a margin of 1s does not fit in the policy's reconcile_claim_ttl (20s"),
        "{stdout}"
    );
    // With claims long enough it is valid, and said to gate every tool.
    std::fs::write(
        dir.join("policies/p.toml"),
        "claim_ttl = \"60s\"\nreconcile_claim_ttl = \"60s\"\n",
    )
    .unwrap();
    let (code, stdout, _) = check_config(std::slice::from_ref(&no_adapter));
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(
        stdout,
        format!(
            "ok   {path} (config)\nnote {path}: upstream \"mail\" has no adapter file: each of its tools is side-effecting with capability \"none\" (every call gated; an unknown outcome waits for an operator)\n",
            path = no_adapter.display()
        )
    );
    // A config whose upstreams all have adapter files gets no note.
    let (code, stdout, _) = check_config(&[dir.join("ok.toml")]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(!stdout.contains("note "), "{stdout}");
    // In key mode the key's lease lasts claim_ttl: within the ceiling.
    std::fs::write(
        dir.join("policies/p.toml"),
        "claim_ttl = \"5m\"\nlease_ttl_ceiling = \"2m\"\n",
    )
    .unwrap();
    let key_mode = dir.join("key.toml");
    std::fs::write(
        &key_mode,
        format!("lease_mode = \"key\"\n{}", upstream("./bin/tools")),
    )
    .unwrap();
    let (code, stdout, _) = check_config(std::slice::from_ref(&key_mode));
    assert_eq!(code, Some(14), "{stdout}");
    assert!(
        stdout.contains("lease_mode = \"key\": a key's lease lasts"),
        "{stdout}"
    );

    // Several files: the first failure's code.
    let (code, stdout, stderr) = check_config(&[
        dir.join("ok.toml"),
        dir.join("missing.toml"),
        dir.join("url.toml"),
    ]);
    assert_eq!(code, Some(12), "{stdout}");
    assert!(stderr.contains("of 3 files invalid"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `check-config` on a config whose upstream and adapter are valid, with
/// the top-level `settings` lines in front: each of `accepted` exits 0,
/// each of `refused` exits 1 and names its message. Returns the scratch
/// directory, its files named `accepted-<i>.toml` and `refused-<i>.toml`.
fn check_top_level_settings(accepted: &[&str], refused: &[(&str, &str)]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let base = "adapters = \"adapters\"\n\
                [upstreams.pay]\ntransport = \"stdio\"\ncommand = \"./bin/tools\"\n";
    let mut files = vec![
        ("bin/tools".to_owned(), "#!/bin/sh\n".to_owned()),
        (
            "adapters/pay.toml".to_owned(),
            "upstream = \"pay\"\n[tools.charge]\ncapability = \"none\"\n".to_owned(),
        ),
    ];
    for (i, settings) in accepted.iter().enumerate() {
        files.push((format!("accepted-{i}.toml"), format!("{settings}{base}")));
    }
    for (i, (settings, _)) in refused.iter().enumerate() {
        files.push((format!("refused-{i}.toml"), format!("{settings}{base}")));
    }
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(name, text)| (name.as_str(), text.as_str()))
        .collect();
    let dir = scratch(&files);
    std::fs::set_permissions(
        dir.join("bin/tools"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    for (i, settings) in accepted.iter().enumerate() {
        let (code, stdout, _) = check_config(&[dir.join(format!("accepted-{i}.toml"))]);
        assert_eq!(code, Some(0), "{settings:?}: {stdout}");
    }
    for (i, (settings, message)) in refused.iter().enumerate() {
        let (code, stdout, _) = check_config(&[dir.join(format!("refused-{i}.toml"))]);
        assert_eq!(code, Some(1), "{settings:?}: {stdout}");
        assert!(
            stdout.contains(message),
            "{settings:?}: expected {message:?} in {stdout}"
        );
    }
    dir
}

#[test]
fn check_config_refuses_group_commit_windows_and_batches_out_of_range() {
    let dir = check_top_level_settings(
        &[
            "group_commit = true\ngroup_commit_window = \"1ms\"\ngroup_commit_max_batch = 32\n\
             group_commit_in_flight = 2\n",
            "group_commit_window = \"0\"\n",
        ],
        &[
            (
                "group_commit_in_flight = 9\n",
                "group_commit_in_flight: must be 1 to 8",
            ),
            (
                "group_commit_window = \"1s\"\n",
                "group_commit_window: must be at most 50ms",
            ),
            (
                "group_commit = true\ngroup_commit_max_batch = 65\n",
                "group_commit_max_batch: must be 1 to 64",
            ),
            (
                "group_commit_max_batch = 0\n",
                "group_commit_max_batch: must be 1 to 64",
            ),
            (
                "group_commit_window = \"soon\"\n",
                "group_commit_window: \"soon\" is not a duration",
            ),
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_config_refuses_worker_threads_out_of_range() {
    let dir = check_top_level_settings(
        &["worker_threads = 1\n", "worker_threads = 1024\n"],
        &[
            (
                "worker_threads = 0\n",
                "worker_threads: must be 1 to 1024, got 0",
            ),
            (
                "worker_threads = 1025\n",
                "worker_threads: must be 1 to 1024, got 1025",
            ),
        ],
    );
    // What `serve` builds its runtime with, read before the file is loaded
    // (a value out of range then stops `serve` at the full load, as above).
    use leasegate::config::{default_worker_threads, read_ahead_worker_threads};
    assert_eq!(read_ahead_worker_threads(&dir.join("accepted-0.toml")), 1);
    assert_eq!(
        read_ahead_worker_threads(&dir.join("accepted-1.toml")),
        1024
    );
    assert_eq!(
        read_ahead_worker_threads(&dir.join("refused-0.toml")),
        default_worker_threads()
    );
    assert_eq!(
        read_ahead_worker_threads(&dir.join("no-such.toml")),
        default_worker_threads()
    );
    std::fs::remove_dir_all(dir).unwrap();
}
