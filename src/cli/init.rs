//! `leasegate init`: a leasegate.toml, the default policy and an adapter
//! skeleton per upstream, written into `--dir` from the tools the upstreams
//! list; into a `--dir` that has a leasegate.toml already, the upstreams are
//! added to it (their tables appended, their adapter files written; a name
//! it has is refused unless `--force`, which replaces that upstream). A new
//! leasegate.toml listens on the default ports, or on free ones in their
//! place when they are taken (said so). Exit 0: written; 2: bad arguments,
//! or a file would be overwritten; 1: an upstream could not be started,
//! reached or listed, or writing failed. Nothing is written until every
//! upstream has answered, and files in the way are refused before any
//! upstream is started; a crash while writing can leave some of the files
//! written (run it again with `--force`).

use std::collections::BTreeMap;

use super::args::InitArgs;
use crate::config::init::{self as skeleton, InitError, InitFile, InitUpstream, Listen};
use crate::config::{EnvValue, RawConfig, RawUpstream, UpstreamTransport};

/// `leasegate init`'s exit codes.
const INIT_UNREACHABLE: u8 = 1;
const INIT_USAGE: u8 = 2;

/// The upstreams `leasegate init` was given, in order, as they go into
/// leasegate.toml; or why not (exit 2).
fn init_upstreams(
    args: &InitArgs,
    cwd: &std::path::Path,
) -> Result<Vec<(String, RawUpstream)>, String> {
    let mut upstreams = Vec::new();
    // A command with a `/` is relative to where init runs, not to --dir:
    // written absolute. A bare name is written as it is.
    let stdio = |command: &str, args: Vec<String>| RawUpstream::Stdio {
        command: if command.contains('/') {
            cwd.join(command).to_string_lossy().into_owned()
        } else {
            command.to_owned()
        },
        args,
        env: Default::default(),
    };
    match (&args.name, &args.url, args.command.split_first()) {
        (Some(_), Some(_), Some(_)) => {
            return Err("give either --url or `-- COMMAND…` with --name, not both".into());
        }
        (Some(name), Some(url), None) => {
            upstreams.push((
                name.clone(),
                RawUpstream::StreamableHttp { url: url.clone() },
            ));
        }
        (Some(name), None, Some((command, rest))) => {
            let mut upstream = stdio(command, rest.to_vec());
            if let RawUpstream::Stdio { env, .. } = &mut upstream {
                for (variable, value) in given_env(args)? {
                    let written = if skeleton::looks_secret(&variable) {
                        EnvValue::from_env(&variable)
                    } else {
                        EnvValue::Text(value)
                    };
                    env.insert(variable, written);
                }
            }
            upstreams.push((name.clone(), upstream));
        }
        (Some(name), None, None) => {
            return Err(format!(
                "--name {name}: give the upstream's command after `--` (stdio) or --url URL (Streamable HTTP)"
            ));
        }
        (None, Some(_), _) | (None, None, Some(_)) => {
            return Err(
                "--name NAME is needed with --url or `-- COMMAND…`: the upstream's name".into(),
            );
        }
        (None, None, None) => {}
    }
    for spec in &args.stdio {
        let (name, command) = spec
            .split_once('=')
            .ok_or_else(|| format!("--stdio {spec:?}: expected NAME=COMMAND ARGS…"))?;
        let mut words = command.split_whitespace().map(str::to_owned);
        let Some(program) = words.next() else {
            return Err(format!("--stdio {spec:?}: the command is empty"));
        };
        upstreams.push((name.to_owned(), stdio(&program, words.collect())));
    }
    for spec in &args.http {
        let (name, url) = spec
            .split_once('=')
            .ok_or_else(|| format!("--http {spec:?}: expected NAME=URL"))?;
        upstreams.push((
            name.to_owned(),
            RawUpstream::StreamableHttp {
                url: url.to_owned(),
            },
        ));
    }
    if !args.env.is_empty() && (args.name.is_none() || args.command.is_empty()) {
        return Err(
            "--env NAME=VALUE goes with the upstream of --name NAME -- COMMAND… (stdio)".into(),
        );
    }
    if let Some(url) = args.database_url.as_deref()
        && url != crate::config::EMBEDDED_DATABASE
        && let Some(why) = crate::ledger::url_problem(url)
    {
        return Err(format!(
            "--database-url {:?} {why} (or \"embedded\" for leasegate's private PostgreSQL)",
            crate::ledger::redacted_url(url)
        ));
    }
    if upstreams.is_empty() {
        return Err("no upstream given: `--name NAME -- COMMAND [ARGS…]`, `--name NAME --url URL`, --stdio NAME=COMMAND or --http NAME=URL".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for (name, upstream) in &upstreams {
        if let Some(why) = crate::config::init::invalid_upstream_name(name) {
            return Err(why);
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("upstream name {name:?} is given twice"));
        }
        if let RawUpstream::StreamableHttp { url } = upstream
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!("upstream {name}: {url:?} is not an http(s) URL"));
        }
    }
    Ok(upstreams)
}

/// The `--env NAME=VALUE` arguments, by name.
fn given_env(args: &InitArgs) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for spec in &args.env {
        let (name, value) = spec
            .split_once('=')
            .filter(|(name, _)| !name.is_empty())
            .ok_or_else(|| format!("--env {spec:?}: expected NAME=VALUE"))?;
        if env.insert(name.to_owned(), value.to_owned()).is_some() {
            return Err(format!("--env {name} is given twice"));
        }
    }
    Ok(env)
}

/// How an upstream is reached, for messages.
fn describe(upstream: &RawUpstream) -> String {
    match upstream {
        RawUpstream::Stdio { command, args, .. } => {
            let mut line = command.clone();
            for arg in args {
                line.push(' ');
                line.push_str(arg);
            }
            format!("command `{line}`")
        }
        RawUpstream::StreamableHttp { url } => format!("URL {url}"),
    }
}

/// `leasegate init`: (exit code, message) on failure.
pub(super) async fn init(args: InitArgs) -> Result<(), (u8, String)> {
    let usage = |message: String| (INIT_USAGE, message);
    let cwd = std::env::current_dir().map_err(|e| (INIT_UNREACHABLE, e.to_string()))?;
    let given = init_upstreams(&args, &cwd).map_err(usage)?;
    let values = given_env(&args).map_err(usage)?;
    let config = args.dir.join("leasegate.toml");
    if config.exists() {
        if args.database_url.is_some() {
            return Err(usage(format!(
                "--database-url names the ledger of a new leasegate.toml; {} exists: edit its \
                 database_url instead",
                config.display()
            )));
        }
        return add(&args, given, &values, &config).await;
    }
    // Refuse before starting anything when a file is in the way.
    let planned: Vec<InitUpstream> = given
        .iter()
        .map(|(name, transport)| InitUpstream {
            name: name.clone(),
            transport: transport.clone(),
            server: None,
            tools: Vec::new(),
        })
        .collect();
    skeleton::check_target(&args.dir, &skeleton::render(&planned), args.force).map_err(refusal)?;

    let found = inspect(given, &values, &args.dir).await?;
    let (mut listen, moved) = free_listen();
    listen.database_url = args.database_url.clone();
    let written = skeleton::write_files(
        &args.dir,
        &skeleton::render_with(&found, &listen),
        args.force,
    )
    .map_err(refusal)?;
    // What was written must be what check-config accepts.
    checked(&config)?;
    print_found(&found);
    for line in moved {
        println!("{line}");
    }
    print_written(&written);
    print_next(&args.dir, &config, &listen.listen);
    Ok(())
}

/// `given` added to the leasegate.toml at `config` (module docs).
async fn add(
    args: &InitArgs,
    given: Vec<(String, RawUpstream)>,
    values: &BTreeMap<String, String>,
    config: &std::path::Path,
) -> Result<(), (u8, String)> {
    let io = |error: std::io::Error| (INIT_UNREACHABLE, format!("{}: {error}", config.display()));
    let text = std::fs::read_to_string(config).map_err(io)?;
    let raw: RawConfig = toml::from_str(&text).map_err(|error| {
        (
            INIT_USAGE,
            format!(
                "{} is there but does not parse, so no upstream can be added to it: {}",
                config.display(),
                error.message()
            ),
        )
    })?;
    // The adapters' directory as the config names it, relative to `--dir`
    // (where the files are written) and as a path from here (to check it).
    let adapters_in_dir = std::path::PathBuf::from(raw.adapters.as_deref().unwrap_or("adapters"));
    let adapters = args.dir.join(&adapters_in_dir);
    let names: Vec<&str> = given.iter().map(|(name, _)| name.as_str()).collect();
    skeleton::check_addition(config, &text, &adapters, &names, args.force).map_err(refusal)?;

    let found = inspect(given, values, &args.dir).await?;
    let mut written = Vec::new();
    for file in skeleton::render_adapters(&found) {
        let file = InitFile {
            path: adapters_in_dir.join(file.path.file_name().unwrap_or_default()),
            contents: file.contents,
        };
        written.push(skeleton::write_file(&args.dir, &file, true).map_err(refusal)?);
    }
    let added = InitFile {
        path: "leasegate.toml".into(),
        contents: skeleton::with_upstreams(&text, &found),
    };
    written.push(skeleton::write_file(&args.dir, &added, true).map_err(refusal)?);
    if let Err(failure) = checked(config) {
        // The file as it was: the addition is what does not load.
        std::fs::write(config, &text).map_err(io)?;
        return Err(failure);
    }
    print_found(&found);
    print_written(&written);
    let listen = raw
        .listen
        .unwrap_or_else(|| crate::config::DEFAULT_LISTEN.to_owned());
    print_next(&args.dir, config, &listen);
    Ok(())
}

/// The written `config` loads as `check-config` loads it.
fn checked(config: &std::path::Path) -> Result<(), (u8, String)> {
    crate::config::check_file(config)
        .map(|_| ())
        .map_err(|error| {
            (
                INIT_UNREACHABLE,
                format!(
                    "the written configuration does not load (a bug in leasegate init): {error}"
                ),
            )
        })
}

/// The default addresses, each replaced by a free port on loopback when
/// something listens there now; and a line saying so for each replaced.
fn free_listen() -> (Listen, Vec<String>) {
    let mut listen = Listen::default();
    let mut moved = Vec::new();
    // Held until both are chosen, so that they differ.
    let mut held = Vec::new();
    for (setting, address) in [
        ("listen", &mut listen.listen),
        ("control_listen", &mut listen.control_listen),
    ] {
        match std::net::TcpListener::bind(address.as_str()) {
            Ok(listener) => held.push(listener),
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
                let Ok(free) = std::net::TcpListener::bind("127.0.0.1:0") else {
                    continue;
                };
                let Ok(chosen) = free.local_addr() else {
                    continue;
                };
                moved.push(format!(
                    "{address} is taken: {setting} = \"{chosen}\" written instead"
                ));
                *address = chosen.to_string();
                held.push(free);
            }
            // Not ours to judge here (permissions, no such address):
            // `serve` names it when it binds.
            Err(_) => {}
        }
    }
    (listen, moved)
}

/// A file in the way is a usage error (exit 2); failing to read or write
/// one is exit 1.
fn refusal(error: InitError) -> (u8, String) {
    match error {
        InitError::Io { .. } => (INIT_UNREACHABLE, error.to_string()),
        _ => (INIT_USAGE, error.to_string()),
    }
}

/// Each upstream started (or reached) with the handshake `serve` uses and
/// its tools listed; the first that fails ends `init` (exit 1).
async fn inspect(
    given: Vec<(String, RawUpstream)>,
    values: &BTreeMap<String, String>,
    dir: &std::path::Path,
) -> Result<Vec<InitUpstream>, (u8, String)> {
    let mut found = Vec::new();
    for (name, upstream) in given {
        let transport = match &upstream {
            RawUpstream::Stdio { command, args, env } => UpstreamTransport::Stdio {
                // What `serve` will run for the written config, with the
                // values given for the variables written as references.
                command: crate::config::resolve_command(dir, command),
                args: args.clone(),
                env: env
                    .iter()
                    .map(|(variable, value)| {
                        let value = match (value, values.get(variable)) {
                            (EnvValue::FromEnv(_), Some(given)) => EnvValue::Text(given.clone()),
                            _ => value.clone(),
                        };
                        (variable.clone(), value)
                    })
                    .collect(),
            },
            RawUpstream::StreamableHttp { url } => {
                UpstreamTransport::StreamableHttp { url: url.clone() }
            }
        };
        let inspected = crate::mcp::inspect_upstream(&name, &transport)
            .await
            .map_err(|error| {
                (
                    INIT_UNREACHABLE,
                    format!("{error} ({})", describe(&upstream)),
                )
            })?;
        found.push(InitUpstream {
            name,
            transport: upstream,
            server: inspected.server,
            tools: inspected.tools,
        });
    }
    Ok(found)
}

/// What was found of each upstream.
fn print_found(found: &[InitUpstream]) {
    for upstream in found {
        let read_only = upstream
            .tools
            .iter()
            .filter(|t| t.read_only_hint == Some(true))
            .count();
        println!(
            "upstream {} ({}): {} tools, {read_only} read-only by annotation, {} side-effecting (capability \"none\")",
            upstream.name,
            describe(&upstream.transport),
            upstream.tools.len(),
            upstream.tools.len() - read_only,
        );
        if let RawUpstream::Stdio { env, .. } = &upstream.transport {
            for (variable, value) in env {
                if let EnvValue::FromEnv(from) = value {
                    println!(
                        "  env {variable}: not written; read from leasegate's environment variable {} when it starts the server",
                        from.from_env
                    );
                }
            }
        }
    }
}

fn print_written(written: &[std::path::PathBuf]) {
    for path in written {
        println!("wrote {}", path.display());
    }
}

/// What to do next.
fn print_next(dir: &std::path::Path, config: &std::path::Path, listen: &str) {
    let adapters = dir.join("adapters");
    println!(
        "next: review {} (what each tool can promise), then\n  leasegate check-config {}\n  leasegate serve --config {}\nand point your MCP client at http://{listen}/mcp",
        adapters.display(),
        config.display(),
        config.display()
    );
}
