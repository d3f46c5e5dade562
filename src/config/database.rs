//! The ledger's database: where it is (`database_url`, resolved with the
//! flag and the environment in one order for every command), how this
//! process connects to it (connections, statement and connect timeouts,
//! group commit), the operator routes' login, and whether the migrations
//! are applied at start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{ConfigError, Problem};
use super::group_commit::group_commit_settings;
use super::raw::RawConfig;

/// The `database_*` keys (and `group_commit*`, `migrate`), validated.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// Resolved with [`DatabaseUrl::resolve`]: as loaded, the file's value
    /// or the default; `DatabaseConfig::resolve_url` applies the flag and
    /// the environment.
    pub url: String,
    pub url_source: DatabaseUrlSource,
    /// `None`: not set in the file; [`DatabaseConfig::connections`] says
    /// how many then.
    pub max_connections: Option<u32>,
    pub statement_timeout: Duration,
    /// How long start-up waits for the database to answer.
    pub connect_timeout: Duration,
    /// `group_commit` (after `LEASEGATE_GROUP_COMMIT`) with its window and
    /// batch size; `None`: each gated call is its own statements.
    pub group_commit: Option<crate::ledger::GroupCommitSettings>,
    /// `database_operator_url`: the operator routes' login (`None`: the
    /// ledger's URL, `SET ROLE leasegate_operator`).
    pub operator_url: Option<String>,
    /// `migrate`: apply the ledger migrations at start.
    pub migrate: bool,
}

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/leasegate";
/// The value of `database_url` (or `--database-url`, or
/// [`DATABASE_URL_ENV`]) that asks for leasegate's private PostgreSQL
/// cluster in its state directory, whether or not a server answers at the
/// default.
pub const EMBEDDED_DATABASE: &str = "embedded";
/// The environment variable of the ledger's URL. `DATABASE_URL` is never
/// read: it belongs to the test suite (`.cargo/config.toml`) and to sqlx's
/// tools, and would silently point the CLI at another database.
pub const DATABASE_URL_ENV: &str = "LEASEGATE_DATABASE_URL";
/// Replaces [`DEFAULT_DATABASE_URL`] as the default (the URL's source stays
/// "the default"): for packagers whose PostgreSQL listens elsewhere, and for
/// tests that need a default where nothing answers (the embedded default).
pub const DEFAULT_DATABASE_URL_ENV: &str = "LEASEGATE_DEFAULT_DATABASE_URL";
/// What `--help` says about `--database-url`.
pub const DATABASE_URL_HELP: &str = "PostgreSQL URL of the ledger. Found in this order: \
--database-url, then $LEASEGATE_DATABASE_URL, then database_url in the --config file, then \
postgres://postgres@127.0.0.1:5432/leasegate ($DATABASE_URL is not read). \"embedded\": \
leasegate's private PostgreSQL in its state directory (.leasegate/pg, or $LEASEGATE_STATE_DIR/pg)";

/// Where the ledger's URL came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrlSource {
    Flag,
    Env,
    ConfigFile(PathBuf),
    Default,
    /// The private PostgreSQL cluster leasegate started in this directory
    /// (the embedded default: nothing configured, nothing answering at the
    /// default).
    Private(PathBuf),
}

impl std::fmt::Display for DatabaseUrlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseUrlSource::Flag => f.write_str("--database-url"),
            DatabaseUrlSource::Env => f.write_str(DATABASE_URL_ENV),
            DatabaseUrlSource::ConfigFile(path) => {
                write!(f, "database_url in {}", path.display())
            }
            DatabaseUrlSource::Default => f.write_str("the default"),
            DatabaseUrlSource::Private(dir) => {
                write!(f, "the private PostgreSQL at {}", dir.display())
            }
        }
    }
}

/// The ledger's URL and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    pub url: String,
    pub source: DatabaseUrlSource,
}

impl DatabaseUrl {
    /// Whether this asks for the private cluster ([`EMBEDDED_DATABASE`]).
    pub fn is_embedded(&self) -> bool {
        self.url.trim() == EMBEDDED_DATABASE
    }

    /// The one order every command resolves the ledger's URL in: the
    /// `--database-url` flag, then [`DATABASE_URL_ENV`], then `database_url`
    /// of the config file (`file`: its path and value), then
    /// [`DEFAULT_DATABASE_URL`]. Empty values count as absent.
    pub fn resolve(
        flag: Option<&str>,
        env: Option<&str>,
        file: Option<(&Path, Option<&str>)>,
    ) -> DatabaseUrl {
        let given = |value: Option<&str>| value.filter(|v| !v.trim().is_empty()).map(str::to_owned);
        if let Some(url) = given(flag) {
            return DatabaseUrl {
                url,
                source: DatabaseUrlSource::Flag,
            };
        }
        if let Some(url) = given(env) {
            return DatabaseUrl {
                url,
                source: DatabaseUrlSource::Env,
            };
        }
        if let Some((path, value)) = file
            && let Some(url) = given(value)
        {
            return DatabaseUrl {
                url,
                source: DatabaseUrlSource::ConfigFile(path.to_owned()),
            };
        }
        DatabaseUrl {
            url: DEFAULT_DATABASE_URL.to_owned(),
            source: DatabaseUrlSource::Default,
        }
    }

    /// [`DatabaseUrl::resolve`] with this process's environment, the
    /// default replaced by [`DEFAULT_DATABASE_URL_ENV`] when that is set.
    pub fn from_environment(
        flag: Option<&str>,
        file: Option<(&Path, Option<&str>)>,
    ) -> DatabaseUrl {
        let env = std::env::var(DATABASE_URL_ENV).ok();
        let mut resolved = Self::resolve(flag, env.as_deref(), file);
        if resolved.source == DatabaseUrlSource::Default
            && let Ok(default) = std::env::var(DEFAULT_DATABASE_URL_ENV)
            && !default.trim().is_empty()
        {
            resolved.url = default;
        }
        resolved
    }
}
/// Default `database_connect_timeout`.
pub const DEFAULT_DATABASE_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

impl DatabaseConfig {
    /// The database keys of `raw`, checked in the order `file`'s errors
    /// are reported in; `file` is the configuration's path.
    pub(super) fn from_raw(raw: &RawConfig, file: &Path) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::new(file, message);
        let max_connections = raw.database_max_connections;
        if max_connections.is_some_and(|n| !(2..=500).contains(&n)) {
            return Err(err("database_max_connections: must be 2 to 500".into()));
        }
        let statement_timeout = match &raw.database_statement_timeout {
            Some(text) => crate::policy::parse_duration("database_statement_timeout", text)
                .map_err(|e| err(e.to_string()))?,
            None => Duration::from_secs(10),
        };
        if statement_timeout < Duration::from_millis(100) {
            return Err(err(
                "database_statement_timeout: must be at least 100ms".into()
            ));
        }
        let group_commit = group_commit_settings(raw).map_err(err)?;
        let connect_timeout = match &raw.database_connect_timeout {
            Some(text) => crate::policy::parse_duration("database_connect_timeout", text)
                .map_err(|e| err(e.to_string()))?,
            None => DEFAULT_DATABASE_CONNECT_TIMEOUT,
        };
        if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&connect_timeout) {
            return Err(err("database_connect_timeout: must be 1s to 10m".into()));
        }
        if let Some(url) = raw
            .database_url
            .as_deref()
            .filter(|u| !u.trim().is_empty() && u.trim() != EMBEDDED_DATABASE)
            && let Some(why) = crate::ledger::url_problem(url)
        {
            return Err(ConfigError::of(
                Problem::DatabaseUrl,
                file,
                format!("database_url: {:?} {why}", crate::ledger::redacted_url(url)),
            ));
        }
        if let Some(url) = &raw.database_operator_url
            && let Some(why) = crate::ledger::url_problem(url)
        {
            return Err(ConfigError::of(
                Problem::DatabaseUrl,
                file,
                format!(
                    "database_operator_url: {:?} {why}",
                    crate::ledger::redacted_url(url)
                ),
            ));
        }
        let located = DatabaseUrl::resolve(None, None, Some((file, raw.database_url.as_deref())));
        Ok(Self {
            url: located.url,
            url_source: located.source,
            max_connections,
            statement_timeout,
            connect_timeout,
            group_commit,
            operator_url: raw.database_operator_url.clone(),
            migrate: raw.migrate.unwrap_or(true),
        })
    }

    /// Ledger connections of this process: the file's
    /// `database_max_connections`, else 20 for `serve` and 4 for `stdio`
    /// (one agent's process, of which an agent framework may start one per
    /// tool call).
    pub fn connections(&self, stdio: bool) -> u32 {
        self.max_connections.unwrap_or(if stdio { 4 } else { 20 })
    }

    /// Applies the `--database-url` flag and [`DATABASE_URL_ENV`] over the
    /// file's `database_url` (see [`DatabaseUrl::resolve`]).
    pub fn resolve_url(&mut self, flag: Option<&str>) {
        let from_file = match &self.url_source {
            DatabaseUrlSource::ConfigFile(path) => Some((path.clone(), self.url.clone())),
            _ => None,
        };
        let resolved = DatabaseUrl::from_environment(
            flag,
            from_file
                .as_ref()
                .map(|(path, url)| (path.as_path(), Some(url.as_str()))),
        );
        self.url = resolved.url;
        self.url_source = resolved.source;
    }

    /// The ledger's URL and where it came from.
    pub fn located(&self) -> DatabaseUrl {
        DatabaseUrl {
            url: self.url.clone(),
            source: self.url_source.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_url_is_found_flag_first_then_env_then_file_then_default() {
        let file = Path::new("/etc/leasegate.toml");
        let resolve = |flag, env, file_value| {
            let found = DatabaseUrl::resolve(flag, env, Some((file, file_value)));
            (found.url, found.source)
        };
        let (f, e, c) = (
            Some("postgres://flag"),
            Some("postgres://env"),
            Some("postgres://file"),
        );
        assert_eq!(
            resolve(f, e, c),
            ("postgres://flag".into(), DatabaseUrlSource::Flag)
        );
        assert_eq!(
            resolve(None, e, c),
            ("postgres://env".into(), DatabaseUrlSource::Env)
        );
        assert_eq!(
            resolve(None, None, c),
            (
                "postgres://file".into(),
                DatabaseUrlSource::ConfigFile(file.to_owned())
            )
        );
        assert_eq!(
            resolve(None, None, None),
            (DEFAULT_DATABASE_URL.into(), DatabaseUrlSource::Default)
        );
        // Empty values count as absent.
        assert_eq!(
            resolve(Some(""), Some(" "), c).1,
            DatabaseUrlSource::ConfigFile(file.to_owned())
        );
        // No config file at all.
        assert_eq!(
            DatabaseUrl::resolve(None, e, None).source,
            DatabaseUrlSource::Env
        );
        assert_eq!(
            DatabaseUrl::resolve(None, None, None).url,
            DEFAULT_DATABASE_URL
        );
        assert_eq!(
            DatabaseUrlSource::ConfigFile(file.to_owned()).to_string(),
            "database_url in /etc/leasegate.toml"
        );
    }
}
