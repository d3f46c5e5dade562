//! Progress for commands that wait (`leasegate migrate`, the benchmarks, the
//! chaos soak): a bar or spinner on stderr when stderr is a terminal, and
//! nothing at all otherwise (CI, pipes, files), so that captured output is
//! exactly what it was without progress.
//!
//! # Invariants
//!
//! 1. Not a terminal, or `LEASEGATE_NO_PROGRESS` set: no byte is written;
//!    every method is a no-op.
//! 2. Progress goes to stderr only: stdout (answers, reports) is never
//!    touched, and a finished bar is cleared, not left in the scrollback.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar (known length) or spinner (unknown), or nothing.
pub struct Progress {
    bar: Option<ProgressBar>,
}

/// Whether progress is drawn: stderr is a terminal and
/// `LEASEGATE_NO_PROGRESS` is not set.
pub fn enabled() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("LEASEGATE_NO_PROGRESS").is_none()
}

impl Progress {
    /// A bar of `total` steps, labelled `what`.
    pub fn bar(total: u64, what: &str) -> Self {
        Self::bar_if(enabled(), total, what)
    }

    /// A spinner for a wait of unknown length, labelled `what`.
    pub fn spinner(what: &str) -> Self {
        Self::spinner_if(enabled(), what)
    }

    /// [`Progress::bar`], drawn only when `draw` (tests choose).
    pub fn bar_if(draw: bool, total: u64, what: &str) -> Self {
        if !draw {
            return Self { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
            )
            .expect("a valid template"),
        );
        bar.set_message(what.to_owned());
        Self { bar: Some(bar) }
    }

    /// [`Progress::spinner`], drawn only when `draw`.
    pub fn spinner_if(draw: bool, what: &str) -> Self {
        if !draw {
            return Self { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
                .expect("a valid template"),
        );
        bar.set_message(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(120));
        Self { bar: Some(bar) }
    }

    /// Whether anything is drawn.
    pub fn is_drawn(&self) -> bool {
        self.bar.is_some()
    }

    pub fn inc(&self, steps: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(steps);
        }
    }

    pub fn set_position(&self, position: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(position);
        }
    }

    /// Replaces the label (e.g. the current phase).
    pub fn set_message(&self, what: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(what.to_owned());
        }
    }

    /// Clears the bar (invariant 2): what the command prints next stands alone.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_drawn_when_not_asked() {
        let bar = Progress::bar_if(false, 10, "x");
        bar.inc(3);
        bar.set_message("y");
        assert!(!bar.is_drawn());
        assert!(!Progress::spinner_if(false, "x").is_drawn());
        assert!(Progress::bar_if(true, 10, "x").is_drawn());
    }
}
