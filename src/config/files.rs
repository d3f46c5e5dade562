//! Reading the files a configuration is made of: any TOML file into its
//! raw (serde) form, the policy file, adapter files, and the `*.toml` of an
//! adapters directory. Errors name the file; a parse error is serde's own
//! message (which names the field and, for an unknown one, every accepted
//! field).

use std::path::{Path, PathBuf};

use super::error::ConfigError;
use crate::adapter::{Adapter, RawAdapter};
use crate::policy::{Policy, RawPolicy};

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::new(path, format!("cannot read: {e}")))
}

/// `path` read and parsed into its raw form.
pub(super) fn parse<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    toml::from_str(&read(path)?)
        .map_err(|e| ConfigError::new(path, e.to_string().trim_end().to_owned()))
}

/// Loads and validates one policy file.
/// Its encryption keys are read too: a missing or malformed key is an
/// error here, at startup, never a body stored in plaintext later.
pub fn load_policy(path: &Path) -> Result<Policy, ConfigError> {
    let mut policy = parse::<RawPolicy>(path)?
        .validate()
        .map_err(|e| ConfigError::new(path, e.to_string()))?;
    policy
        .load_keys(path.parent().unwrap_or(Path::new(".")))
        .map_err(|e| ConfigError::new(path, e.to_string()))?;
    Ok(policy)
}

/// Loads and validates one adapter file.
pub fn load_adapter(path: &Path) -> Result<Adapter, ConfigError> {
    parse::<RawAdapter>(path)?
        .validate()
        .map_err(|e| ConfigError::new(path, e.to_string()))
}

/// Every `*.toml` of a directory, sorted by name.
pub(super) fn toml_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(dir, format!("cannot read directory: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    Ok(files)
}
