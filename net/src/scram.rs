//! SASL SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), both sides,
//! sans I/O: each side takes the other's message as bytes and returns its
//! next one. The broker runs [`ServerExchange`] inside the
//! `SaslAuthenticate` API; the client runs [`ClientExchange`] right after
//! it connects (and after TLS, when there is TLS).
//!
//! # The exchange, byte by byte (UTF-8 text, no line ends)
//! 1. client-first: `n,,n=USER,r=CNONCE` — the GS2 header `n,,` (no channel
//!    binding, no authorisation id: a client asking for either is
//!    refused), the user name with `,` written `=2C` and `=` written `=3D`,
//!    and the client's nonce (printable ASCII without `,`).
//! 2. server-first: `r=CNONCE SNONCE,s=SALT,i=ITERATIONS` — the client's
//!    nonce with the server's appended, the user's salt (base64) and
//!    PBKDF2 iteration count (a client refuses fewer than
//!    [`MIN_ITERATIONS`]).
//! 3. client-final: `c=biws,r=NONCE,p=PROOF` — `biws` is base64 of `n,,`,
//!    `NONCE` the whole nonce of step 2, `PROOF` base64 of
//!    ClientKey XOR HMAC(StoredKey, AuthMessage).
//! 4. server-final: `v=SIGNATURE` — base64 of HMAC(ServerKey,
//!    AuthMessage), which the client checks: the server knew the keys.
//!
//! AuthMessage is client-first without its GS2 header, `,`, server-first,
//! `,`, client-final without `,p=…`. SaltedPassword = PBKDF2-HMAC-H(password,
//! salt, iterations); ClientKey = HMAC(SaltedPassword, "Client Key");
//! StoredKey = H(ClientKey); ServerKey = HMAC(SaltedPassword, "Server
//! Key"). The server keeps only salt, iterations, StoredKey and ServerKey
//! ([`Credential`]): neither the password nor anything that logs in.
//! Passwords are used as their UTF-8 bytes (no SASLprep: as Kafka's
//! clients do; a password with characters SASLprep would map is still
//! accepted by clients that agree on the bytes).
//!
//! A user the server does not know gets a decoy: a salt derived from the
//! name and a server secret (the same every time, and on every server
//! given the same secret) and the default iteration count, and fails at the
//! proof like a wrong password: the exchange does not tell which names
//! exist.

use std::fmt;
use std::num::NonZeroU32;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{digest, hmac, pbkdf2};
use subtle::ConstantTimeEq;

/// Fewest PBKDF2 iterations a credential may have (RFC 7677's minimum).
pub const MIN_ITERATIONS: u32 = 4096;
/// Iterations a new credential gets (Kafka's default).
pub const DEFAULT_ITERATIONS: u32 = 8192;
/// Most iterations accepted (a server sending more makes a client spin).
pub const MAX_ITERATIONS: u32 = 1 << 20;
/// Longest SCRAM message either side accepts.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Longest user name.
pub const MAX_USER_BYTES: usize = 255;

/// A SCRAM hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    /// Both, strongest first.
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha512, Mechanism::Sha256];

    /// The SASL name: `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism a SASL name names.
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Mechanism::Sha256 => hmac::HMAC_SHA256,
            Mechanism::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::Sha256 => &digest::SHA256,
            Mechanism::Sha512 => &digest::SHA512,
        }
    }

    /// Bytes of a key (the hash's output).
    pub fn key_len(self) -> usize {
        self.digest().output_len()
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// A message that is not what this step expects (the text says what).
    #[error("malformed SCRAM message: {0}")]
    Malformed(String),
    /// The proof did not match: a wrong password, or an unknown user.
    #[error("authentication failed: wrong user name or password")]
    WrongPassword,
    /// The server's signature did not match: it does not hold the user's
    /// keys (not the cluster it claims to be).
    #[error("the server's SCRAM signature does not match: it does not know this user's keys")]
    BadServerSignature,
    /// The server refused the exchange (its `e=` answer).
    #[error("the server refused: {0}")]
    Refused(String),
    /// Fewer iterations than [`MIN_ITERATIONS`], or more than [`MAX_ITERATIONS`].
    #[error("{0} PBKDF2 iterations; accepted are {MIN_ITERATIONS} to {MAX_ITERATIONS}")]
    Iterations(u32),
}

/// What the server keeps of a user's password for one mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub mechanism: Mechanism,
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are not for logs.
        f.debug_struct("Credential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// The credential of `password` with `salt`.
    pub fn derive(
        mechanism: Mechanism,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> Result<Credential, ScramError> {
        let salted = salted_password(mechanism, password, salt, iterations)?;
        let client_key = sign(mechanism, &salted, b"Client Key");
        Ok(Credential {
            mechanism,
            salt: salt.to_vec(),
            iterations,
            stored_key: digest::digest(mechanism.digest(), &client_key).as_ref().to_vec(),
            server_key: sign(mechanism, &salted, b"Server Key"),
        })
    }

    /// The credential of `password` with a fresh random salt.
    pub fn generate(mechanism: Mechanism, password: &[u8], iterations: u32) -> Result<Credential, ScramError> {
        Credential::derive(mechanism, password, &random_bytes(16), iterations)
    }

    /// Whether `password` is the one this credential was made from (one
    /// PBKDF2: for a password given in the clear, as HTTP basic auth does).
    pub fn matches_password(&self, password: &[u8]) -> bool {
        match Credential::derive(self.mechanism, password, &self.salt, self.iterations) {
            Ok(derived) => bool::from(derived.stored_key.ct_eq(&self.stored_key)),
            Err(_) => false,
        }
    }

    /// Checks the fields' shape (a credential that came over the wire).
    pub fn check(&self) -> Result<(), ScramError> {
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&self.iterations) {
            return Err(ScramError::Iterations(self.iterations));
        }
        let n = self.mechanism.key_len();
        if self.stored_key.len() != n || self.server_key.len() != n || self.salt.is_empty() || self.salt.len() > 64 {
            return Err(ScramError::Malformed(format!(
                "a {} credential has {n}-byte keys and a salt of 1 to 64 bytes",
                self.mechanism
            )));
        }
        Ok(())
    }
}

fn salted_password(mechanism: Mechanism, password: &[u8], salt: &[u8], iterations: u32) -> Result<Vec<u8>, ScramError> {
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err(ScramError::Iterations(iterations));
    }
    let mut out = vec![0; mechanism.key_len()];
    let rounds = NonZeroU32::new(iterations).expect("at least MIN_ITERATIONS");
    pbkdf2::derive(mechanism.pbkdf2(), rounds, salt, password, &mut out);
    Ok(out)
}

fn sign(mechanism: Mechanism, key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(mechanism.hmac(), key), data)
        .as_ref()
        .to_vec()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    SystemRandom::new()
        .fill(&mut out)
        .expect("the system's random source works");
    out
}

/// The salt a server shows for a user it does not know: 16 bytes of
/// HMAC-SHA-256(`secret`, mechanism name, 0, user name).
pub fn decoy_salt(secret: &[u8], mechanism: Mechanism, user: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(mechanism.name().len() + 1 + user.len());
    data.extend_from_slice(mechanism.name().as_bytes());
    data.push(0);
    data.extend_from_slice(user.as_bytes());
    let mut salt = sign(Mechanism::Sha256, secret, &data);
    salt.truncate(16);
    salt
}

/// A fresh nonce: 24 random bytes, base64 (printable, no `,`).
pub fn new_nonce() -> String {
    BASE64.encode(random_bytes(24))
}

/// `name` as a SCRAM `saslname` (`,` → `=2C`, `=` → `=3D`).
fn escape(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

fn unescape(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("a user name with a bare '='".into())),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(ScramError::Malformed(format!(
            "{} bytes; at most {MAX_MESSAGE_BYTES}",
            message.len()
        )));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("not UTF-8".into()))
}

/// The value of attribute `key` (`k=value`) that `part` must be.
fn attribute<'a>(part: Option<&'a str>, key: char, what: &str) -> Result<&'a str, ScramError> {
    part.and_then(|p| p.strip_prefix(key))
        .and_then(|p| p.strip_prefix('='))
        .ok_or_else(|| ScramError::Malformed(format!("expected {key}= ({what})")))
}

fn valid_nonce(nonce: &str) -> bool {
    !nonce.is_empty() && nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// The client's side of one exchange.
pub struct ClientExchange {
    mechanism: Mechanism,
    password: Vec<u8>,
    first_bare: String,
    nonce: String,
    /// After [`ClientExchange::final_message`]: the server signature to expect.
    expect: Option<Vec<u8>>,
}

impl ClientExchange {
    /// Starts an exchange for `user`; returns it and the client-first
    /// message.
    pub fn start(mechanism: Mechanism, user: &str, password: &[u8]) -> (ClientExchange, Vec<u8>) {
        Self::with_nonce(mechanism, user, password, new_nonce())
    }

    /// [`ClientExchange::start`] with a given nonce (for tests with known
    /// answers).
    pub fn with_nonce(mechanism: Mechanism, user: &str, password: &[u8], nonce: String) -> (ClientExchange, Vec<u8>) {
        let first_bare = format!("n={},r={nonce}", escape(user));
        let first = format!("n,,{first_bare}").into_bytes();
        let exchange = ClientExchange {
            mechanism,
            password: password.to_vec(),
            first_bare,
            nonce,
            expect: None,
        };
        (exchange, first)
    }

    /// Reads server-first; returns client-final.
    pub fn final_message(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let server_first = text(server_first)?;
        if let Some(e) = server_first.strip_prefix("e=") {
            return Err(ScramError::Refused(e.to_string()));
        }
        let mut parts = server_first.split(',');
        let nonce = attribute(parts.next(), 'r', "the nonce")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() || !valid_nonce(nonce) {
            return Err(ScramError::Malformed(
                "the server's nonce does not extend the client's".into(),
            ));
        }
        let salt = BASE64
            .decode(attribute(parts.next(), 's', "the salt")?)
            .map_err(|_| ScramError::Malformed("the salt is not base64".into()))?;
        let iterations: u32 = attribute(parts.next(), 'i', "the iteration count")?
            .parse()
            .map_err(|_| ScramError::Malformed("the iteration count is not a number".into()))?;
        let salted = salted_password(self.mechanism, &self.password, &salt, iterations)?;
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.first_bare);
        let client_key = sign(self.mechanism, &salted, b"Client Key");
        let stored_key = digest::digest(self.mechanism.digest(), &client_key);
        let signature = sign(self.mechanism, stored_key.as_ref(), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let server_key = sign(self.mechanism, &salted, b"Server Key");
        self.expect = Some(sign(self.mechanism, &server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Reads server-final: `Ok` once the server proved it holds the keys.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let server_final = text(server_final)?;
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(ScramError::Refused(e.to_string()));
        }
        let expect = self
            .expect
            .as_ref()
            .ok_or_else(|| ScramError::Malformed("server-final before client-final".into()))?;
        let got = BASE64
            .decode(attribute(Some(server_final), 'v', "the server signature")?)
            .map_err(|_| ScramError::Malformed("the server signature is not base64".into()))?;
        match bool::from(got.ct_eq(expect)) {
            true => Ok(()),
            false => Err(ScramError::BadServerSignature),
        }
    }
}

impl Drop for ClientExchange {
    fn drop(&mut self) {
        self.password.fill(0);
    }
}

/// The server's side of one exchange, after client-first.
pub struct ServerExchange {
    user: String,
    credential: Credential,
    /// The user exists (else `credential` is made up and the proof fails).
    known: bool,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ServerExchange {
    /// Reads client-first; `lookup` gives the user's credential for this
    /// mechanism, if the user exists; `decoy_secret` keys the decoy salt of
    /// a user that does not (see the module doc). Returns the exchange and
    /// server-first.
    pub fn start(
        mechanism: Mechanism,
        client_first: &[u8],
        lookup: impl FnOnce(&str) -> Option<Credential>,
        decoy_secret: &[u8],
    ) -> Result<(ServerExchange, Vec<u8>), ScramError> {
        Self::with_nonce(mechanism, client_first, lookup, decoy_secret, new_nonce())
    }

    /// [`ServerExchange::start`] with a given server nonce (for tests).
    pub fn with_nonce(
        mechanism: Mechanism,
        client_first: &[u8],
        lookup: impl FnOnce(&str) -> Option<Credential>,
        decoy_secret: &[u8],
        server_nonce: String,
    ) -> Result<(ServerExchange, Vec<u8>), ScramError> {
        let client_first = text(client_first)?;
        let bare = match client_first.strip_prefix("n,,") {
            Some(bare) => bare,
            None if client_first.starts_with("p=") || client_first.starts_with("y,") => {
                return Err(ScramError::Malformed("channel binding is not offered".into()))
            }
            None if client_first.starts_with("n,a=") => {
                return Err(ScramError::Malformed("an authorisation id is not supported".into()))
            }
            None => return Err(ScramError::Malformed("expected the GS2 header n,,".into())),
        };
        let mut parts = bare.split(',');
        let user = unescape(attribute(parts.next(), 'n', "the user name")?)?;
        if user.is_empty() || user.len() > MAX_USER_BYTES {
            return Err(ScramError::Malformed(format!(
                "a user name of {} bytes; 1 to {MAX_USER_BYTES}",
                user.len()
            )));
        }
        let client_nonce = attribute(parts.next(), 'r', "the nonce")?;
        if !valid_nonce(client_nonce) {
            return Err(ScramError::Malformed("the nonce is empty or not printable".into()));
        }
        if parts.next().is_some_and(|p| p.starts_with("m=")) {
            return Err(ScramError::Malformed("mandatory extensions are not supported".into()));
        }
        let found = lookup(&user).filter(|c| c.mechanism == mechanism);
        let known = found.is_some();
        let credential = found.unwrap_or_else(|| Credential {
            mechanism,
            salt: decoy_salt(decoy_secret, mechanism, &user),
            iterations: DEFAULT_ITERATIONS,
            stored_key: random_bytes(mechanism.key_len()),
            server_key: random_bytes(mechanism.key_len()),
        });
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let exchange = ServerExchange {
            user,
            credential,
            known,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok((exchange, server_first.into_bytes()))
    }

    /// The user this exchange is for (not yet authenticated).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Reads client-final; on a proof that matches returns the
    /// authenticated user and server-final.
    pub fn finish(self, client_final: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
        let client_final = text(client_final)?;
        let (without_proof, proof) = client_final
            .rsplit_once(",p=")
            .ok_or_else(|| ScramError::Malformed("expected p= (the proof)".into()))?;
        let mut parts = without_proof.split(',');
        if attribute(parts.next(), 'c', "the channel binding")? != "biws" {
            return Err(ScramError::Malformed("the channel binding must be biws (n,,)".into()));
        }
        if attribute(parts.next(), 'r', "the nonce")? != self.nonce {
            return Err(ScramError::Malformed("the nonce is not the exchange's".into()));
        }
        let proof = BASE64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("the proof is not base64".into()))?;
        let mechanism = self.credential.mechanism;
        if proof.len() != mechanism.key_len() {
            return Err(ScramError::WrongPassword);
        }
        let auth_message = format!("{},{},{without_proof}", self.client_first_bare, self.server_first);
        let signature = sign(mechanism, &self.credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let stored = digest::digest(mechanism.digest(), &client_key);
        let matches = bool::from(stored.as_ref().ct_eq(&self.credential.stored_key));
        if !matches || !self.known {
            return Err(ScramError::WrongPassword);
        }
        let server_signature = sign(mechanism, &self.credential.server_key, auth_message.as_bytes());
        Ok((self.user, format!("v={}", BASE64.encode(server_signature)).into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3's example, both sides, byte for byte.
    #[test]
    fn rfc_7677_example() {
        let credential = Credential::derive(
            Mechanism::Sha256,
            b"pencil",
            &BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap(),
            4096,
        )
        .unwrap();
        let (mut client, first) =
            ClientExchange::with_nonce(Mechanism::Sha256, "user", b"pencil", "rOprNGfwEbeRWgbNEkqO".into());
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let (server, server_first) = ServerExchange::with_nonce(
            Mechanism::Sha256,
            &first,
            |u| (u == "user").then(|| credential.clone()),
            b"decoy",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&server_first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let last = client.final_message(&server_first).unwrap();
        assert_eq!(
            std::str::from_utf8(&last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let (user, server_final) = server.finish(&last).unwrap();
        assert_eq!(user, "user");
        assert_eq!(
            std::str::from_utf8(&server_final).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        client.verify(&server_final).unwrap();
    }

    fn exchange(mechanism: Mechanism, user: &str, stored: &Credential, password: &[u8]) -> Result<String, ScramError> {
        let (mut client, first) = ClientExchange::start(mechanism, user, password);
        let (server, server_first) = ServerExchange::start(
            mechanism,
            &first,
            |u| (u == "al,i=ce").then(|| stored.clone()),
            b"decoy",
        )?;
        let last = client.final_message(&server_first)?;
        let (user, server_final) = server.finish(&last)?;
        client.verify(&server_final)?;
        Ok(user)
    }

    #[test]
    fn both_mechanisms_log_in_and_refuse_a_wrong_password_or_user() {
        for mechanism in Mechanism::ALL {
            let stored = Credential::generate(mechanism, b"s3cret", MIN_ITERATIONS).unwrap();
            stored.check().unwrap();
            assert_eq!(exchange(mechanism, "al,i=ce", &stored, b"s3cret").unwrap(), "al,i=ce");
            assert_eq!(
                exchange(mechanism, "al,i=ce", &stored, b"s3creT"),
                Err(ScramError::WrongPassword)
            );
            assert_eq!(
                exchange(mechanism, "bob", &stored, b"s3cret"),
                Err(ScramError::WrongPassword)
            );
        }
        // A credential for the other hash is not this user's.
        let stored = Credential::generate(Mechanism::Sha256, b"s3cret", MIN_ITERATIONS).unwrap();
        assert_eq!(
            exchange(Mechanism::Sha512, "al,i=ce", &stored, b"s3cret"),
            Err(ScramError::WrongPassword)
        );
    }

    /// An unknown name gets the same salt every time (and from every
    /// server with the same secret), as a known one does: asking twice does
    /// not tell them apart.
    #[test]
    fn an_unknown_user_is_not_told_apart_by_its_salt() {
        let salt = |secret: &[u8], user: &str| {
            let first = format!("n,,n={user},r=abc");
            let (_, server_first) =
                ServerExchange::start(Mechanism::Sha256, first.as_bytes(), |_| None, secret).unwrap();
            let text = String::from_utf8(server_first).unwrap();
            text.split(',').nth(1).unwrap().to_string()
        };
        assert_eq!(salt(b"k", "ghost"), salt(b"k", "ghost"));
        assert_ne!(salt(b"k", "ghost"), salt(b"k", "other"));
        assert_ne!(salt(b"k", "ghost"), salt(b"k", "ghost2"));
        assert_ne!(salt(b"k", "ghost"), salt(b"j", "ghost"));
    }

    #[test]
    fn a_server_without_the_keys_is_found_out() {
        let stored = Credential::generate(Mechanism::Sha256, b"pw", MIN_ITERATIONS).unwrap();
        let (mut client, first) = ClientExchange::start(Mechanism::Sha256, "u", b"pw");
        let (_, server_first) =
            ServerExchange::start(Mechanism::Sha256, &first, |_| Some(stored.clone()), b"decoy").unwrap();
        client.final_message(&server_first).unwrap();
        let forged = format!("v={}", BASE64.encode([7u8; 32]));
        assert_eq!(client.verify(forged.as_bytes()), Err(ScramError::BadServerSignature));
    }

    #[test]
    fn malformed_messages_are_refused_with_a_reason() {
        let lookup = |_: &str| None;
        for bad in [
            &b""[..],
            b"y,,n=u,r=abc",
            b"n,a=x,n=u,r=abc",
            b"n,,n=u",
            b"n,,n=,r=abc",
            b"n,,n=a=b,r=abc",
            b"n,,n=u,r=a b",
            b"n,,n=u,r=abc,m=ext",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(
                    ServerExchange::start(Mechanism::Sha256, bad, lookup, b"decoy"),
                    Err(ScramError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        let (mut client, _) = ClientExchange::with_nonce(Mechanism::Sha256, "u", b"pw", "abc".into());
        for bad in [
            &b"r=xyz1,s=AAAA,i=4096"[..],
            b"r=abc,s=AAAA,i=4096",
            b"r=abcd,s=!!,i=4096",
            b"r=abcd,s=AAAA,i=many",
        ] {
            assert!(
                matches!(client.final_message(bad), Err(ScramError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            client.final_message(b"r=abcd,s=AAAA,i=1"),
            Err(ScramError::Iterations(1))
        );
        assert_eq!(
            client.final_message(b"e=other-error"),
            Err(ScramError::Refused("other-error".into()))
        );
        // A proof for another nonce is malformed; a garbled one is wrong.
        let stored = Credential::generate(Mechanism::Sha256, b"pw", MIN_ITERATIONS).unwrap();
        let (server, server_first) =
            ServerExchange::start(Mechanism::Sha256, b"n,,n=u,r=abc", |_| Some(stored.clone()), b"decoy").unwrap();
        let nonce = std::str::from_utf8(&server_first).unwrap()[2..]
            .split(',')
            .next()
            .unwrap()
            .to_string();
        assert!(matches!(
            ServerExchange::start(Mechanism::Sha256, b"n,,n=u,r=abc", |_| Some(stored.clone()), b"decoy")
                .unwrap()
                .0
                .finish(b"c=biws,r=other,p=AAAA"),
            Err(ScramError::Malformed(_))
        ));
        assert_eq!(
            server.finish(format!("c=biws,r={nonce},p=AAAA").as_bytes()),
            Err(ScramError::WrongPassword)
        );
    }

    #[test]
    fn a_credential_knows_its_password() {
        let c = Credential::generate(Mechanism::Sha256, b"pw", MIN_ITERATIONS).unwrap();
        assert!(c.matches_password(b"pw"));
        assert!(!c.matches_password(b"pW"));
    }

    #[test]
    fn credentials_out_of_shape_are_refused() {
        let good = Credential::generate(Mechanism::Sha512, b"pw", MIN_ITERATIONS).unwrap();
        assert_eq!(good.check(), Ok(()));
        let few = Credential {
            iterations: 100,
            ..good.clone()
        };
        assert_eq!(few.check(), Err(ScramError::Iterations(100)));
        let short = Credential {
            stored_key: vec![0; 32],
            ..good.clone()
        };
        assert!(matches!(short.check(), Err(ScramError::Malformed(_))));
        assert!(!format!("{good:?}").contains("key"), "keys stay out of Debug");
    }
}
