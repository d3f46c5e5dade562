//! Every shipped configuration file validates, and broken ones get an error
//! naming the file and the field (from the library and from the CLI).

use std::path::{Path, PathBuf};
use std::process::Command;

use leasegate::config::{Config, check_file};

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_shipped_adapter_policy_and_example_file_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["adapters", "policies", "examples"] {
        toml_files(&root.join(dir), &mut files);
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
