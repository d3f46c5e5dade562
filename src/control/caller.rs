//! Who a control request acts for ([`Caller`], invariant 3 of `auth`): the
//! token's principal when authentication is on, else the serving process's
//! tenant, else any. The ownership checks every handler shares live here:
//! a run or operation of another tenant is 404 exactly as one that does
//! not exist, and an operator act is audited under the token's id. Reads
//! only.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde_json::json;

use super::error::{ApiError, ErrorCode};
use super::state::ControlState;
use crate::auth::{Principal, Scope};
use crate::intent::OperationId;
use crate::ledger::RunId;

/// The tenant a control request acts for (invariant 3).
pub(super) struct Caller {
    /// The token's caller, when authentication is on.
    principal: Option<Principal>,
    /// The serving process's tenant (`None`: any).
    served: Option<String>,
}

impl FromRequestParts<Arc<ControlState>> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ControlState>,
    ) -> Result<Self, Self::Rejection> {
        Ok(Caller {
            principal: parts.extensions.get::<Principal>().cloned(),
            served: state.tenant.clone(),
        })
    }
}

impl Caller {
    /// The actor an operator act (resolve, retry, cancel, failover resolve)
    /// is audited under. Without authentication: the name the body gives.
    /// With a token: the token's id, `token:<id>`, followed by the name the
    /// body gives when it is another one (`token:<id>/alice`), so that a
    /// token can never act in someone else's name alone.
    pub(super) fn audited_actor(&self, named: &str) -> String {
        match &self.principal {
            None => named.to_owned(),
            Some(principal) => {
                let token = format!("token:{}", principal.token_id);
                let named = named.trim();
                if named.is_empty() || named == token {
                    token
                } else {
                    format!("{token}/{named}")
                }
            }
        }
    }

    /// The tenant whose resources this request may see (`None`: any).
    pub(super) fn tenant(&self) -> Option<&str> {
        match &self.principal {
            Some(principal) => Some(&principal.tenant),
            None => self.served.as_deref(),
        }
    }

    /// The tenant a new run is for: `asked`, or the caller's. A token of
    /// another tenant than the one asked for, or than the process serves,
    /// is refused (`tenant_mismatch`, nothing written).
    pub(super) fn tenant_for_create(
        &self,
        asked: Option<&str>,
    ) -> Result<Option<String>, ApiError> {
        let mismatch = |expected: &str, found: &str, why: &str| {
            ApiError::new(
                ErrorCode::TenantMismatch,
                format!("tenant mismatch: expected tenant {expected:?} ({why}), found {found:?}. Nothing was written"),
            )
            .with_detail(json!({"expected": expected, "found": found}))
        };
        if let (Some(principal), Some(served)) = (&self.principal, &self.served)
            && principal.tenant != *served
        {
            return Err(mismatch(
                served,
                &principal.tenant,
                "the tenant this leasegate serves; the token is for another",
            ));
        }
        match (self.tenant(), asked) {
            (Some(own), Some(asked)) if own != asked => Err(mismatch(
                own,
                asked,
                if self.principal.is_some() {
                    "the tenant of the token"
                } else {
                    "the tenant this leasegate serves, `tenant` in its config; its runs would not \
                     be found on this leasegate's MCP front"
                },
            )),
            (_, Some(asked)) => Ok(Some(asked.to_owned())),
            (own, None) => Ok(own.map(str::to_owned)),
        }
    }

    /// 404 unless `run` exists, belongs to the caller's tenant and lives
    /// in the tenant's shared namespace of tasks: the runs of lease modes
    /// `session` and `key` are leasegate's, and no control route leases,
    /// plans into or moves them.
    /// Answers the run's tenant.
    pub(super) async fn owns_run(
        &self,
        state: &ControlState,
        run: RunId,
    ) -> Result<String, ApiError> {
        match state.ledger.run_scope(run).await? {
            Some((tenant, true)) if self.tenant().is_none_or(|own| own == tenant) => Ok(tenant),
            _ => Err(ApiError::not_found("run")),
        }
    }

    /// 404 unless `run` exists, belongs to the caller's tenant, and is
    /// either in the shared namespace or the caller is an operator (a
    /// token of scope `operator` or `admin`, or no authentication): an
    /// operator asks for the fate of every call of the tenant; an agent
    /// token never learns of another principal's lease-mode runs.
    pub(super) async fn sees_run(&self, state: &ControlState, run: RunId) -> Result<(), ApiError> {
        let operator = self
            .principal
            .as_ref()
            .is_none_or(|p| p.scope != Scope::Agent);
        match state.ledger.run_scope(run).await? {
            Some((tenant, shared))
                if self.tenant().is_none_or(|own| own == tenant) && (shared || operator) =>
            {
                Ok(())
            }
            _ => Err(ApiError::not_found("run")),
        }
    }

    /// 404 unless `operation` exists and belongs to a run of the caller's
    /// tenant.
    pub(super) async fn owns_operation(
        &self,
        state: &ControlState,
        operation: &OperationId,
    ) -> Result<(), ApiError> {
        let Some(own) = self.tenant() else {
            return Ok(());
        };
        match state.ledger.operation_tenant(operation).await? {
            Some(tenant) if tenant == own => Ok(()),
            _ => Err(ApiError::not_found("operation")),
        }
    }
}
