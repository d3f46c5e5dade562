//! The orderings of timeouts across sections a configuration must keep,
//! checked by `Config::load` (so `serve` refuses what `check-config`
//! refuses): every claim outlives the call it covers, a key's lease fits
//! under the lease ceiling, and an MCP session's idle timer outlasts the
//! longest call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{ConfigError, Problem};
use super::lease::LeaseMode;
use super::limits::Limits;
use super::upstreams::UpstreamTransport;
use crate::adapter::Adapter;
use crate::policy::Policy;

/// What a claim must leave after its call's timeout, for the answer to be
/// settled before the claim lapses (`claim_ttl` and `reconcile_claim_ttl`
/// are at least every side-effecting tool's timeout plus this).
pub const CLAIM_MARGIN: Duration = Duration::from_secs(1);

/// The ordering of timeouts a configuration must keep (checked by
/// `Config::load`, so `serve` refuses what `check-config` refuses).
pub(super) struct Timings<'a> {
    pub config: &'a Path,
    pub policy: &'a Policy,
    pub policy_file: Option<&'a Path>,
    pub lease_mode: LeaseMode,
}

impl Timings<'_> {
    fn policy_field(&self, field: &str, value: Duration) -> String {
        match self.policy_file {
            Some(file) => format!("the policy's {field} ({value:?}, in {})", file.display()),
            None => format!("the default policy's {field} ({value:?})"),
        }
    }

    /// Every claim outlives the call it covers, with [`CLAIM_MARGIN`] to
    /// settle the answer: the dispatcher's (`claim_ttl`) and the
    /// reconciler's (`reconcile_claim_ttl`, under which it queries or
    /// retries with the tool's timeout). A claim that lapses first turns a
    /// call still running `unknown`, and lets another process send it
    /// again. Upstreams without an adapter file count with the default
    /// timeout. In lease mode `key` the key's lease lasts `claim_ttl`, so
    /// that must be within `lease_ttl_ceiling`.
    pub(super) fn check(
        &self,
        upstreams: &BTreeMap<String, UpstreamTransport>,
        adapters: &BTreeMap<String, Adapter>,
        adapter_files: &BTreeMap<String, PathBuf>,
    ) -> Result<(), ConfigError> {
        let claims = [
            ("claim_ttl", self.policy.claim_ttl),
            ("reconcile_claim_ttl", self.policy.reconcile_claim_ttl),
        ];
        for name in upstreams.keys() {
            // (file, field, timeout) of every side-effecting call.
            let mut calls: Vec<(&Path, String, Duration)> = Vec::new();
            match (adapters.get(name), adapter_files.get(name)) {
                (Some(adapter), Some(file)) => {
                    calls.push((file, "timeout".to_owned(), adapter.timeout));
                    for (tool, spec) in &adapter.tools {
                        if !spec.read_only {
                            calls.push((file, format!("tools.{tool}.timeout"), spec.timeout));
                        }
                    }
                }
                _ => calls.push((
                    self.config,
                    format!("upstreams.{name} (no adapter file: the default tool timeout)"),
                    crate::adapter::DEFAULT_TIMEOUT,
                )),
            }
            for (file, field, timeout) in calls {
                for (claim, ttl) in claims {
                    if timeout + CLAIM_MARGIN > ttl {
                        return Err(ConfigError::of(
                            Problem::Timeouts,
                            file,
                            format!(
                                "{field}: {timeout:?} plus a margin of {CLAIM_MARGIN:?} does not \
                                 fit in {}: a claim must outlive the call it covers; raise \
                                 {claim} or lower the timeout",
                                self.policy_field(claim, ttl)
                            ),
                        ));
                    }
                }
            }
        }
        if self.lease_mode == LeaseMode::Key
            && self.policy.claim_ttl > self.policy.lease_ttl_ceiling
        {
            return Err(ConfigError::of(
                Problem::Timeouts,
                self.config,
                format!(
                    "lease_mode = \"key\": a key's lease lasts {}, which is above {}",
                    self.policy_field("claim_ttl", self.policy.claim_ttl),
                    self.policy_field("lease_ttl_ceiling", self.policy.lease_ttl_ceiling)
                ),
            ));
        }
        Ok(())
    }
}

/// A session's idle timer runs while a call is in flight without
/// messages: with `http_sessions` on, `limits.session_idle_timeout` must
/// exceed the longest tool timeout (an upstream without an adapter file
/// calls with the default).
pub(super) fn check_session_idle(
    file: &Path,
    http_sessions: bool,
    limits: &Limits,
    upstreams: &BTreeMap<String, UpstreamTransport>,
    adapters: &BTreeMap<String, Adapter>,
) -> Result<(), ConfigError> {
    if let Some(longest) = adapters
        .values()
        .flat_map(|a| std::iter::once(a.timeout).chain(a.tools.values().map(|t| t.timeout)))
        .chain((upstreams.len() > adapters.len()).then_some(crate::adapter::DEFAULT_TIMEOUT))
        .max()
        && http_sessions
        && limits.session_idle_timeout <= longest
    {
        return Err(ConfigError::new(
            file,
            format!(
                "limits.session_idle_timeout: must exceed the longest tool timeout ({longest:?}): \
                 a session is ended after this long without a message, even during a call"
            ),
        ));
    }
    Ok(())
}
