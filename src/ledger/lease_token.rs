//! Lease tokens: the secret that makes a lease unforgeable.
//!
//! A lease's run id, owner and epoch are its public identity: anyone who can
//! read `GET /v1/runs/{id}` or the event history knows them. Taking a lease
//! (`run_create` with an owner, `lease_acquire`, `lease_takeover`) therefore
//! also issues a [`LeaseToken`]: 32 bytes from the operating system's CSPRNG,
//! printed as `lgl_` + base64url (43 characters). The taker is shown the
//! token once; the ledger stores only its SHA-256 ([`LeaseToken::sha256`],
//! column `worker_leases.token_sha256`, migration 0005), computed here, so
//! the plaintext never reaches the database. Every fenced write sends the
//! hash of the token it presents and `_lease_fence` compares it.
//!
//! # Invariants
//!
//! * A token is never printed: `Debug` and `Display` show `lgl_…`, it is not
//!   `Serialize`, and no error message or log line carries it. The only way
//!   to its text is [`LeaseToken::expose`], called where it is handed to its
//!   holder (the control API's acquire and create answers, the CLI's one
//!   print).
//! * A presented token is taken as it comes ([`LeaseToken::presented`]): any
//!   string is hashed and compared, so a malformed token is simply a wrong
//!   one (`lease_token_invalid`), never a different error that tells
//!   anything about the right one.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// The printable prefix of every token leasegate issues.
pub const LEASE_TOKEN_PREFIX: &str = "lgl_";

/// Random bytes in a token (256 bits).
const TOKEN_BYTES: usize = 32;

/// A lease's secret credential. Cloning copies the secret; keep clones in
/// memory only.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh token from the operating system's CSPRNG.
    ///
    /// # Panics
    ///
    /// When the operating system has no random source to offer (getrandom
    /// fails): there is no safe token to issue then.
    pub fn generate() -> Self {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).expect("the operating system's random source failed");
        Self(format!(
            "{LEASE_TOKEN_PREFIX}{}",
            URL_SAFE_NO_PAD.encode(bytes)
        ))
    }

    /// A token as a caller presented it (header, `_meta`, request body),
    /// surrounding whitespace trimmed. Never validated beyond that: see the
    /// module docs.
    pub fn presented(text: &str) -> Self {
        Self(text.trim().to_owned())
    }

    /// The token's text, to hand to its holder. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the ledger stores and compares: SHA-256 of the token's UTF-8 text.
    pub fn sha256(&self) -> Vec<u8> {
        Sha256::digest(self.0.as_bytes()).to_vec()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(lgl_…)")
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("lgl_…")
    }
}

/// The SHA-256 to bind for a claim's token; `None` (SQL NULL) when the
/// caller presented none, which the fence answers `lease_token_invalid`.
pub(super) fn bind_hash(token: Option<&LeaseToken>) -> Option<Vec<u8>> {
    token.map(LeaseToken::sha256)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_printable_distinct_and_never_formatted() {
        let a = LeaseToken::generate();
        let b = LeaseToken::generate();
        assert_ne!(a, b);
        let text = a.expose();
        assert!(text.starts_with(LEASE_TOKEN_PREFIX));
        // 32 bytes in unpadded base64url.
        assert_eq!(text.len(), LEASE_TOKEN_PREFIX.len() + 43);
        assert!(
            text[LEASE_TOKEN_PREFIX.len()..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
        assert!(!format!("{a:?} {a}").contains(&text[LEASE_TOKEN_PREFIX.len()..]));
        assert_eq!(a.sha256().len(), 32);
        assert_eq!(LeaseToken::presented(&format!(" {text}\n")), a);
        assert_ne!(a.sha256(), b.sha256());
    }
}
