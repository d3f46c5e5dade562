//! `leasegate init`: a leasegate.toml, the default policy and an adapter
//! skeleton per upstream, written into `--dir` from the tools the upstreams
//! list. Exit 0: written; 2: bad arguments, or a file would be overwritten;
//! 1: an upstream could not be started, reached or listed, or writing
//! failed. Nothing is written until every upstream has answered, and files
//! in the way are refused before any upstream is started; a crash while
//! writing can leave some of the files written (run it again with
//! `--force`).

use super::args::InitArgs;
use crate::config::init::{self as skeleton, InitError, InitUpstream};
use crate::config::{RawUpstream, UpstreamTransport};

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
            upstreams.push((name.clone(), stdio(command, rest.to_vec())));
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

    let found = inspect(given, &args.dir).await?;
    let written =
        skeleton::write_files(&args.dir, &skeleton::render(&found), args.force).map_err(refusal)?;
    let config = args.dir.join("leasegate.toml");
    // What was written must be what check-config accepts.
    crate::config::check_file(&config).map_err(|error| {
        (
            INIT_UNREACHABLE,
            format!("the written configuration does not load (a bug in leasegate init): {error}"),
        )
    })?;
    print_summary(&found, &written, &args.dir, &config);
    Ok(())
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
    dir: &std::path::Path,
) -> Result<Vec<InitUpstream>, (u8, String)> {
    let mut found = Vec::new();
    for (name, upstream) in given {
        let transport = match &upstream {
            RawUpstream::Stdio { command, args, env } => UpstreamTransport::Stdio {
                // What `serve` will run for the written config.
                command: crate::config::resolve_command(dir, command),
                args: args.clone(),
                env: env.clone(),
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

/// What was found and written, and what to do next.
fn print_summary(
    found: &[InitUpstream],
    written: &[std::path::PathBuf],
    dir: &std::path::Path,
    config: &std::path::Path,
) {
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
    }
    for path in written {
        println!("wrote {}", path.display());
    }
    let adapters = dir.join("adapters");
    println!(
        "next: review {} (what each tool can promise), then\n  leasegate check-config {}\n  leasegate serve --config {}",
        adapters.display(),
        config.display(),
        config.display()
    );
}
