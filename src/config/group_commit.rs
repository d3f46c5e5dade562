//! `group_commit` and its tuning keys: group commit of gated calls, checked
//! whether it is on or not, and `LEASEGATE_GROUP_COMMIT` over the file.

use super::raw::RawConfig;

/// `group_commit`, `group_commit_window`, `group_commit_max_batch` and
/// `group_commit_in_flight`, checked (also when group commit is off, so that turning it on later
/// cannot surface a typo), then `LEASEGATE_GROUP_COMMIT` over
/// `group_commit`.
pub(super) fn group_commit_settings(
    raw: &RawConfig,
) -> Result<Option<crate::ledger::GroupCommitSettings>, String> {
    use crate::ledger::{
        GROUP_COMMIT_MAX_BATCH, GROUP_COMMIT_MAX_IN_FLIGHT, GROUP_COMMIT_MAX_WINDOW,
        GroupCommitSettings,
    };
    let mut settings = GroupCommitSettings::default();
    if let Some(text) = &raw.group_commit_window {
        // "0" (no window) is the default, so it is accepted here.
        let window = match humantime::parse_duration(text) {
            Ok(window) if window.is_zero() => window,
            _ => crate::policy::parse_duration("group_commit_window", text)
                .map_err(|e| e.to_string())?,
        };
        if window > GROUP_COMMIT_MAX_WINDOW {
            return Err(format!(
                "group_commit_window: must be at most 50ms (it delays every batched call), got {text:?}"
            ));
        }
        settings.window = window;
    }
    if let Some(max_batch) = raw.group_commit_max_batch {
        let max_batch = usize::try_from(max_batch).unwrap_or(usize::MAX);
        if !(1..=GROUP_COMMIT_MAX_BATCH).contains(&max_batch) {
            return Err(format!(
                "group_commit_max_batch: must be 1 to {GROUP_COMMIT_MAX_BATCH} (one subtransaction per call; \
                 PostgreSQL caches 64 per transaction), got {max_batch}"
            ));
        }
        settings.max_batch = max_batch;
    }
    if let Some(in_flight) = raw.group_commit_in_flight {
        let in_flight = usize::try_from(in_flight).unwrap_or(usize::MAX);
        if !(1..=GROUP_COMMIT_MAX_IN_FLIGHT).contains(&in_flight) {
            return Err(format!(
                "group_commit_in_flight: must be 1 to {GROUP_COMMIT_MAX_IN_FLIGHT} (batches of one kind \
                 sent at once), got {in_flight}"
            ));
        }
        settings.in_flight = in_flight;
    }
    let on = crate::ledger::group_commit_env_override().unwrap_or(raw.group_commit.unwrap_or(true));
    Ok(on.then_some(settings))
}
