//! The embedded default: a private PostgreSQL cluster for `leasegate serve`
//! and `leasegate stdio` when no database is configured and nothing answers
//! at the default URL (`app::provide_database` decides; this module only
//! manages the cluster).
//!
//! * Binaries ([`find_binaries`]): `initdb` and `pg_ctl` from the
//!   directories of [`PG_BIN_DIRS_ENV`] when it is set (only those), else
//!   `PATH`, then the usual install directories ([`install_dirs`]).
//! * Where ([`state_dir`]): `$LEASEGATE_STATE_DIR/pg`, else `.leasegate/pg`
//!   under the working directory. The data directory is `<dir>/data`, the
//!   server log `<dir>/postgres.log`, the socket `<dir>/.s.PGSQL.5432`.
//! * How: `initdb -U postgres --auth=trust` once; every start (re)writes
//!   `data/leasegate.conf` (included by `postgresql.conf`):
//!   `listen_addresses = ''` (no TCP at all), `unix_socket_directories =
//!   '<dir>'`, `unix_socket_permissions = 0700`; and `data/pg_hba.conf`:
//!   only the superuser may log in, over the socket (leasegate reaches its
//!   roles by SET ROLE). Trust authentication is safe because only the
//!   owner of `<dir>` (mode 0700) and root can reach the socket.
//! * As root (initdb refuses root), every PostgreSQL command runs as the
//!   `postgres` user through `runuser -u postgres --`, with `<dir>` owned
//!   by it; without a `postgres` user (or `runuser`) it refuses, saying so.
//! * Lifetime: [`Cluster::start`] reuses a cluster already in `<dir>` (its
//!   data persists across restarts) and a server already running there
//!   (`postmaster.pid`: a leasegate that died left it). The process holding
//!   `<dir>/leasegate.lock` owns the server and stops it (`pg_ctl stop -m
//!   fast`) at [`Cluster::stop`] or on drop; a second leasegate on the same
//!   directory shares the server and leaves it running.
//!
//! It spawns processes but never talks to PostgreSQL itself (no sqlx):
//! [`Cluster::url`] is what the ledger connects to.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Colon-separated directories to find `initdb` and `pg_ctl` in, instead
/// of `PATH` and the usual install directories (for packagers and tests).
pub const PG_BIN_DIRS_ENV: &str = "LEASEGATE_PG_BIN_DIRS";
/// The state directory; the private cluster lives in its `pg/`.
pub const STATE_DIR_ENV: &str = "LEASEGATE_STATE_DIR";
/// The state directory when [`STATE_DIR_ENV`] is not set (relative to the
/// working directory).
pub const DEFAULT_STATE_DIR: &str = ".leasegate";
/// The database the ledger lives in.
pub const DATABASE: &str = "leasegate";
/// The superuser initdb creates; the ledger logs in as it.
pub const SUPERUSER: &str = "postgres";
/// The port in the socket's name (`.s.PGSQL.5432`); nothing listens on TCP.
pub const PORT: u16 = 5432;
/// How long `pg_ctl` may take to start or stop the server.
const PG_CTL_WAIT: Duration = Duration::from_secs(60);
/// The longest socket path the kernel takes (sun_path, 108 with the NUL;
/// PostgreSQL keeps a margin).
const MAX_SOCKET_PATH: usize = 103;

/// Why the private cluster could not be had.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No `initdb` + `pg_ctl` anywhere looked.
    #[error(
        "no PostgreSQL server binaries (initdb, pg_ctl) to start a private cluster with: \
         searched {searched}. Install PostgreSQL (e.g. `apt-get install postgresql`, \
         `dnf install postgresql-server`, `brew install postgresql@17`), set {PG_BIN_DIRS_ENV} \
         to the directory that holds initdb and pg_ctl, or point --database-url (or \
         LEASEGATE_DATABASE_URL, or database_url in --config) at a PostgreSQL server that runs"
    )]
    NoBinaries { searched: String },
    /// Running as root without a way to run PostgreSQL unprivileged.
    #[error(
        "running as root: PostgreSQL refuses to run as root, and {reason}. Run leasegate as an \
         unprivileged user, create a `postgres` user (with `runuser` available), or point \
         --database-url at a PostgreSQL server that runs"
    )]
    Root { reason: String },
    /// The state directory cannot hold the cluster.
    #[error("the private PostgreSQL directory {dir}: {problem}")]
    StateDir { dir: PathBuf, problem: String },
    /// A PostgreSQL command failed.
    #[error("{command} failed ({status}); see {log}:\n{output}")]
    Command {
        command: String,
        status: String,
        output: String,
        log: PathBuf,
    },
}

impl EmbeddedError {
    /// No binaries (the refusal with its own exit code) or anything else.
    pub fn is_no_binaries(&self) -> bool {
        matches!(self, EmbeddedError::NoBinaries { .. })
    }
}

/// The directory that holds `initdb`, `pg_ctl` and `postgres`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub dir: PathBuf,
}

/// The usual install directories, newest version first within each layout:
/// Debian/Ubuntu `/usr/lib/postgresql/<N>/bin`, PGDG RPM `/usr/pgsql-<N>/bin`,
/// source builds `/usr/local/pgsql/bin`, Homebrew
/// `/opt/homebrew/opt/postgresql*/bin` and `/usr/local/opt/postgresql*/bin`,
/// Postgres.app.
pub fn install_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    dirs.extend(versioned(Path::new("/usr/lib/postgresql"), "", "bin"));
    dirs.extend(versioned(Path::new("/usr"), "pgsql-", "bin"));
    dirs.push(PathBuf::from("/usr/local/pgsql/bin"));
    for brew in ["/opt/homebrew/opt", "/usr/local/opt"] {
        dirs.extend(versioned(Path::new(brew), "postgresql@", "bin"));
        dirs.push(Path::new(brew).join("postgresql/bin"));
    }
    dirs.push(PathBuf::from(
        "/Applications/Postgres.app/Contents/Versions/latest/bin",
    ));
    dirs
}

/// `<parent>/<prefix><N>/<bin>` for every numeric version N, newest first.
fn versioned(parent: &Path, prefix: &str, bin: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let version = name.strip_prefix(prefix)?;
            let key: Vec<u32> = version
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            Some((key, parent.join(&name).join(bin)))
        })
        .collect();
    found.sort();
    found.into_iter().rev().map(|(_, dir)| dir).collect()
}

/// Finds `initdb` and `pg_ctl` side by side: in [`PG_BIN_DIRS_ENV`]'s
/// directories when set, else on `PATH`, then in [`install_dirs`]. A
/// symlinked `initdb` (e.g. `/usr/local/bin/initdb`) is followed to the
/// directory that holds the server binaries.
pub fn find_binaries() -> Result<Binaries, EmbeddedError> {
    let (dirs, searched) = match std::env::var_os(PG_BIN_DIRS_ENV) {
        Some(list) => {
            let dirs: Vec<PathBuf> = std::env::split_paths(&list).collect();
            let shown = format!("{PG_BIN_DIRS_ENV} ({})", show(&dirs));
            (dirs, shown)
        }
        None => {
            let path: Vec<PathBuf> = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default();
            let install = install_dirs();
            let shown = format!(
                "PATH ({}) and {}",
                if path.is_empty() {
                    "empty".to_owned()
                } else {
                    show(&path)
                },
                show(&install)
            );
            (path.into_iter().chain(install).collect(), shown)
        }
    };
    for dir in dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
        let initdb = dir.join("initdb");
        if !is_executable(&initdb) || !is_executable(&dir.join("pg_ctl")) {
            continue;
        }
        let real = std::fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| dir.clone());
        if is_executable(&real.join("pg_ctl")) && is_executable(&real.join("initdb")) {
            return Ok(Binaries { dir: real });
        }
        return Ok(Binaries { dir: dir.clone() });
    }
    Err(EmbeddedError::NoBinaries { searched })
}

fn show(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where the private cluster lives, and what chose it (for messages).
pub fn state_dir() -> Result<(PathBuf, &'static str), EmbeddedError> {
    let (base, chosen) = match std::env::var_os(STATE_DIR_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => (PathBuf::from(dir), STATE_DIR_ENV),
        None => (PathBuf::from(DEFAULT_STATE_DIR), "the working directory"),
    };
    let base = if base.is_absolute() {
        base
    } else {
        std::env::current_dir()
            .map_err(|e| EmbeddedError::StateDir {
                dir: base.clone(),
                problem: format!("no working directory: {e}"),
            })?
            .join(base)
    };
    Ok((base.join("pg"), chosen))
}

/// Who runs the PostgreSQL commands.
#[derive(Debug, Clone)]
enum RunAs {
    /// This process's user.
    Me,
    /// root: `runuser -u postgres --`, with the directory owned by it.
    Postgres { uid: u32, gid: u32 },
}

/// A started (or reused) private cluster.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    bin: Binaries,
    run_as: RunAs,
    /// Held while this process owns the server (see the module docs).
    lock: Option<File>,
    /// Stopped already (by [`Cluster::stop`]), or never ours to stop.
    done: bool,
    /// This start ran initdb.
    pub created: bool,
    /// The server was running already (left by a leasegate that died, or
    /// started by the leasegate that shares it).
    pub was_running: bool,
}

impl Cluster {
    /// Finds the binaries, creates the cluster in `dir` if it has none,
    /// and starts its server unless it runs already. Blocking (runs
    /// `initdb` and `pg_ctl`).
    pub fn start(dir: &Path) -> Result<Cluster, EmbeddedError> {
        let bin = find_binaries()?;
        let socket = dir.join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(EmbeddedError::StateDir {
                dir: dir.to_owned(),
                problem: format!(
                    "the socket path {} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket \
                     takes; set {STATE_DIR_ENV} to a shorter directory",
                    socket.display()
                ),
            });
        }
        let state_err = |problem: String| EmbeddedError::StateDir {
            dir: dir.to_owned(),
            problem,
        };
        std::fs::create_dir_all(dir).map_err(|e| state_err(format!("cannot create it: {e}")))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| state_err(format!("cannot set its mode to 0700: {e}")))?;
        }
        let run_as = run_as()?;
        if let RunAs::Postgres { uid, gid } = run_as {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| state_err(format!("cannot give it to the postgres user: {e}")))?;
        }
        let mut cluster = Cluster {
            dir: dir.to_owned(),
            bin,
            run_as,
            lock: None,
            done: true,
            created: false,
            was_running: false,
        };
        if let RunAs::Postgres { .. } = cluster.run_as {
            let reach = cluster
                .command("test", false)
                .args(["-w"])
                .arg(dir)
                .output();
            if !reach.is_ok_and(|out| out.status.success()) {
                return Err(state_err(
                    "the postgres user cannot write to it (every parent directory must be \
                     searchable by it); set LEASEGATE_STATE_DIR to a directory it can reach, \
                     e.g. /var/tmp/leasegate"
                        .into(),
                ));
            }
        }
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("leasegate.lock"))
            .map_err(|e| state_err(format!("cannot open leasegate.lock: {e}")))?;
        let owner = match lock.try_lock() {
            Ok(()) => true,
            Err(std::fs::TryLockError::WouldBlock) => false,
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(state_err(format!("cannot lock leasegate.lock: {e}")));
            }
        };
        if !owner {
            // Another live leasegate owns the server: wait until it runs.
            let deadline = Instant::now() + PG_CTL_WAIT;
            while !cluster.running()? {
                if Instant::now() > deadline {
                    return Err(state_err(
                        "another leasegate process holds leasegate.lock but its server did not \
                         start"
                            .into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            cluster.was_running = true;
            return Ok(cluster);
        }
        cluster.lock = Some(lock);
        if !cluster.data().join("PG_VERSION").exists() {
            cluster.init()?;
            cluster.created = true;
        }
        cluster.write_settings()?;
        cluster.done = false;
        cluster.was_running = cluster.running()?;
        if !cluster.was_running {
            let log = cluster.log();
            cluster.pg_ctl(&[
                "-D",
                &text(&cluster.data()),
                "-l",
                &text(&log),
                "-w",
                "-t",
                &PG_CTL_WAIT.as_secs().to_string(),
                "start",
            ])?;
        }
        Ok(cluster)
    }

    /// The cluster's directory (socket, `data/`, `postgres.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's log.
    pub fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// This process stops the server on exit (it holds the lock).
    pub fn owned(&self) -> bool {
        self.lock.is_some()
    }

    /// The URL of `database` over the cluster's socket:
    /// `postgres://postgres@localhost:5432/<database>?host=<dir>` (the
    /// `host` parameter, a directory, names the socket and wins over the
    /// authority, as in libpq).
    pub fn url(&self, database: &str) -> String {
        socket_url(&self.dir, database)
    }

    /// Stops the server (`pg_ctl stop -m fast`) if this process owns it.
    pub fn stop(mut self) -> Result<(), EmbeddedError> {
        self.stop_with("fast")
    }

    fn stop_with(&mut self, mode: &str) -> Result<(), EmbeddedError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        if !self.running()? {
            return Ok(());
        }
        self.pg_ctl(&[
            "-D",
            &text(&self.data()),
            "-m",
            mode,
            "-w",
            "-t",
            &PG_CTL_WAIT.as_secs().to_string(),
            "stop",
        ])
        .map(drop)
    }

    /// `pg_ctl status`: 0 running, 3 not running.
    fn running(&self) -> Result<bool, EmbeddedError> {
        if !self.data().join("PG_VERSION").exists() {
            return Ok(false);
        }
        let out = self.run(&["-D", &text(&self.data()), "status"], "pg_ctl")?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(3) => Ok(false),
            _ => Err(self.failed("pg_ctl status", &out)),
        }
    }

    fn init(&self) -> Result<(), EmbeddedError> {
        let data = self.data();
        if data.exists()
            && std::fs::read_dir(&data).is_ok_and(|mut entries| entries.next().is_some())
        {
            return Err(EmbeddedError::StateDir {
                dir: self.dir.clone(),
                problem: format!(
                    "{} is not empty but holds no PostgreSQL cluster (no PG_VERSION); move it \
                     away",
                    data.display()
                ),
            });
        }
        let out = self.run(
            &[
                "-D",
                &text(&data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            "initdb",
        )?;
        if !out.status.success() {
            return Err(self.failed("initdb", &out));
        }
        let mut conf = File::options()
            .append(true)
            .open(data.join("postgresql.conf"))
            .map_err(|e| self.io("open postgresql.conf", e))?;
        conf.write_all(
            b"\n# Written by leasegate at every start: socket-only listening.\n\
              include_if_exists = 'leasegate.conf'\n",
        )
        .map_err(|e| self.io("write postgresql.conf", e))?;
        Ok(())
    }

    /// `data/leasegate.conf`, rewritten at every start (the directory may
    /// have moved).
    fn write_settings(&self) -> Result<(), EmbeddedError> {
        let quoted = text(&self.dir).replace('\'', "''");
        let settings = format!(
            "# Written by leasegate at every start; edits are lost.\n\
             listen_addresses = ''\n\
             unix_socket_directories = '{quoted}'\n\
             unix_socket_permissions = 0700\n\
             port = {PORT}\n"
        );
        std::fs::write(self.data().join("leasegate.conf"), settings)
            .map_err(|e| self.io("write leasegate.conf", e))?;
        // Only the superuser logs in (leasegate reaches its roles from it by
        // SET ROLE): a local user who could reach the socket still cannot
        // log in as leasegate_app or leasegate_operator.
        let hba = format!(
            "# Written by leasegate at every start; edits are lost.\n\
             local all {SUPERUSER} trust\n"
        );
        std::fs::write(self.data().join("pg_hba.conf"), hba)
            .map_err(|e| self.io("write pg_hba.conf", e))
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output, EmbeddedError> {
        let out = self.run(args, "pg_ctl")?;
        if !out.status.success() {
            return Err(self.failed(&format!("pg_ctl {}", args.last().unwrap_or(&"")), &out));
        }
        Ok(out)
    }

    /// Runs a PostgreSQL binary, output captured (never this process's
    /// stdout: `leasegate stdio` speaks MCP there).
    fn run(&self, args: &[&str], program: &str) -> Result<Output, EmbeddedError> {
        self.command(program, true)
            .args(args)
            .output()
            .map_err(|e| EmbeddedError::Command {
                command: program.to_owned(),
                status: format!("not started: {e}"),
                output: String::new(),
                log: self.log(),
            })
    }

    /// `program` (from the binaries' directory when `postgres_binary`), as
    /// the user that runs PostgreSQL.
    fn command(&self, program: &str, postgres_binary: bool) -> Command {
        let program = if postgres_binary {
            self.bin.dir.join(program)
        } else {
            PathBuf::from(program)
        };
        let mut command = match self.run_as {
            RunAs::Me => Command::new(program),
            RunAs::Postgres { .. } => {
                let mut command = Command::new("runuser");
                command.args(["-u", "postgres", "--"]).arg(program);
                command
            }
        };
        command
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    fn failed(&self, command: &str, out: &Output) -> EmbeddedError {
        EmbeddedError::Command {
            command: command.to_owned(),
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .trim()
            .to_owned(),
            log: self.log(),
        }
    }

    fn io(&self, what: &str, error: std::io::Error) -> EmbeddedError {
        EmbeddedError::StateDir {
            dir: self.dir.clone(),
            problem: format!("{what}: {error}"),
        }
    }
}

impl Drop for Cluster {
    /// A start that failed later (or an error return) still stops the
    /// server this process owns.
    fn drop(&mut self) {
        if let Err(error) = self.stop_with("fast") {
            eprintln!("leasegate: could not stop the private PostgreSQL: {error}");
        }
    }
}

/// The URL of `database` over the socket in `dir` (see [`Cluster::url`]).
pub fn socket_url(dir: &Path, database: &str) -> String {
    format!(
        "postgres://{SUPERUSER}@localhost:{PORT}/{database}?host={}",
        percent_encode(&text(dir))
    )
}

/// Percent-encodes all but unreserved characters and `/`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// As root: the `postgres` user through `runuser`, or a refusal.
fn run_as() -> Result<RunAs, EmbeddedError> {
    if !is_root() {
        return Ok(RunAs::Me);
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .flatten()
    };
    let (Some(uid), Some(gid)) = (id("-u"), id("-g")) else {
        return Err(EmbeddedError::Root {
            reason: "there is no `postgres` user to run it as".into(),
        });
    };
    let runuser = Command::new("runuser")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !runuser.is_ok_and(|s| s.success()) {
        return Err(EmbeddedError::Root {
            reason: "`runuser` (util-linux), needed to run it as the postgres user, is missing"
                .into(),
        });
    }
    Ok(RunAs::Postgres { uid, gid })
}

/// The effective user is root (the owner of `/proc/self`, else `id -u`).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = std::fs::metadata("/proc/self") {
        return meta.uid() == 0;
    }
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_url_names_the_directory_percent_encoded() {
        assert_eq!(
            socket_url(Path::new("/tmp/a b/pg"), "leasegate"),
            "postgres://postgres@localhost:5432/leasegate?host=/tmp/a%20b/pg"
        );
        assert_eq!(percent_encode("/x&y=z#"), "/x%26y%3Dz%23");
    }

    #[test]
    fn versions_sort_newest_first() {
        let dir = std::env::temp_dir().join(format!("leasegate-emb-{}", uuid::Uuid::new_v4()));
        for v in ["9.6", "15", "16", "notaversion"] {
            std::fs::create_dir_all(dir.join(v)).unwrap();
        }
        let found = versioned(&dir, "", "bin");
        let names: Vec<String> = found
            .iter()
            .map(|p| {
                p.parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["16", "15", "9.6"]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
