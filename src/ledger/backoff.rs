//! Repeating a ledger call after a transient failure
//! ([`LedgerError::is_transient`]): capped exponential backoff with jitter,
//! for the callers that may repeat their call — start-up, the liveness
//! renewal, the background loops. Nothing here is durable; a crash while
//! waiting leaves only what the calls already committed.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::LedgerError;

/// Capped exponential backoff: `first`, doubling up to `cap`, each delay
/// with up to a quarter added at random so that processes cut off together
/// do not come back in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff {
            first,
            cap,
            next: first,
        }
    }

    /// The next delay (and doubles the one after, up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.cap);
        let quarter = u64::try_from(base.as_millis() / 4).unwrap_or(0);
        let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * quarter / 255;
        base + Duration::from_millis(jitter)
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

impl Default for Backoff {
    /// 50 ms, 100 ms, … up to 2 s.
    fn default() -> Backoff {
        Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
    }
}

/// Calls `attempt` until it succeeds, fails in a way `retry` does not
/// accept, or `budget` would be exceeded by the next wait; then returns
/// the last result. Each repeated failure is logged with `call`.
pub async fn retry_within<T, F, Fut>(
    call: &str,
    budget: Duration,
    retry: impl Fn(&LedgerError) -> bool,
    mut attempt: F,
) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LedgerError>>,
{
    let deadline = Instant::now() + budget;
    let mut backoff = Backoff::default();
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let delay = backoff.next_delay();
        if !retry(&error) || Instant::now() + delay > deadline {
            return Err(error);
        }
        tracing::warn!(call, %error, retry_in = ?delay, "ledger call failed; trying again");
        tokio::time::sleep(delay).await;
    }
}
