//! Logging in: SASL SCRAM on a connection right after it opens (and after
//! TLS), before any other request.
//!
//! A process sets its credentials once ([`set_default`], as the CLI does
//! from `--user`/`$STRAND_USER` and `$STRAND_PASSWORD`); every connection
//! the library opens from then on logs in with them ([`log_in`]):
//! `SaslHandshake` with the mechanism, then `SaslAuthenticate` with
//! client-first and with client-final (`strand_net::scram` has the
//! messages byte by byte). A wrong user or password fails the connection
//! with `AuthenticationFailed` (not retried); a broker that does not prove
//! it holds the user's keys fails it too.
//!
//! The request bodies and response readers here are pure: the broker's
//! peer links use them to log in as the inter-broker user.

use std::sync::{Arc, RwLock};

use strand_net::message::read_body;
use strand_net::scram::{ClientExchange, Mechanism};
use strand_net::Frame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use crate::error::ClientError;

/// The environment variable the CLI reads the user name from (`--user`
/// wins).
pub const USER_ENV: &str = "STRAND_USER";
/// The environment variable the CLI reads the password from (never a flag).
pub const PASSWORD_ENV: &str = "STRAND_PASSWORD";
/// Or the file whose first line is the password (kept off the process's
/// environment and command line, e.g. by an Ansible play).
pub const PASSWORD_FILE_ENV: &str = "STRAND_PASSWORD_FILE";

/// A user and password to log in with.
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    password: Arc<Vec<u8>>,
    pub mechanism: Mechanism,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is not for logs.
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("mechanism", &self.mechanism)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// `user` with `password`, logging in with SCRAM-SHA-512.
    pub fn new(user: &str, password: &str) -> Credentials {
        Credentials {
            user: user.to_string(),
            password: Arc::new(password.as_bytes().to_vec()),
            mechanism: Mechanism::Sha512,
        }
    }

    /// The user `flag` names (else `$STRAND_USER`) with the password in
    /// `$STRAND_PASSWORD`; `None` when no user is named. A user without a
    /// password is refused.
    pub fn from_env(flag: Option<&str>) -> Result<Option<Credentials>, ClientError> {
        let user = match flag {
            Some(user) => user.to_string(),
            None => match std::env::var(USER_ENV) {
                Ok(user) if !user.is_empty() => user,
                _ => return Ok(None),
            },
        };
        let mut password = std::env::var(PASSWORD_ENV).unwrap_or_default();
        if password.is_empty() {
            if let Some(path) = std::env::var_os(PASSWORD_FILE_ENV).filter(|p| !p.is_empty()) {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ClientError::Invalid(format!(
                        "reading the password from {} (${PASSWORD_FILE_ENV}): {e}",
                        std::path::Path::new(&path).display()
                    ))
                })?;
                password = text.lines().next().unwrap_or_default().to_string();
            }
        }
        if password.is_empty() {
            return Err(ClientError::Invalid(format!(
                "user {user:?} needs its password in ${PASSWORD_ENV} or a file named by ${PASSWORD_FILE_ENV} \
                 (passwords are never taken as flags)"
            )));
        }
        Ok(Some(Credentials::new(&user, &password)))
    }
}

static DEFAULT: RwLock<Option<Credentials>> = RwLock::new(None);

/// Sets (or clears) the credentials every connection this process opens
/// from now on logs in with.
pub fn set_default(credentials: Option<Credentials>) {
    *DEFAULT.write().unwrap_or_else(|e| e.into_inner()) = credentials;
}

/// The credentials new connections log in with, if set.
pub fn default_credentials() -> Option<Credentials> {
    DEFAULT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A `SaslHandshake` body for `mechanism`.
pub fn handshake_request(mechanism: Mechanism) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let name = fbb.create_string(mechanism.name());
    let root = SaslHandshakeRequest::create(&mut fbb, &SaslHandshakeRequestArgs { mechanism: Some(name) });
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Reads a `SaslHandshake` answer: `Ok` once the mechanism is taken.
pub fn handshake_answer(frame: &Frame) -> Result<(), ClientError> {
    let r = read_body::<SaslHandshakeResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    ClientError::check(r.error())
}

/// A `SaslAuthenticate` body carrying one SCRAM message.
pub fn authenticate_request(message: &[u8]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let bytes = fbb.create_vector(message);
    let root = SaslAuthenticateRequest::create(
        &mut fbb,
        &SaslAuthenticateRequestArgs {
            auth_bytes: Some(bytes),
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Reads a `SaslAuthenticate` answer: the broker's SCRAM message.
pub fn authenticate_answer(frame: &Frame) -> Result<Vec<u8>, ClientError> {
    let r = read_body::<SaslAuthenticateResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    ClientError::check(r.error())?;
    Ok(r.auth_bytes().map(|b| b.bytes().to_vec()).unwrap_or_default())
}

/// Runs one login with `call` sending a request (API and body) and
/// returning its answer: handshake, client-first, client-final, and the
/// broker's signature checked. A SCRAM failure on this side (a broker
/// without the user's keys, a malformed message) is
/// `ClientError::Authentication`.
pub async fn exchange(
    credentials: &Credentials,
    mut call: impl AsyncFnMut(Api, Vec<u8>) -> Result<Frame, ClientError>,
) -> Result<(), ClientError> {
    let failed = |e: strand_net::scram::ScramError| ClientError::Authentication(e.to_string());
    handshake_answer(&call(Api::SaslHandshake, handshake_request(credentials.mechanism)).await?)?;
    let (mut scram, first) = ClientExchange::start(credentials.mechanism, &credentials.user, &credentials.password);
    let server_first = authenticate_answer(&call(Api::SaslAuthenticate, authenticate_request(&first)).await?)?;
    let last = scram.final_message(&server_first).map_err(failed)?;
    let server_final = authenticate_answer(&call(Api::SaslAuthenticate, authenticate_request(&last)).await?)?;
    scram.verify(&server_final).map_err(failed)
}
