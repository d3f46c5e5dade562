//! Running pgbench, and what it reports.
//!
//! Every harness runs it the same way: `pgbench -n -M prepared [-l
//! --log-prefix <dir>/log] -f <script> -c <clients> -j <min(clients, 2)> -T
//! <seconds> <url>` ([`Pgbench::command`]). From its output come the
//! transactions per second, the mean latency and the transaction count
//! ([`Report`]); from its per-transaction log, each transaction's latency
//! ([`read_log`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::Context as _;

/// `pgbench` on `PATH`, else in the newest `/usr/lib/postgresql/<v>/bin`.
pub fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("pgbench");
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let candidate = entry.path().join("bin/pgbench");
            candidate.is_file().then_some((version, candidate))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, path)| path)
}

/// One pgbench run's settings.
#[derive(Clone, Debug)]
pub struct Pgbench<'a> {
    /// The program: a path, or `pgbench` to look it up on `PATH`.
    pub program: &'a Path,
    /// The database it connects to.
    pub url: &'a str,
    /// The script file (`-f`).
    pub script: &'a Path,
    /// Clients (`-c`); threads are `min(clients, 2)` (`-j`).
    pub clients: usize,
    /// Seconds (`-T`).
    pub seconds: u64,
    /// Writes the per-transaction log (`-l`) as `<dir>/log*`, and runs in
    /// `<dir>`; `None`: no log, run where this process runs.
    pub log_dir: Option<&'a Path>,
}

impl Pgbench<'_> {
    /// The command line, not yet run.
    pub fn command(&self) -> Command {
        let mut command = Command::new(self.program);
        command.args(["-n", "-M", "prepared"]);
        if let Some(dir) = self.log_dir {
            command.args(["-l", "--log-prefix"]).arg(dir.join("log"));
            command.current_dir(dir);
        }
        command
            .arg("-f")
            .arg(self.script)
            .args([
                "-c",
                &self.clients.to_string(),
                "-j",
                &self.clients.min(2).to_string(),
                "-T",
                &self.seconds.to_string(),
            ])
            .arg(self.url);
        command
    }

    /// Runs it to the end, whatever its exit status ([`Report::parse`]
    /// checks it). The error of a program that could not be started is the
    /// [`std::io::Error`] (`NotFound` when pgbench is not installed).
    pub fn output(&self) -> anyhow::Result<Output> {
        self.command()
            .output()
            .with_context(|| format!("run {}", self.program.display()))
    }

    /// Runs it and reads its report.
    pub fn run(&self) -> anyhow::Result<Report> {
        Report::parse(&self.output()?)
    }
}

/// Whether `error` (of [`Pgbench::output`] or [`Pgbench::run`]) says pgbench
/// is not installed.
pub fn not_found(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|error| error.kind() == std::io::ErrorKind::NotFound)
}

/// What pgbench reported on its standard output.
#[derive(Clone, Debug)]
pub struct Report {
    /// `tps = …`.
    pub tps: f64,
    /// `latency average = … ms`, if printed.
    pub latency_average_ms: Option<f64>,
    /// `number of transactions actually processed: …`, if printed.
    pub transactions: Option<u64>,
    /// The output itself.
    pub stdout: String,
}

impl Report {
    /// The report of a finished run: an error if it failed (its output and
    /// errors in the message) or printed no rate.
    pub fn parse(output: &Output) -> anyhow::Result<Self> {
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        anyhow::ensure!(
            output.status.success(),
            "pgbench failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let tps = parse_tps(&stdout).ok_or_else(|| anyhow::anyhow!("no tps in: {stdout}"))?;
        Ok(Self {
            tps,
            latency_average_ms: first_number_after(&stdout, "latency average = "),
            transactions: stdout
                .lines()
                .find_map(|line| line.strip_prefix("number of transactions actually processed: "))
                .and_then(|rest| rest.split('/').next()?.trim().parse().ok()),
            stdout,
        })
    }
}

fn first_number_after(stdout: &str, prefix: &str) -> Option<f64> {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
}

/// `tps = 1234.5 (without initial connection time)` of pgbench's output.
pub fn parse_tps(stdout: &str) -> Option<f64> {
    first_number_after(stdout, "tps = ")
}

/// Latencies of a pgbench per-transaction log (`client transaction
/// latency_us script epoch_s epoch_us`; skipped transactions have no latency).
pub fn parse_log(log: &str) -> Vec<Duration> {
    log.lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.parse::<u64>().ok())
        .map(Duration::from_micros)
        .collect()
}

/// Every latency of the per-transaction logs (`log*`) in `dir`, unsorted.
pub fn read_log(dir: &Path) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("log"))
        {
            samples.extend(parse_log(&std::fs::read_to_string(&path)?));
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_parsed() {
        let stdout = "transaction type: script.sql\nnumber of transactions actually processed: 4321/4321\n\
                      latency average = 1.852 ms\ntps = 1234.56789 (without initial connection time)\n";
        assert_eq!(parse_tps(stdout), Some(1234.56789));
        assert_eq!(
            first_number_after(stdout, "latency average = "),
            Some(1.852)
        );
        assert_eq!(
            parse_log("0 1 812 0 1700000000 1\n1 1 1500 0 1700000000 2\n"),
            vec![Duration::from_micros(812), Duration::from_micros(1500)]
        );
    }

    #[test]
    fn the_command_line() {
        let dir = Path::new("/tmp/pg");
        let run = Pgbench {
            program: Path::new("pgbench"),
            url: "postgres://h/d",
            script: Path::new("s.sql"),
            clients: 8,
            seconds: 5,
            log_dir: Some(dir),
        };
        let args: Vec<_> = run
            .command()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "-n",
                "-M",
                "prepared",
                "-l",
                "--log-prefix",
                "/tmp/pg/log",
                "-f",
                "s.sql",
                "-c",
                "8",
                "-j",
                "2",
                "-T",
                "5",
                "postgres://h/d"
            ]
        );
    }
}
