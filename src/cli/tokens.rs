//! `leasegate tokens create|list|revoke`: bearer tokens for the listeners
//! (`crate::auth`), on the ledger directly as the database role
//! `leasegate_operator` (the proxy's role cannot mint or revoke tokens). A
//! token's secret is printed once, at creation; only its SHA-256 is stored.
//! Bad arguments are refused before connecting.

use serde_json::{Value, json};

use super::failure::ledger_refusal;
use super::operator_args::{TokensArgs, TokensCommand};
use super::output::{report, table, text};
use super::target::Target;
use crate::auth::{IssuedToken, Scope};
use crate::control::{ApiError, ErrorCode, exit};
use crate::ledger::{
    Ledger, LedgerError, LedgerOptions, NewToken, TokenCreateOutcome, TokenRevokeOutcome,
};

/// How a token command ends before it has an answer to print: the exit
/// code, the error already reported.
type Reported = u8;

impl TokensArgs {
    /// Runs the command; returns the process exit code.
    pub async fn run(&self) -> u8 {
        let json = self.common.json;
        let Target {
            database, tenant, ..
        } = match Target::of(&self.common) {
            Ok(target) => target,
            Err(code) => return code,
        };
        // Refuse bad arguments before connecting.
        let expires_in_ms = match self.expires_in_ms() {
            Ok(expires_in_ms) => expires_in_ms,
            Err(code) => return code,
        };
        let options = LedgerOptions {
            max_connections: 2,
            session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
            ..Default::default()
        };
        let ledger = match Ledger::connect(&database.url, options).await {
            Ok(ledger) => ledger,
            Err(error) => {
                let (code, message) = ledger_refusal(&error, &database);
                let hint = if error.connect_failure().is_none() {
                    format!(
                        "{message} (token commands run as the database role {}: the login role \
                         must be allowed to SET ROLE to it)",
                        crate::ledger::OPERATOR_ROLE
                    )
                } else {
                    message
                };
                return report(json, code, &hint);
            }
        };
        let answer = self.answer(&ledger, tenant, expires_in_ms).await;
        ledger.close().await;
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                let error = ApiError::from(error);
                return report(json, error.code(), error.message());
            }
            Err(code) => return code,
        };
        if json {
            println!("{answer}");
            return exit::OK;
        }
        self.print(&answer);
        exit::OK
    }

    /// `create`'s `--scope` and `--expires-in` checked, the latter in
    /// milliseconds (none: valid until revoked).
    fn expires_in_ms(&self) -> Result<Option<i64>, Reported> {
        let TokensCommand::Create {
            scope, expires_in, ..
        } = &self.command
        else {
            return Ok(None);
        };
        let json = self.common.json;
        if Scope::parse(scope).is_none() {
            return Err(report(
                json,
                ErrorCode::InvalidInput,
                &format!("--scope {scope:?} is not one of agent, operator, admin"),
            ));
        }
        let Some(text) = expires_in else {
            return Ok(None);
        };
        match humantime::parse_duration(text) {
            Ok(duration) if !duration.is_zero() => Ok(Some(
                i64::try_from(duration.as_millis()).unwrap_or(i64::MAX),
            )),
            _ => Err(report(
                json,
                ErrorCode::InvalidInput,
                &format!("--expires-in {text:?} is not a duration like \"30d\" or \"12h\""),
            )),
        }
    }

    /// The command's answer as the ledger gives it (its JSON), or the exit
    /// code of an error already reported (the caller closes the ledger
    /// either way).
    async fn answer(
        &self,
        ledger: &Ledger,
        tenant: Option<String>,
        expires_in_ms: Option<i64>,
    ) -> Result<Result<Value, LedgerError>, Reported> {
        let json = self.common.json;
        match &self.command {
            TokensCommand::Create {
                tenant: asked,
                scope,
                name,
                by,
                ..
            } => {
                let tenant = asked
                    .clone()
                    .or(tenant)
                    .unwrap_or_else(|| "default".to_owned());
                create(
                    ledger,
                    json,
                    &tenant,
                    scope,
                    name.as_deref(),
                    by,
                    expires_in_ms,
                )
                .await
            }
            TokensCommand::List { tenant: asked } => Ok(ledger
                .access_tokens_list(asked.as_deref().or(tenant.as_deref()))
                .await
                .map(|tokens| json!({ "tokens": tokens }))),
            TokensCommand::Revoke { token_id, by } => revoke(ledger, json, token_id, by).await,
        }
    }

    /// Prints an answer for people: the token alone on stdout at creation
    /// (what it is on stderr), a table, or one line.
    fn print(&self, answer: &Value) {
        match &self.command {
            TokensCommand::Create { .. } => {
                println!("{}", answer["token"].as_str().unwrap_or_default());
                eprintln!(
                    "leasegate: token {} for tenant {} with scope {} (expires: {}). It is shown \
                     only now: store it; send it as `Authorization: Bearer <token>`",
                    text(&answer["token_id"]),
                    text(&answer["tenant_id"]),
                    text(&answer["scope"]),
                    answer["expires_at"].as_str().unwrap_or("never"),
                );
            }
            TokensCommand::List { .. } => {
                let rows: Vec<Vec<String>> = answer["tokens"]
                    .as_array()
                    .map(|tokens| {
                        tokens
                            .iter()
                            .map(|t| {
                                [
                                    "token_id",
                                    "tenant_id",
                                    "scope",
                                    "name",
                                    "created_at",
                                    "expires_at",
                                    "revoked_at",
                                ]
                                .iter()
                                .map(|k| text(&t[*k]))
                                .collect()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{}",
                    table(
                        &[
                            "ID", "TENANT", "SCOPE", "NAME", "CREATED", "EXPIRES", "REVOKED"
                        ],
                        &rows
                    )
                );
            }
            TokensCommand::Revoke { .. } => {
                if answer["already_revoked"] == json!(true) {
                    println!("token {} was already revoked", text(&answer["token_id"]));
                } else {
                    println!("token {} revoked", text(&answer["token_id"]));
                }
            }
        }
    }
}

/// `tokens create`: mints a token and stores its hash; the answer carries
/// the token itself, this once.
async fn create(
    ledger: &Ledger,
    json: bool,
    tenant: &str,
    scope: &str,
    name: Option<&str>,
    by: &str,
    expires_in_ms: Option<i64>,
) -> Result<Result<Value, LedgerError>, Reported> {
    // A random id colliding is astronomically unlikely; retry anyway.
    for _ in 0..3 {
        let issued = match IssuedToken::mint() {
            Ok(issued) => issued,
            Err(error) => {
                return Err(report(
                    json,
                    ErrorCode::LedgerUnavailable,
                    &format!("no random bytes from the operating system: {error}"),
                ));
            }
        };
        let outcome = ledger
            .access_token_create(NewToken {
                token_id: &issued.token_id,
                secret_hash: &issued.secret_hash(),
                tenant,
                scope,
                name,
                created_by: by,
                expires_in_ms,
            })
            .await;
        match outcome {
            Ok(TokenCreateOutcome::IdTaken) => continue,
            Ok(TokenCreateOutcome::Created {
                created_at,
                expires_at,
            }) => {
                return Ok(Ok(json!({
                    "token": issued.reveal(), "token_id": issued.token_id,
                    "tenant_id": tenant, "scope": scope, "name": name,
                    "created_at": created_at, "expires_at": expires_at,
                })));
            }
            Err(error) => return Ok(Err(error)),
        }
    }
    Ok(Err(LedgerError::Protocol {
        call: "access_token_create",
        detail: "three random token ids were taken".into(),
    }))
}

/// `tokens revoke`: by id, or by a whole token pasted.
async fn revoke(
    ledger: &Ledger,
    json: bool,
    token_id: &str,
    by: &str,
) -> Result<Result<Value, LedgerError>, Reported> {
    let id = token_id
        .strip_prefix(crate::auth::TOKEN_PREFIX)
        .unwrap_or(token_id);
    // A whole token pasted: its id is the part before the secret.
    let id = id.split('_').next().unwrap_or(id);
    match ledger.access_token_revoke(id, by).await {
        Ok(TokenRevokeOutcome::NotFound) => Err(report(
            json,
            ErrorCode::NotFound,
            &format!("token {id} not found"),
        )),
        Ok(outcome) => Ok(Ok(json!({
            "token_id": id, "revoked": true,
            "already_revoked": outcome == TokenRevokeOutcome::AlreadyRevoked,
        }))),
        Err(error) => Ok(Err(error)),
    }
}
