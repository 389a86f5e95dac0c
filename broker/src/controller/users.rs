//! SASL users as the controller keeps them: per user, one SCRAM credential
//! per mechanism (salt, iterations, StoredKey, ServerKey: what
//! `strand_net::scram` needs to check a login, and nothing that logs in).
//! Created by `strand user create` (which derives the keys from the
//! password on the operator's machine), by `BootstrapUsers` at a cluster's
//! first start (`--superusers` with `STRAND_BOOTSTRAP_PASSWORD`), and
//! replicated with the rest of the table, so every broker checks a login
//! on its own.
//!
//! # Encoding
//! In the table's JSON (snapshots, `Command::PutUser` entries): a user is
//! `{"credentials": [{"mechanism": "SCRAM-SHA-256", "salt": [..],
//! "iterations": 8192, "stored_key": [..], "server_key": [..]}]}`, bytes
//! as arrays of numbers.
//!
//! Runs on: shard 0 (the state machine applies them); every shard reads
//! them from its table copy when a client authenticates.

use serde::{Deserialize, Serialize};
use strand_net::scram::{Credential, Mechanism};

use super::error::ControllerError;

/// Longest user name (SCRAM's limit here).
pub const USER_NAME_MAX: usize = strand_net::scram::MAX_USER_BYTES;

/// A user: its credentials, one per mechanism.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub credentials: Vec<StoredCredential>,
}

impl UserRecord {
    /// Its credential for `mechanism`, if it has one.
    pub fn credential(&self, mechanism: Mechanism) -> Option<Credential> {
        self.credentials
            .iter()
            .find(|c| c.mechanism == mechanism.name())
            .and_then(|c| c.to_credential().ok())
    }

    /// The mechanisms it can log in with.
    pub fn mechanisms(&self) -> Vec<&str> {
        self.credentials.iter().map(|c| c.mechanism.as_str()).collect()
    }
}

/// One mechanism's credential, as stored (`strand_net::scram::Credential`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCredential {
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are not for logs.
        f.debug_struct("StoredCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl StoredCredential {
    pub fn from_credential(c: &Credential) -> StoredCredential {
        StoredCredential {
            mechanism: c.mechanism.name().to_string(),
            salt: c.salt.clone(),
            iterations: c.iterations,
            stored_key: c.stored_key.clone(),
            server_key: c.server_key.clone(),
        }
    }

    /// The credential, checked (mechanism known, iterations and key sizes).
    pub fn to_credential(&self) -> Result<Credential, ControllerError> {
        let mechanism = Mechanism::from_name(&self.mechanism).ok_or_else(|| {
            ControllerError::InvalidUser(format!(
                "unknown mechanism {:?} (SCRAM-SHA-256 or SCRAM-SHA-512)",
                self.mechanism
            ))
        })?;
        let c = Credential {
            mechanism,
            salt: self.salt.clone(),
            iterations: self.iterations,
            stored_key: self.stored_key.clone(),
            server_key: self.server_key.clone(),
        };
        c.check().map_err(|e| ControllerError::InvalidUser(e.to_string()))?;
        Ok(c)
    }
}

/// Refuses a user name that is empty, too long, or has control characters.
pub fn check_name(name: &str) -> Result<(), ControllerError> {
    if name.is_empty() || name.len() > USER_NAME_MAX || name.chars().any(char::is_control) {
        return Err(ControllerError::InvalidUser(format!(
            "user name {name:?}: 1 to {USER_NAME_MAX} bytes, no control characters"
        )));
    }
    Ok(())
}

/// Refuses credentials that do not check, repeat a mechanism, or are none.
pub fn check_credentials(credentials: &[StoredCredential]) -> Result<(), ControllerError> {
    if credentials.is_empty() {
        return Err(ControllerError::InvalidUser(
            "a user needs at least one credential".into(),
        ));
    }
    for (i, c) in credentials.iter().enumerate() {
        c.to_credential()?;
        if credentials[..i].iter().any(|o| o.mechanism == c.mechanism) {
            return Err(ControllerError::InvalidUser(format!("two {} credentials", c.mechanism)));
        }
    }
    Ok(())
}
