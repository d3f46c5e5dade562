//! `adapters`: the directory of adapter files, one per upstream at most,
//! each naming an upstream of this configuration. Besides what an adapter
//! file checks of itself (`load_adapter`), what it must agree with here:
//! its upstream exists and no other file covers it, a resend waits out the
//! policy's claim, and an operation id goes in a header only over HTTP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::files::{load_adapter, toml_files};
use super::upstreams::UpstreamTransport;
use crate::adapter::Adapter;
use crate::policy::Policy;

/// The adapters of a configuration, by upstream name, and the file each
/// came from (for the timings check's messages).
#[derive(Debug, Default)]
pub(super) struct LoadedAdapters {
    pub adapters: BTreeMap<String, Adapter>,
    pub files: BTreeMap<String, PathBuf>,
}

/// Every adapter file of `dir` (`None`: no `adapters` key: none), checked
/// against `upstreams` and `policy`; `config` is the configuration's path.
pub(super) fn load(
    dir: Option<&Path>,
    config: &Path,
    upstreams: &BTreeMap<String, UpstreamTransport>,
    policy: &Policy,
) -> Result<LoadedAdapters, ConfigError> {
    let mut loaded = LoadedAdapters::default();
    let Some(dir) = dir else {
        return Ok(loaded);
    };
    for file in toml_files(dir)? {
        let adapter = load_adapter(&file)?;
        if !upstreams.contains_key(&adapter.upstream) {
            return Err(ConfigError::new(
                &file,
                format!(
                    "upstream: {:?} is not an upstream of {}",
                    adapter.upstream,
                    config.display()
                ),
            ));
        }
        if loaded.adapters.contains_key(&adapter.upstream) {
            return Err(ConfigError::new(
                &file,
                format!(
                    "upstream: another adapter file already covers {:?}",
                    adapter.upstream
                ),
            ));
        }
        agrees(&adapter, &file, upstreams, policy)?;
        loaded.files.insert(adapter.upstream.clone(), file.clone());
        loaded.adapters.insert(adapter.upstream.clone(), adapter);
    }
    Ok(loaded)
}

/// What an adapter's tools must agree with: the policy's claim and the
/// upstream's transport.
fn agrees(
    adapter: &Adapter,
    file: &Path,
    upstreams: &BTreeMap<String, UpstreamTransport>,
    policy: &Policy,
) -> Result<(), ConfigError> {
    // A send may start until its claim lapses: only after that
    // can "not found" mean the request will never arrive.
    if let Some((tool, _)) = adapter.tools.iter().find(|(_, t)| {
        t.query
            .as_ref()
            .and_then(|q| q.resend_after_not_found)
            .is_some_and(|delay| delay < policy.claim_ttl)
    }) {
        return Err(ConfigError::new(
            file,
            format!(
                "tools.{tool}.resend_after_not_found: must be at least the policy's claim_ttl ({:?}): until the claim lapses a first request may still be sent",
                policy.claim_ttl
            ),
        ));
    }
    let stdio = matches!(
        upstreams.get(&adapter.upstream),
        Some(UpstreamTransport::Stdio { .. })
    );
    if let Some((tool, _)) = adapter.tools.iter().find(|(_, t)| {
        stdio && matches!(t.placement, crate::adapter::OperationIdPlacement::Header(_))
    }) {
        return Err(ConfigError::new(
            file,
            format!(
                "tools.{tool}.operation_id_header: upstream {:?} runs over stdio, which has no HTTP headers; use operation_id_argument or operation_id_meta",
                adapter.upstream
            ),
        ));
    }
    Ok(())
}
