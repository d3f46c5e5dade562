//! The PostgreSQL server binaries the cluster suites (embedded database,
//! standby failover) run themselves: where the newest ones are, and how a
//! command runs them as `postgres` when the suite runs as root (initdb and
//! the postmaster refuse root). Also the log tail a failed cluster test
//! prints.

use std::path::{Path, PathBuf};

/// The newest PostgreSQL's binaries under /usr/lib/postgresql (Debian's
/// layout) that include `program`, or `PG_BIN` when set; `missing` says
/// what to install when there are none.
pub fn newest_with(program: &str, missing: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|e| panic!("{missing}: {e}"))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let version = path.file_name()?.to_str()?.parse().ok()?;
            path.join("bin")
                .join(program)
                .exists()
                .then(|| (version, path.join("bin")))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .unwrap_or_else(|| panic!("no /usr/lib/postgresql/<version>/bin/{program}: {missing}"))
        .1
}

/// Whether this process runs as root (uid 0).
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// A command running `binary`: through `runuser -u postgres` when `root`.
pub fn as_postgres(binary: &Path, root: bool) -> std::process::Command {
    if root {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(binary);
        command
    } else {
        std::process::Command::new(binary)
    }
}

/// Prints the last lines of the server log at `log` under `title`, for a
/// test that is failing.
pub fn print_log_tail(title: &str, log: &Path) {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(25).collect();
    eprintln!("--- {title} (last lines) ---");
    for line in tail.iter().rev() {
        eprintln!("{line}");
    }
}
