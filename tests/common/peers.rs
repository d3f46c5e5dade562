//! The pinned test peers, provisioned by the suite itself under `target/`
//! so that `cargo test --locked` needs nothing installed beyond `python3`
//! (with its `venv` module) and Node with `npm`:
//!
//! * `target/sdk-venv`: a Python virtual environment with the official MCP
//!   Python SDK pinned in `tests/sdk/requirements.txt` (the example agent's
//!   `examples/python_agent/requirements.txt` pins the same);
//! * `target/frameworks-venv`: the agent frameworks' MCP clients pinned in
//!   `tests/sdk/frameworks-requirements.txt`;
//! * `target/agents-venv`: fastmcp and pydantic-ai pinned in
//!   `tests/sdk/agents-requirements.txt`;
//! * `target/sdk-node`: `@modelcontextprotocol/server-everything` and the
//!   Vercel AI SDK's MCP client (`@ai-sdk/mcp`) pinned in
//!   `tests/sdk/package.json` and its lock file (`npm ci`).
//!
//! Each is rebuilt only when its pin files change (a stamp holds their
//! contents), under a file lock, so concurrent test processes install once.
//! Overrides: `LEASEGATE_TEST_PYTHON` (an interpreter that already has the
//! SDK), `LEASEGATE_SERVER_EVERYTHING` (a `dist/index.js`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A Python interpreter with the pinned MCP SDK. Override:
/// `LEASEGATE_TEST_PYTHON`.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    venv_python(
        &PYTHON,
        "LEASEGATE_TEST_PYTHON",
        "target/sdk-venv",
        &[
            "tests/sdk/requirements.txt",
            "examples/python_agent/requirements.txt",
        ],
        "pip install of the pinned MCP Python SDK",
    )
}

/// A Python interpreter with the agent frameworks' MCP clients pinned in
/// `tests/sdk/frameworks-requirements.txt` (`langchain-mcp-adapters`, the
/// OpenAI Agents SDK), in a venv of their own: their pins need another
/// major version of the MCP SDK than the suite's. Override:
/// `LEASEGATE_TEST_FRAMEWORKS_PYTHON`.
pub fn frameworks_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    venv_python(
        &PYTHON,
        "LEASEGATE_TEST_FRAMEWORKS_PYTHON",
        "target/frameworks-venv",
        &["tests/sdk/frameworks-requirements.txt"],
        "pip install of the pinned agent frameworks",
    )
}

/// A Python interpreter with fastmcp and pydantic-ai pinned in
/// `tests/sdk/agents-requirements.txt`. Override:
/// `LEASEGATE_TEST_AGENTS_PYTHON`.
pub fn agents_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    venv_python(
        &PYTHON,
        "LEASEGATE_TEST_AGENTS_PYTHON",
        "target/agents-venv",
        &["tests/sdk/agents-requirements.txt"],
        "pip install of the pinned fastmcp and pydantic-ai",
    )
}

/// The Python of `cell`: the interpreter `override_env` names, else that of
/// the venv at `venv` with `pins` installed (made once per pin change).
fn venv_python(
    cell: &OnceLock<PathBuf>,
    override_env: &str,
    venv: &str,
    pins: &[&str],
    what: &str,
) -> PathBuf {
    cell.get_or_init(|| match std::env::var_os(override_env) {
        Some(python) => PathBuf::from(python),
        None => pinned_venv(venv, pins, what),
    })
    .clone()
}

/// server-everything's entry point (`node <it>` serves MCP over stdio).
pub fn server_everything() -> PathBuf {
    static ENTRY: OnceLock<PathBuf> = OnceLock::new();
    ENTRY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("LEASEGATE_SERVER_EVERYTHING") {
                return PathBuf::from(path);
            }
            sdk_node().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        })
        .clone()
}

/// `target/sdk-node`, with the packages of `tests/sdk/package.json`
/// installed: a script there imports them (`node <dir>/<script>.mjs`).
pub fn sdk_node() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(ROOT).join("target/sdk-node");
        let pins = ["tests/sdk/package.json", "tests/sdk/package-lock.json"];
        provision(&dir, &pins, |dir| {
            for pin in pins {
                let name = Path::new(pin).file_name().unwrap();
                std::fs::copy(Path::new(ROOT).join(pin), dir.join(name)).unwrap();
            }
            run(
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(dir),
                "npm ci of the pinned Node packages (install Node >= 18 with npm)",
            );
        });
        dir
    })
    .clone()
}

/// The Python of a venv at `venv` (under the repository) with the
/// requirements files `pins` installed, (re)built when a pin changed;
/// `what` names the install in a failure.
fn pinned_venv(venv: &str, pins: &[&str], what: &str) -> PathBuf {
    let venv = Path::new(ROOT).join(venv);
    provision(&venv, pins, |dir| {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(dir),
            "python3 -m venv (install python3 and its venv module, e.g. apt-get install python3-venv)",
        );
        let mut pip = Command::new(dir.join("bin/python"));
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ]);
        for pin in pins {
            pip.arg("-r").arg(Path::new(ROOT).join(pin));
        }
        run(&mut pip, what);
    });
    venv.join("bin/python")
}

/// Builds `dir` with `build` unless its stamp says it was built from the
/// current contents of `pins`; one process at a time.
fn provision(dir: &Path, pins: &[&str], build: impl FnOnce(&Path)) {
    let stamp: String = pins
        .iter()
        .map(|pin| {
            std::fs::read_to_string(Path::new(ROOT).join(pin))
                .unwrap_or_else(|e| panic!("{pin}: {e}"))
        })
        .collect();
    let stamp_file = dir.join(".leasegate-stamp");
    let parent = dir.parent().unwrap();
    std::fs::create_dir_all(parent).unwrap();
    let lock = std::fs::File::create(parent.join(format!(
        ".{}.lock",
        dir.file_name().unwrap().to_string_lossy()
    )))
    .unwrap();
    lock.lock().expect("lock the test peers' directory");
    if std::fs::read_to_string(&stamp_file).ok().as_deref() == Some(stamp.as_str()) {
        return;
    }
    eprintln!(
        "test peers: provisioning {} (once per pin change)",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    build(dir);
    std::fs::write(&stamp_file, stamp).unwrap();
}

fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", command.get_program()));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The JSON objects a test script printed one per line on stdout (other
/// lines are skipped).
pub fn json_lines(output: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The last 3,000 characters a test script wrote to stderr, for a failure
/// message.
pub fn stderr_tail(output: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let start = stderr
        .char_indices()
        .rev()
        .nth(2_999)
        .map_or(0, |(at, _)| at);
    stderr[start..].to_owned()
}
