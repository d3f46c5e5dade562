//! Where the machine's CPU goes during a cell: PostgreSQL, the
//! `leasegate serve` child, its upstream (the child's own children), the
//! load generator (this process; for a pgbench cell, pgbench), and the rest.
//!
//! Read from `/proc` (clock ticks of `utime + stime`) at the start and the
//! end of the measured window and divided by the calls the window counted.
//! What it counts, and what it cannot:
//!
//! - PostgreSQL is every process whose `comm` is `postgres` (the server's
//!   backends, its background processes and the postmaster), plus the
//!   postmaster's `cutime + cstime`: a backend that exits (pgbench's, at the
//!   end of its run) hands its whole CPU time to the postmaster when reaped.
//!   A backend that was alive at the start and exits inside the window is
//!   counted twice for what it used before the start; the cells open no
//!   such connection (leasegate's pool keeps its sessions). The
//!   background processes (WAL writer, checkpointer, autovacuum workers)
//!   are PostgreSQL's too: a window in which autovacuum runs costs more.
//! - The load generator of a leasegate cell is this process (its HTTP
//!   callers, and the lease keep-alive, which renews 64 leases every few
//!   seconds); of a pgbench cell, pgbench (this process's `cutime +
//!   cstime`, once it is reaped).
//! - "Other" is the machine's busy time (`/proc/stat`) minus the parts:
//!   interrupts and softirqs not charged to a process, kernel threads,
//!   anything else running.
//! - A clock tick is 10 ms (`CLK_TCK` = 100): over a window of seconds and
//!   thousands of calls that is well under 1 % of a call's share.

use std::time::Duration;

/// CPU of each part during one window, in ms per call.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuPerCall {
    pub postgres_ms: f64,
    pub leasegate_ms: f64,
    pub upstream_ms: f64,
    pub load_ms: f64,
    pub other_ms: f64,
    /// The machine's busy share of its cores over the window, 0..=1.
    pub busy: f64,
}

impl CpuPerCall {
    pub fn total_ms(&self) -> f64 {
        self.postgres_ms + self.leasegate_ms + self.upstream_ms + self.load_ms + self.other_ms
    }
}

/// Whose CPU the load generator's column reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// This process's threads (HTTP callers).
    ThisProcess,
    /// This process's reaped children (pgbench).
    ReapedChildren,
}

/// One reading of every counter, in clock ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    machine_busy: u64,
    machine_total: u64,
    postgres: u64,
    leasegate: u64,
    upstream: u64,
    load: u64,
    load_reaped: u64,
}

/// The fields after `comm` of a `/proc/<pid>/stat` text: (comm, fields).
/// `comm` may hold spaces and parentheses; it ends at the last `)`.
fn parse_stat(stat: &str) -> Option<(&str, Vec<&str>)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = &stat[open + 1..close];
    let rest = stat[close + 1..].split_whitespace().collect::<Vec<_>>();
    // state ppid ... utime(14) stime(15) cutime(16) cstime(17): indexes 11..=14 after comm.
    (rest.len() > 14).then_some((comm, rest))
}

fn field(fields: &[&str], index: usize) -> u64 {
    fields.get(index).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// (pid, comm, ppid, utime + stime, cutime + cstime) of every process.
fn processes() -> Vec<(u32, String, u32, u64, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (comm, fields) = parse_stat(&stat)?;
            let ppid = field(&fields, 1) as u32;
            let own = field(&fields, 11) + field(&fields, 12);
            let reaped = field(&fields, 13) + field(&fields, 14);
            Some((pid, comm.to_string(), ppid, own, reaped))
        })
        .collect()
}

/// (busy, total) ticks of the machine's first `/proc/stat` line.
fn machine() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    let total: u64 = values.iter().take(8).sum();
    (total.saturating_sub(idle), total)
}

impl CpuSample {
    /// Reads every counter now; `leasegate` is the served child's pid, if any.
    pub fn take(leasegate: Option<u32>) -> Self {
        let (machine_busy, machine_total) = machine();
        let all = processes();
        let mut sample = CpuSample {
            machine_busy,
            machine_total,
            ..CpuSample::default()
        };
        for (pid, comm, _, own, reaped) in &all {
            if comm == "postgres" {
                sample.postgres += own + reaped;
            }
            if Some(*pid) == leasegate {
                sample.leasegate = *own;
            }
            if *pid == std::process::id() {
                sample.load = *own;
                // Reaped children: pgbench, and nothing else during a cell.
                sample.load_reaped = *reaped;
            }
        }
        if let Some(root) = leasegate {
            // The upstream: every descendant of the served child.
            let mut parents = vec![root];
            while let Some(parent) = parents.pop() {
                for (pid, _, ppid, own, _) in &all {
                    if *ppid == parent {
                        sample.upstream += own;
                        parents.push(*pid);
                    }
                }
            }
        }
        sample
    }

    /// Per call, from `self` (start) to `end`.
    pub fn per_call(&self, end: &CpuSample, calls: u64, load: Load) -> Option<CpuPerCall> {
        if calls == 0 || end.machine_total <= self.machine_total {
            return None;
        }
        let tick_ms = 1000.0 / ticks_per_second();
        let per_call = |ticks: u64| ticks as f64 * tick_ms / calls as f64;
        let delta = |a: u64, b: u64| b.saturating_sub(a);
        let postgres = delta(self.postgres, end.postgres);
        let leasegate = delta(self.leasegate, end.leasegate);
        let upstream = delta(self.upstream, end.upstream);
        let load_ticks = match load {
            Load::ThisProcess => delta(self.load, end.load),
            Load::ReapedChildren => delta(self.load_reaped, end.load_reaped),
        };
        let busy = delta(self.machine_busy, end.machine_busy);
        let parts = postgres + leasegate + upstream + load_ticks;
        Some(CpuPerCall {
            postgres_ms: per_call(postgres),
            leasegate_ms: per_call(leasegate),
            upstream_ms: per_call(upstream),
            load_ms: per_call(load_ticks),
            other_ms: per_call(busy.saturating_sub(parts)),
            busy: busy as f64 / delta(self.machine_total, end.machine_total) as f64,
        })
    }
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Waits (up to `deadline`) until no more `postgres` processes run than
/// `before` counted, so that exited backends have been reaped into the
/// postmaster's `cutime` before the closing sample. Blocking, like the
/// pgbench run it follows.
pub fn settle_postgres(before: usize, deadline: Duration) {
    let until = std::time::Instant::now() + deadline;
    while postgres_processes() > before && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many `postgres` processes run now.
pub fn postgres_processes() -> usize {
    processes()
        .iter()
        .filter(|(_, comm, ..)| comm == "postgres")
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_spaced_comm_parses() {
        let stat = "4242 (postgres: x (y)) S 1 2 3 4 5 6 7 8 9 10 110 220 330 440 20 0";
        let (comm, fields) = parse_stat(stat).expect("parses");
        assert_eq!(comm, "postgres: x (y)");
        assert_eq!(field(&fields, 1), 1);
        assert_eq!(field(&fields, 11) + field(&fields, 12), 330);
        assert_eq!(field(&fields, 13) + field(&fields, 14), 770);
    }
}
