//! The control API's surface as data: every route (method, path) and the
//! request body limits. `router` builds the router from the same list, the
//! scopes of `auth` cover it and the OpenAPI test checks the document
//! against it; errors name the limits when a body exceeds them.

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Largest accepted body of `POST /v1/leases/renew` (10,000 leases of about
/// 160 bytes each fit with room to spare).
pub const MAX_BATCH_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Every route: (method, path). The router is built from the same handlers;
/// the OpenAPI test checks this list, the document and the router agree.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs/{run_id}"),
    ("POST", "/v1/runs/{run_id}/lease"),
    ("POST", "/v1/runs/{run_id}/lease/renew"),
    ("POST", "/v1/runs/{run_id}/lease/release"),
    ("POST", "/v1/runs/{run_id}/checkpoint"),
    ("POST", "/v1/runs/{run_id}/start"),
    ("POST", "/v1/runs/{run_id}/complete"),
    ("POST", "/v1/runs/{run_id}/fail"),
    ("POST", "/v1/runs/{run_id}/cancel"),
    ("POST", "/v1/leases/renew"),
    ("GET", "/v1/runs/{run_id}/operations"),
    ("GET", "/v1/operations"),
    ("GET", "/v1/operations/unknown"),
    ("GET", "/v1/operations/{operation_id}"),
    ("POST", "/v1/operations/{operation_id}/resolve"),
    ("POST", "/v1/operations/{operation_id}/retry"),
    ("GET", "/v1/failovers"),
    ("POST", "/v1/failovers/{failover_id}/resolve"),
    // Added by `with_upstream_health`, `with_durability` and `with_metrics`
    // (as `leasegate serve` does).
    ("GET", "/v1/upstreams"),
    ("GET", "/v1/durability"),
    ("GET", "/metrics"),
];
