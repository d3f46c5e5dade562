//! Access tokens as an operator makes them: `leasegate tokens create` run
//! as a child process against the test's database, and the token id a
//! token's text carries.

use serde_json::Value;

use super::TestDb;
use super::proxy::LEASEGATE;

/// Runs `leasegate tokens create --json` for `tenant` and `scope` (named
/// `name` when given) and returns the token text; fails the test unless the
/// command succeeds and answers for that tenant and scope.
pub async fn create_token(db: &TestDb, tenant: &str, scope: &str, name: Option<&str>) -> String {
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .args(["tokens", "create", "--json", "--database-url", &db.url])
        .args(["--tenant", tenant, "--scope", scope]);
    if let Some(name) = name {
        command.args(["--name", name]);
    }
    let output = command.output().await.expect("run leasegate tokens create");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tokens create: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (answer["tenant_id"].as_str(), answer["scope"].as_str()),
        (Some(tenant), Some(scope))
    );
    answer["token"].as_str().unwrap().to_owned()
}

/// The id part of a token's text (`lgt_<id>_<secret>`).
pub fn token_id(token: &str) -> &str {
    token
        .strip_prefix("lgt_")
        .unwrap()
        .split('_')
        .next()
        .unwrap()
}
