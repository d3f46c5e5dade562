//! Request-controlled text in log lines, cut to a configured size.
//!
//! A tool name, owner, task key, trace id, JSON-RPC id or an error text that
//! echoes input can be as long as a request body; logged whole, 40,000
//! refused requests with a 1 MB tool name wrote 24.6 MB of logs. Every log
//! site that prints such text prints it through [`clip`] (text) or
//! [`clip_display`] (errors and other `Display` values), which write at most
//! [`max_bytes`] bytes of it and then `…(+N bytes)`.
//!
//! # Invariants
//!
//! 1. A clipped field never writes more than [`max_bytes`] bytes of its
//!    value plus a marker of at most 24 bytes; the cut falls on a character
//!    boundary.
//! 2. Formatting a clipped `Display` value never holds more than
//!    [`max_bytes`] bytes of it: the rest is counted, not buffered.
//!
//! The limit is process-wide (logging is): `limits.log_field_max_bytes`,
//! set once the configuration is loaded ([`set_max_bytes`]); 256 before.
//! The log writer of `main` also cuts whole lines at [`max_line_bytes`], a
//! backstop for text logged by dependencies.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

static MAX_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_BYTES);

/// The limit before the configuration says otherwise.
pub const DEFAULT_MAX_BYTES: usize = 256;

/// Sets the process-wide field limit (`limits.log_field_max_bytes`).
pub fn set_max_bytes(max: usize) {
    MAX_BYTES.store(max.max(16), Ordering::Relaxed);
}

/// The process-wide field limit, in bytes.
pub fn max_bytes() -> usize {
    MAX_BYTES.load(Ordering::Relaxed)
}

/// The longest log line `main`'s writer lets through: room for a dozen
/// clipped fields and the fixed text around them.
pub fn max_line_bytes() -> usize {
    (max_bytes() * 16).max(4096)
}

/// `text`, cut to [`max_bytes`] when displayed (`%`) or debugged (`?`).
pub fn clip(text: &str) -> Clipped<'_> {
    Clipped(text)
}

/// A `Display` value (an error that may echo input), cut to [`max_bytes`].
pub fn clip_display<T: fmt::Display>(value: T) -> ClippedDisplay<T> {
    ClippedDisplay(value)
}

/// See [`clip`].
pub struct Clipped<'a>(&'a str);

/// See [`clip_display`].
pub struct ClippedDisplay<T>(T);

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = prefix(self.0, max_bytes());
        f.write_str(kept)?;
        if kept.len() < self.0.len() {
            write!(f, "…(+{} bytes)", self.0.len() - kept.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = prefix(self.0, max_bytes());
        write!(f, "{kept:?}")?;
        if kept.len() < self.0.len() {
            write!(f, "…(+{} bytes)", self.0.len() - kept.len())?;
        }
        Ok(())
    }
}

/// Passes the first `room` bytes to `out` and counts the rest.
struct Cut<'a, 'b> {
    out: &'a mut fmt::Formatter<'b>,
    room: usize,
    dropped: usize,
}

impl fmt::Write for Cut<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let kept = prefix(s, self.room);
        self.out.write_str(kept)?;
        self.room -= kept.len();
        self.dropped += s.len() - kept.len();
        if kept.len() < s.len() {
            // Nothing more fits, however short the next piece.
            self.room = 0;
        }
        Ok(())
    }
}

impl<T: fmt::Display> fmt::Display for ClippedDisplay<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cut = Cut {
            out: f,
            room: max_bytes(),
            dropped: 0,
        };
        fmt::write(&mut cut, format_args!("{}", self.0))?;
        let dropped = cut.dropped;
        if dropped > 0 {
            write!(f, "…(+{dropped} bytes)")?;
        }
        Ok(())
    }
}

impl<T: fmt::Display> fmt::Debug for ClippedDisplay<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `line` (one formatted log event) cut to [`max_line_bytes`], keeping its
/// final newline: `main`'s writer passes every event through it.
pub fn cap_line(line: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let max = max_line_bytes();
    if line.len() <= max {
        return line.into();
    }
    let mut kept = line[..max].to_vec();
    // Whole UTF-8 characters only: drop a cut continuation sequence.
    while kept.last().is_some_and(|b| b & 0xC0 == 0x80) {
        kept.pop();
    }
    if kept.last().is_some_and(|b| *b >= 0xC0) {
        kept.pop();
    }
    kept.extend_from_slice(
        format!("…(log line cut: +{} bytes)\n", line.len() - kept.len()).as_bytes(),
    );
    kept.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character_boundary_and_says_by_how_much() {
        let long = "é".repeat(1000);
        let shown = clip(&long).to_string();
        assert!(shown.len() <= max_bytes() + 24, "{}", shown.len());
        assert!(shown.ends_with("…(+1744 bytes)"), "{shown}");
        assert_eq!(clip("short").to_string(), "short");
        assert_eq!(format!("{:?}", clip("a\"b")), "\"a\\\"b\"");
        let error = std::io::Error::other("x".repeat(10_000));
        let shown = clip_display(&error).to_string();
        assert_eq!(shown.len(), max_bytes() + "…(+9744 bytes)".len());
        let line = format!("{}\n", "y".repeat(100_000));
        let capped = cap_line(line.as_bytes());
        assert!(capped.len() < max_line_bytes() + 64);
        assert!(capped.ends_with(b"\n"));
    }
}
