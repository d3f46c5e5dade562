//! `leasegate init` against the example tool server, over stdio and
//! Streamable HTTP: the files it writes, what it marks read-only, what it
//! recognises, that `check-config` accepts the result, and its refusals.
//! Needs no database.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use leasegate::adapter::{Adapter, Capability, RawAdapter};
use leasegate::config::{Config, EnvValue, RawConfig, RawUpstream};

const LEASEGATE: &str = env!("CARGO_BIN_EXE_leasegate");
const TOOLS: &str = env!("CARGO_BIN_EXE_leasegate-example-tools");

fn scratch() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("leasegate-init-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn leasegate(args: &[&str]) -> Output {
    Command::new(LEASEGATE)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn adapter(dir: &Path, name: &str) -> (String, Adapter) {
    let text = std::fs::read_to_string(dir.join("adapters").join(format!("{name}.toml"))).unwrap();
    let raw: RawAdapter = toml::from_str(&text).unwrap();
    (text.clone(), raw.validate().unwrap())
}

/// The adapter text of one tool's table.
fn section<'a>(text: &'a str, tool: &str) -> &'a str {
    let start = text
        .find(&format!("[tools.{tool}]\n"))
        .unwrap_or_else(|| panic!("no [tools.{tool}] in\n{text}"));
    let rest = &text[start..];
    let end = rest[1..].find("\n[tools.").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// `leasegate init --dir out --name shop` over the example tool server's
/// `tools`, recording into `state`.
fn init_shop(out: &Path, tools: &str, state: &Path) -> Output {
    leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--name",
        "shop",
        "--",
        TOOLS,
        "--tools",
        tools,
        "--state-dir",
        state.to_str().unwrap(),
    ])
}

fn check_config(dir: &Path) {
    let config = dir.join("leasegate.toml");
    let checked = leasegate(&["check-config", config.to_str().unwrap()]);
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));
    assert!(
        String::from_utf8_lossy(&checked.stdout).contains("ok   "),
        "{}",
        text(&checked)
    );
}

#[test]
fn init_over_stdio_writes_what_check_config_accepts() {
    let dir = scratch();
    let state = dir.join("state");
    let out = dir.join("out");
    let init = init_shop(&out, "all", &state);
    assert_eq!(init.status.code(), Some(0), "{}", text(&init));
    let stdout = String::from_utf8_lossy(&init.stdout);
    assert!(
        stdout.contains("upstream shop (command `")
            && stdout.contains("4 tools, 2 read-only by annotation, 2 side-effecting"),
        "{}",
        text(&init)
    );
    for file in [
        "leasegate.toml",
        "policies/default.toml",
        "adapters/shop.toml",
    ] {
        assert!(out.join(file).is_file(), "{file}: {}", text(&init));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(out.join(file)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{file}: the owner's alone");
        assert!(stdout.contains(&format!("wrote {}", out.join(file).display())));
    }

    // The config: defaults, and the upstream as given.
    let raw: RawConfig =
        toml::from_str(&std::fs::read_to_string(out.join("leasegate.toml")).unwrap()).unwrap();
    assert_eq!(raw.tenant.as_deref(), Some("default"));
    // No database_url: a server at the default, else a private PostgreSQL.
    assert_eq!(raw.database_url, None);
    assert_eq!(raw.adapters.as_deref(), Some("adapters"));
    assert_eq!(raw.policy.as_deref(), Some("policies/default.toml"));
    assert_eq!(
        raw.upstreams["shop"],
        RawUpstream::Stdio {
            command: TOOLS.into(),
            args: vec![
                "--tools".into(),
                "all".into(),
                "--state-dir".into(),
                state.to_str().unwrap().into()
            ],
            env: Default::default(),
        }
    );
    assert_eq!(
        std::fs::read_to_string(out.join("policies/default.toml")).unwrap(),
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/default.toml")
        )
        .unwrap()
    );

    // The adapter: every tool of every page (the server lists one a page).
    let (text, adapter) = adapter(&out, "shop");
    assert_eq!(adapter.upstream, "shop");
    let names: Vec<&str> = adapter.tools.keys().map(String::as_str).collect();
    assert_eq!(names, ["charge", "get_charge", "mail_stats", "send_email"]);
    // The example server annotates get_charge and mail_stats readOnlyHint = true.
    for tool in ["get_charge", "mail_stats"] {
        assert!(adapter.tools[tool].read_only, "{tool}");
        assert!(
            section(&text, tool).contains("That is its claim, not a proof"),
            "{text}"
        );
    }
    for tool in ["charge", "send_email"] {
        assert!(!adapter.tools[tool].read_only, "{tool}");
        assert_eq!(adapter.tools[tool].capability, Capability::None, "{tool}");
    }
    let charge = section(&text, "charge");
    assert!(
        charge.contains(
            "# Charge a card. Honours idempotency_key: the same key returns the same charge.\n"
        ),
        "{charge}"
    );
    assert!(
        charge.contains("its argument \"idempotency_key\" looks like an idempotency key"),
        "{charge}"
    );
    assert!(
        charge.contains("# operation_id_argument = \"idempotency_key\""),
        "{charge}"
    );
    assert!(
        charge.contains("# A query_tool candidate: get_charge (read-only)."),
        "{charge}"
    );
    assert!(
        charge.contains(
            "# The server says readOnlyHint = false, destructiveHint = false, idempotentHint = true."
        ),
        "{charge}"
    );
    // send_email has no key argument: the generic suggestion.
    let send = section(&text, "send_email");
    assert!(
        send.contains("# operation_id_argument = \"<key argument>\""),
        "{send}"
    );

    check_config(&out);
    let config = Config::load(&out.join("leasegate.toml")).unwrap();
    assert_eq!(config.adapters["shop"].tools.len(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The example tool server over Streamable HTTP, killed on drop.
struct HttpTools {
    child: Child,
    url: String,
}

impl HttpTools {
    fn start(tools: &str, state: &Path) -> Self {
        let mut child = Command::new(TOOLS)
            .args(["--tools", tools, "--http", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let url = stderr
            .lines()
            .map_while(Result::ok)
            .find_map(|line| {
                line.strip_prefix("example tools at ")
                    .map(|url| url.trim().to_owned())
            })
            .expect("the example tools print their URL");
        Self { child, url }
    }
}

impl Drop for HttpTools {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn init_over_http_and_stdio_together_names_both_upstreams() {
    let dir = scratch();
    let state = dir.join("state");
    let server = HttpTools::start("payments", &state);
    let out = dir.join("out");
    // A bare command name is found beside the leasegate executable, as
    // `serve` finds it, and is written as given.
    let provisioner = format!(
        "buckets=leasegate-example-tools --tools provisioner --state-dir {}",
        state.display()
    );
    let init = leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--name",
        "pay",
        "--url",
        &server.url,
        "--stdio",
        &provisioner,
    ]);
    assert_eq!(init.status.code(), Some(0), "{}", text(&init));
    let stdout = String::from_utf8_lossy(&init.stdout);
    assert!(
        stdout.contains(&format!(
            "upstream pay (URL {}): 2 tools, 1 read-only",
            server.url
        )),
        "{}",
        text(&init)
    );
    assert!(
        stdout.contains("upstream buckets (command `leasegate-example-tools --tools provisioner"),
        "{}",
        text(&init)
    );

    let raw: RawConfig =
        toml::from_str(&std::fs::read_to_string(out.join("leasegate.toml")).unwrap()).unwrap();
    assert_eq!(
        raw.upstreams["pay"],
        RawUpstream::StreamableHttp {
            url: server.url.clone()
        }
    );
    match &raw.upstreams["buckets"] {
        RawUpstream::Stdio { command, .. } => assert_eq!(command, "leasegate-example-tools"),
        other => panic!("{other:?}"),
    }

    let (pay_text, pay) = adapter(&out, "pay");
    assert!(pay.tools["get_charge"].read_only);
    assert_eq!(pay.tools["charge"].capability, Capability::None);
    assert!(
        section(&pay_text, "charge")
            .contains("its argument \"idempotency_key\" looks like an idempotency key"),
        "{pay_text}"
    );

    let (text, buckets) = adapter(&out, "buckets");
    assert!(buckets.tools["get_bucket"].read_only);
    assert!(!buckets.tools["create_bucket"].read_only);
    assert_eq!(buckets.tools["create_bucket"].capability, Capability::None);
    let create = section(&text, "create_bucket");
    for line in [
        "# A query_tool candidate: get_bucket (read-only).",
        "# capability = \"resource_id\"",
        "# resource_id_pointer = \"/name\"",
        "# query_tool = \"get_bucket\"",
        "# query_argument = \"name\"",
        "# match_fields = [\"region\", \"size\"]",
        "# Arguments: name (required), region, size",
    ] {
        assert!(create.contains(line), "{line} in\n{create}");
    }

    check_config(&out);
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn init_refuses_to_overwrite_without_force() {
    let dir = scratch();
    let state = dir.join("state");
    let args = |force: bool| {
        let mut args = vec![
            "init".to_owned(),
            "--dir".into(),
            dir.join("out").to_str().unwrap().into(),
            "--name".into(),
            "shop".into(),
        ];
        if force {
            args.push("--force".into());
        }
        args.extend([
            "--".into(),
            TOOLS.into(),
            "--tools".into(),
            "payments".into(),
            "--state-dir".into(),
            state.to_str().unwrap().into(),
        ]);
        args
    };
    let run = |force: bool| {
        let args = args(force);
        leasegate(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let first = run(false);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let adapter_file = dir.join("out/adapters/shop.toml");
    std::fs::write(&adapter_file, "# edited by hand\n").unwrap();

    let again = run(false);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("leasegate.toml")
            && stderr.contains("already exist")
            && stderr.contains("--force"),
        "{}",
        text(&again)
    );
    assert_eq!(
        std::fs::read_to_string(&adapter_file).unwrap(),
        "# edited by hand\n"
    );

    let forced = run(true);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced));
    assert!(
        std::fs::read_to_string(&adapter_file)
            .unwrap()
            .contains("[tools.charge]")
    );
    check_config(&dir.join("out"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn init_names_a_command_or_url_it_cannot_reach_and_writes_nothing() {
    let dir = scratch();
    let out = dir.join("out");
    let missing = dir.join("no-such-server");
    let init = leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--name",
        "files",
        "--",
        missing.to_str().unwrap(),
        "--flag",
    ]);
    assert_eq!(init.status.code(), Some(1), "{}", text(&init));
    let stderr = String::from_utf8_lossy(&init.stderr);
    assert!(
        stderr.contains("upstream files: cannot start")
            && stderr.contains(missing.to_str().unwrap())
            && stderr.contains("No such file"),
        "{}",
        text(&init)
    );
    // A bare name that is nowhere on PATH.
    let init = leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--stdio",
        "files=leasegate-no-such-server-anywhere --root /tmp",
    ]);
    assert_eq!(init.status.code(), Some(1), "{}", text(&init));
    assert!(
        String::from_utf8_lossy(&init.stderr)
            .contains("command `leasegate-no-such-server-anywhere --root /tmp`"),
        "{}",
        text(&init)
    );
    // A command that starts but dies before the handshake: its stderr is quoted.
    let init = leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--name",
        "dies",
        "--",
        "sh",
        "-c",
        "echo 'npm error 404 Not Found' >&2; exit 3",
    ]);
    assert_eq!(init.status.code(), Some(1), "{}", text(&init));
    let stderr = String::from_utf8_lossy(&init.stderr);
    assert!(
        stderr.contains("upstream dies: cannot start")
            && stderr.contains("exit status: 3")
            && stderr.contains("its stderr: npm error 404 Not Found"),
        "{}",
        text(&init)
    );
    // A URL nothing answers at.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let init = leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--http",
        &format!("api={url}"),
    ]);
    assert_eq!(init.status.code(), Some(1), "{}", text(&init));
    assert!(
        String::from_utf8_lossy(&init.stderr).contains(&format!("URL {url}")),
        "{}",
        text(&init)
    );
    assert!(!out.exists(), "nothing written");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn init_refuses_bad_arguments_with_exit_2() {
    let dir = scratch();
    let out = dir.join("out");
    let out = out.to_str().unwrap();
    for (args, expected) in [
        (vec!["init", "--dir", out], "no upstream given"),
        (
            vec!["init", "--dir", out, "--", "server"],
            "--name NAME is needed",
        ),
        (
            vec!["init", "--dir", out, "--name", "x"],
            "give the upstream's command",
        ),
        (
            vec![
                "init",
                "--dir",
                out,
                "--name",
                "x",
                "--url",
                "ftp://host/mcp",
            ],
            "is not an http(s) URL",
        ),
        (
            vec![
                "init",
                "--dir",
                out,
                "--name",
                "a__b",
                "--url",
                "http://h/mcp",
            ],
            "namespace separator",
        ),
        (
            vec![
                "init",
                "--dir",
                out,
                "--http",
                "a=http://h/mcp",
                "--http",
                "a=http://i/mcp",
            ],
            "given twice",
        ),
        (
            vec!["init", "--dir", out, "--stdio", "nocommand"],
            "expected NAME=COMMAND",
        ),
    ] {
        let init = leasegate(&args);
        assert_eq!(init.status.code(), Some(2), "{args:?}: {}", text(&init));
        assert!(
            String::from_utf8_lossy(&init.stderr).contains(expected),
            "{args:?}: {}",
            text(&init)
        );
    }
    assert!(!Path::new(out).exists(), "nothing written");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The "Front your own MCP server" commands of docs/adapters-and-policies.md,
/// run as written (from a scratch directory), print what the page says they
/// print.
#[test]
fn the_readme_walkthrough_prints_what_the_readme_shows() {
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/adapters-and-policies.md"),
    )
    .unwrap();
    let section = readme
        .split("\n## Front your own MCP server\n")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let block = |fence: &str, starts: &str| -> String {
        section
            .split(fence)
            .skip(1)
            .map(|rest| rest.split("```").next().unwrap())
            .find(|body| body.starts_with(starts))
            .unwrap_or_else(|| panic!("a {fence} block starting {starts:?}"))
            .to_owned()
    };
    let command = block("```sh\n", "leasegate init");
    let expected = block("```text\n", "upstream ");
    let snippet = block("```toml\n", "[tools.charge]");

    let dir = scratch();
    // `leasegate init …` with the built binary, from `dir`.
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[0], "leasegate");
    let init = Command::new(LEASEGATE)
        .args(&words[1..])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(init.status.code(), Some(0), "{}", text(&init));
    // A default port another process holds is replaced and said so (the
    // page mentions it below the block): compare the rest.
    let printed = String::from_utf8_lossy(&init.stdout);
    let printed: String = printed
        .lines()
        .filter(|line| !line.contains(" is taken: "))
        .map(
            |line| match line.strip_prefix("and point your MCP client at ") {
                Some(_) => "and point your MCP client at http://127.0.0.1:8640/mcp\n".to_owned(),
                None => format!("{line}\n"),
            },
        )
        .collect();
    assert_eq!(printed, expected);

    let adapter = std::fs::read_to_string(dir.join("my-proxy/adapters/payments.toml")).unwrap();
    let shown = snippet.trim_end().trim_end_matches("# …").trim_end();
    assert!(adapter.contains(shown), "{shown}\nnot in\n{adapter}");

    let checked = Command::new(LEASEGATE)
        .args(["check-config", "my-proxy/leasegate.toml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));
    assert!(section.contains(&format!(
        "# prints: {}",
        String::from_utf8_lossy(&checked.stdout).trim_end()
    )));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A taken default port is replaced by a free one (said so); a second
/// `init` into the same directory adds its upstream to the file, keeping
/// the rest, with `--env` values written as given or, for names that look
/// secret, as references (the value only reaches the server being
/// listed); adding a name the file has is refused unless `--force`.
#[test]
fn init_adds_upstreams_to_its_directory_with_secrets_as_references_and_free_ports() {
    let dir = scratch();
    let out = dir.join("out");
    let state = dir.join("state");
    // 8640 is taken: by this test, or by whoever holds it already.
    let _held = std::net::TcpListener::bind("127.0.0.1:8640");
    let first = init_shop(&out, "payments", &state);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let config_file = out.join("leasegate.toml");
    let written = std::fs::read_to_string(&config_file).unwrap();
    let raw: RawConfig = toml::from_str(&written).unwrap();
    let listen = raw.listen.clone().unwrap();
    assert_ne!(listen, "127.0.0.1:8640");
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(
        stdout.contains(&format!(
            "127.0.0.1:8640 is taken: listen = \"{listen}\" written instead"
        )) && stdout.contains(&format!("and point your MCP client at http://{listen}/mcp")),
        "{}",
        text(&first)
    );
    let shop_adapter = std::fs::read_to_string(out.join("adapters/shop.toml")).unwrap();

    // The second upstream lists its tools only if it got the secret's value
    // (checked by its length, so that the command does not hold it).
    let script = format!(
        "test ${{#API_TOKEN}} -eq 6 && exec {TOOLS} --tools mailer --state-dir {}",
        state.display()
    );
    let add = |force: bool| {
        let mut args = vec!["init", "--dir", out.to_str().unwrap(), "--name", "mail"];
        if force {
            args.push("--force");
        }
        args.extend([
            "--env",
            "API_TOKEN=s3cret",
            "--env",
            "LOG_LEVEL=debug",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        leasegate(&args)
    };
    let added = add(false);
    assert_eq!(added.status.code(), Some(0), "{}", text(&added));
    let stdout = String::from_utf8_lossy(&added.stdout);
    assert!(
        stdout.contains(
            "env API_TOKEN: not written; read from leasegate's environment variable API_TOKEN"
        ),
        "{}",
        text(&added)
    );
    let text_after = std::fs::read_to_string(&config_file).unwrap();
    assert!(
        text_after.starts_with(&written),
        "the file as it was, then:\n{text_after}"
    );
    assert!(!text_after.contains("s3cret"), "{text_after}");
    let raw: RawConfig = toml::from_str(&text_after).unwrap();
    assert_eq!(raw.upstreams.len(), 2);
    let RawUpstream::Stdio { env, .. } = &raw.upstreams["mail"] else {
        panic!("mail is stdio: {text_after}");
    };
    assert_eq!(env["API_TOKEN"], EnvValue::from_env("API_TOKEN"));
    assert_eq!(env["LOG_LEVEL"], EnvValue::Text("debug".into()));
    let (_, mail) = adapter(&out, "mail");
    assert!(mail.tools.contains_key("send_email"));
    assert_eq!(
        std::fs::read_to_string(out.join("adapters/shop.toml")).unwrap(),
        shop_adapter
    );
    check_config(&out);

    // The same name again: refused, nothing changed; with --force, that
    // upstream alone is replaced.
    let again = add(false);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("upstream \"mail\" already exists in"),
        "{}",
        text(&again)
    );
    assert_eq!(std::fs::read_to_string(&config_file).unwrap(), text_after);
    let forced = add(true);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced));
    let text_forced = std::fs::read_to_string(&config_file).unwrap();
    assert_eq!(
        text_forced.matches("[upstreams.mail]").count(),
        1,
        "{text_forced}"
    );
    assert_eq!(
        text_forced.matches("[upstreams.shop]").count(),
        1,
        "{text_forced}"
    );
    check_config(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--database-url` names the new config's ledger: `embedded` (the
/// private cluster always) or a PostgreSQL URL, written uncommented and
/// accepted by `check-config`; anything else, or the flag when adding to
/// an existing config, is refused (exit 2) with nothing written.
#[test]
fn init_writes_the_ledger_it_is_given_embedded_or_a_url() {
    let dir = scratch();
    let state = dir.join("state");
    for (sub, url) in [
        ("private", "embedded"),
        ("server", "postgres://ledger@db.internal:5432/leasegate"),
    ] {
        let out = dir.join(sub);
        let init = leasegate(&[
            "init",
            "--dir",
            out.to_str().unwrap(),
            "--database-url",
            url,
            "--name",
            "shop",
            "--",
            TOOLS,
            "--tools",
            "payments",
            "--state-dir",
            state.to_str().unwrap(),
        ]);
        assert_eq!(init.status.code(), Some(0), "{}", text(&init));
        let written = std::fs::read_to_string(out.join("leasegate.toml")).unwrap();
        assert!(
            written
                .lines()
                .any(|line| line == format!("database_url = \"{url}\"")),
            "{written}"
        );
        let raw: RawConfig = toml::from_str(&written).unwrap();
        assert_eq!(raw.database_url.as_deref(), Some(url));
        let checked = leasegate(&["check-config", out.join("leasegate.toml").to_str().unwrap()]);
        assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));
    }
    // Adding to an existing config: its database_url is the file's to say.
    let again = leasegate(&[
        "init",
        "--dir",
        dir.join("private").to_str().unwrap(),
        "--database-url",
        "embedded",
        "--stdio",
        &format!("mail={TOOLS} --tools mailer"),
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(
        text(&again).contains("edit its database_url"),
        "{}",
        text(&again)
    );
    // Not PostgreSQL's: refused before anything starts.
    let out = dir.join("mysql");
    let wrong = leasegate(&[
        "init",
        "--dir",
        out.to_str().unwrap(),
        "--database-url",
        "mysql://root@127.0.0.1/ledger",
        "--stdio",
        &format!("mail={TOOLS} --tools mailer"),
    ]);
    assert_eq!(wrong.status.code(), Some(2), "{}", text(&wrong));
    assert!(text(&wrong).contains("embedded"), "{}", text(&wrong));
    assert!(!out.exists(), "nothing written");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `init` twice into a directory named relative to where it runs, as a
/// user types it: the second upstream's adapter lands beside the first one
/// in that directory's `adapters/`, nowhere else.
#[test]
fn init_adds_an_upstream_to_a_relative_directory_beside_the_first() {
    let dir = scratch();
    let state = dir.join("state");
    for (name, tools) in [("shop", "payments"), ("mail", "mailer")] {
        let init = Command::new(LEASEGATE)
            .args(["init", "--dir", "proxy", "--name", name, "--", TOOLS])
            .args(["--tools", tools, "--state-dir", state.to_str().unwrap()])
            .current_dir(&dir)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert_eq!(init.status.code(), Some(0), "{}", text(&init));
    }
    let mut adapters: Vec<String> = std::fs::read_dir(dir.join("proxy/adapters"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    adapters.sort();
    assert_eq!(adapters, ["mail.toml", "shop.toml"]);
    assert!(
        !dir.join("proxy/proxy").exists(),
        "written under proxy/proxy"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
