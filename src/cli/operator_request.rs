//! The control API request each operator command makes: method, REST
//! path (ids percent-encoded) and JSON body. A pure mapping; sending it is
//! `crate::control::in_process`.

use http::Method;
use serde_json::{Value, json};

use super::operator_args::{LeaseCommand, OperatorCommand, OpsCommand, RunsCommand};

/// One control API request: method, path (with query) and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

impl ApiRequest {
    fn get(path: String) -> Self {
        Self {
            method: Method::GET,
            path,
            body: None,
        }
    }

    fn post(path: String, body: Value) -> Self {
        Self {
            method: Method::POST,
            path,
            body: Some(body),
        }
    }
}

impl OperatorCommand {
    /// The control API request this command makes.
    pub fn request(&self) -> ApiRequest {
        match self {
            OperatorCommand::Runs { command, .. } => runs_request(command),
            OperatorCommand::Lease { command, .. } => lease_request(command),
            OperatorCommand::Ops { command, .. } => command.request(),
        }
    }
}

impl OpsCommand {
    /// The control API request of this `ops` command.
    pub fn request(&self) -> ApiRequest {
        ops_request(self)
    }
}

fn runs_request(command: &RunsCommand) -> ApiRequest {
    match command {
        RunsCommand::Create {
            task,
            tenant,
            run_id,
            owner,
            ttl_ms,
        } => ApiRequest::post(
            "/v1/runs".to_owned(),
            json!({"task_id": task, "tenant_id": tenant, "run_id": run_id, "owner": owner, "ttl_ms": ttl_ms}),
        ),
        RunsCommand::Show { run_id } => {
            ApiRequest::get(format!("/v1/runs/{}", url_segment(run_id)))
        }
        RunsCommand::Cancel {
            run_id,
            reason,
            actor,
        } => ApiRequest::post(
            format!("/v1/runs/{}/cancel", url_segment(run_id)),
            json!({"actor": actor, "reason": reason}),
        ),
    }
}

fn lease_request(command: &LeaseCommand) -> ApiRequest {
    match command {
        LeaseCommand::Acquire {
            run_id,
            ttl_ms,
            owner,
        } => ApiRequest::post(
            format!("/v1/runs/{}/lease", url_segment(run_id)),
            json!({"owner": owner, "ttl_ms": ttl_ms}),
        ),
        LeaseCommand::Renew {
            run_id,
            owner,
            epoch,
            lease_token,
            ttl_ms,
        } => ApiRequest::post(
            format!("/v1/runs/{}/lease/renew", url_segment(run_id)),
            json!({"owner": owner, "epoch": epoch, "lease_token": lease_token, "ttl_ms": ttl_ms}),
        ),
        LeaseCommand::Release {
            run_id,
            owner,
            epoch,
            lease_token,
        } => ApiRequest::post(
            format!("/v1/runs/{}/lease/release", url_segment(run_id)),
            json!({"owner": owner, "epoch": epoch, "lease_token": lease_token}),
        ),
    }
}

fn ops_request(command: &OpsCommand) -> ApiRequest {
    match command {
        OpsCommand::Show { operation_id } => {
            ApiRequest::get(format!("/v1/operations/{}", url_segment(operation_id)))
        }
        OpsCommand::List {
            run,
            status,
            tool,
            limit,
            cursor,
        } => {
            let query: Vec<String> = [
                ("run_id", run.as_deref()),
                ("status", status.as_deref()),
                ("tool", tool.as_deref()),
                ("limit", limit.map(|n| n.to_string()).as_deref()),
                ("cursor", cursor.as_deref()),
            ]
            .iter()
            .filter_map(|(name, value)| value.map(|v| format!("{name}={}", url_segment(v))))
            .collect();
            let query = if query.is_empty() {
                String::new()
            } else {
                format!("?{}", query.join("&"))
            };
            ApiRequest::get(format!("/v1/operations{query}"))
        }
        OpsCommand::Unknown => ApiRequest::get("/v1/operations/unknown".to_owned()),
        OpsCommand::Resolve {
            operation_id,
            succeeded,
            note,
            remote_id,
            actor,
            ..
        } => ApiRequest::post(
            format!("/v1/operations/{}/resolve", url_segment(operation_id)),
            json!({"outcome": if *succeeded { "succeeded" } else { "failed_final" },
                    "note": note, "remote_id": remote_id, "actor": actor}),
        ),
        OpsCommand::Retry {
            operation_id,
            note,
            actor,
        } => ApiRequest::post(
            format!("/v1/operations/{}/retry", url_segment(operation_id)),
            json!({"note": note, "actor": actor}),
        ),
        OpsCommand::Failovers { unresolved } => ApiRequest::get(format!(
            "/v1/failovers{}",
            if *unresolved { "?unresolved=true" } else { "" }
        )),
        OpsCommand::FailoverResolve {
            failover_id,
            reason,
            by,
        } => ApiRequest::post(
            format!("/v1/failovers/{}/resolve", url_segment(failover_id)),
            json!({"by": by, "reason": reason}),
        ),
        // No route: `run` sends it to the ledger directly.
        OpsCommand::Archive { .. } => ApiRequest::get("/v1/ops-archive-has-no-route".to_owned()),
    }
}

/// Percent-encodes a path segment (ids are UUIDs, but operators paste anything).
pub fn url_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(url_segment("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(url_segment("0192-abc_~.x"), "0192-abc_~.x");
    }
}
