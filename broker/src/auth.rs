//! Who a connection is, and what it may call.
//!
//! A connection starts unauthenticated. With `--auth scram` it must log in
//! (SASL SCRAM-SHA-256 or -512: `SaslHandshake`, then two
//! `SaslAuthenticate` messages, `handlers::sasl`) before any API other than
//! those three and `ApiVersions`. The user is then its [`Principal`]:
//! - [`Principal::Broker`]: the other brokers. Broker N logs in on every
//!   peer link as `<inter_broker_user>.N` (`inter_broker_user`, default
//!   `strand-broker`: `strand-broker.3` for node 3) with the password every
//!   broker is given in `$STRAND_INTER_BROKER_PASSWORD`, checked against the
//!   key each broker derives from it at start, not against the users table,
//!   so it works before the controller has a table. The SCRAM proof covers
//!   the name, so the login says which node it is; only a broker may call
//!   the internal APIs (`Controller`, `ReplicaFetch`), and only about
//!   itself ([`Principal::node`]): a replica fetch's replica id, a lease
//!   renewal's broker id, a Raft message's sender, an ISR change's leader
//!   must be the logged-in node's (`handlers::replica_fetch`,
//!   `controller::node::Controller::serve`). A client that sends a replica
//!   fetch naming an in-sync follower can no longer move the high
//!   watermark. Every broker knows the one password, so with SCRAM a
//!   broker that is taken over can still log in as another; per-broker
//!   certificates (`--auth mtls`) bind each node's id to its own key.
//! - [`Principal::User`]: a user of the controller's table
//!   (`controller::users`). Superusers (`--superusers`) may do anything
//!   but the internal APIs; any other user what its ACLs allow
//!   (`controller::acls`, checked per request by `handlers::authorize`).
//!
//! With `--auth mtls` there is no login: the listener requires a client
//! certificate (`--tls-client-ca`), and its subject's common name is the
//! principal — `<inter_broker_user>.N` for broker N's own certificate,
//! which it presents on its links (checked at start against `node_id`).
//!
//! With `--auth none` (the default on a loopback address; elsewhere it must
//! be said) nothing is required, as before, and a client may still log in.
//!
//! Runs on: every shard; [`ServerAuth`] is made once at start and shared.

use std::sync::Arc;

use strand_net::scram::{Credential, Mechanism, DEFAULT_ITERATIONS};
use strand_wire::{Api, ErrorCode};

use crate::controller::NodeId;
use crate::shard::messages::WireError;
use crate::shard::Shard;

pub use crate::config::{broker_login, broker_login_node, is_broker_name, AuthMode, DEFAULT_INTER_BROKER_USER};

/// The environment variable with the inter-broker user's password.
pub const INTER_BROKER_PASSWORD_ENV: &str = "STRAND_INTER_BROKER_PASSWORD";
/// The environment variable with the first superusers' password.
pub const BOOTSTRAP_PASSWORD_ENV: &str = "STRAND_BOOTSTRAP_PASSWORD";
/// Keys the inter-broker user's salt (public: a constant, not the password).
const INTER_BROKER_SALT_KEY: &[u8] = b"strand inter-broker salt";

/// With `--auth mtls` the other brokers know this one by its certificate's
/// subject CN, which must be its login name (`<inter_broker_user>.<node_id>`):
/// refused at start otherwise (the cluster could not form).
fn check_broker_certificate(config: &crate::config::BrokerConfig, user: &str) -> Result<(), String> {
    let Some(path) = &config.tls_cert else {
        return Ok(());
    };
    let certs = strand_client::tls::load_certs(path)?;
    let name = certs.first().and_then(|c| subject_common_name(c));
    let expected = broker_login(user, config.node_id);
    match name {
        Some(name) if name == expected => Ok(()),
        other => Err(format!(
            "auth = mtls: tls_cert {} must have exactly one subject CN, {expected:?} (inter_broker_user, \".\", \
             node_id: the other brokers know this one by it); it has {}",
            path.display(),
            other.map_or("none, or several".to_string(), |n| format!("{n:?}"))
        )),
    }
}

/// The subject's common name (CN) of a DER certificate (`--auth mtls`:
/// the connection's principal): only when it has exactly one, in UTF-8
/// (tools differ on which of several they read).
pub fn subject_common_name(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::*;
    let (_, parsed) = X509Certificate::from_der(der).ok()?;
    let mut names = parsed.subject().iter_common_name();
    let cn = names.next()?;
    if names.next().is_some() {
        return None;
    }
    cn.as_str().ok().map(str::to_string)
}

/// Who an authenticated connection is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A broker of the cluster: the node its login or certificate named.
    Broker(NodeId),
    /// A user of the cluster's table.
    User(String),
}

impl Principal {
    /// The node a broker principal is.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            Principal::Broker(node) => Some(*node),
            Principal::User(_) => None,
        }
    }
}

/// Checks that an internal call about broker `claimed` (a replica fetch's
/// replica, a lease renewal's broker, a Raft message's sender) comes from
/// that broker: `caller` is the logged-in broker (none: `--auth none`,
/// where nothing is checked).
pub fn check_sent_by(caller: Option<NodeId>, claimed: NodeId, what: &str) -> Result<(), WireError> {
    crate::controller::network::sent_by(caller, claimed, what).map_err(|e| WireError::new(ErrorCode::NotAuthorized, e))
}

/// The node's authentication settings, shared by its shards.
#[derive(Debug, Default)]
pub struct ServerAuth {
    pub mode: AuthMode,
    pub superusers: Vec<String>,
    pub inter_broker_user: String,
    /// The inter-broker user's keys, one per mechanism (derived at start
    /// from its password), when it has one.
    broker_credentials: Vec<Credential>,
    /// This broker's login on its peer links (as
    /// `<inter_broker_user>.<node_id>`), when it has a password.
    pub login: Option<strand_client::sasl::Credentials>,
    /// Keys the decoy salt an unknown user is shown
    /// (`strand_net::scram::decoy_salt`) until the cluster's own is in the
    /// table (`MetadataTable::decoy_secret`, the same on every broker):
    /// random, this process's.
    pub decoy_secret: Vec<u8>,
}

impl ServerAuth {
    /// From the settings and the environment (the inter-broker password).
    /// `--auth scram` needs that password: the brokers could not reach
    /// one another's internal APIs without it.
    pub fn from_settings(config: &crate::config::BrokerConfig) -> Result<ServerAuth, String> {
        let password = std::env::var(INTER_BROKER_PASSWORD_ENV).ok().filter(|p| !p.is_empty());
        let mode = config.auth.unwrap_or_default();
        if mode == AuthMode::Scram && password.is_none() {
            return Err(format!(
                "auth = scram needs the inter-broker user's password in ${INTER_BROKER_PASSWORD_ENV} (the same on \
                 every broker): brokers log in to one another with it"
            ));
        }
        let user = config.inter_broker_user.clone();
        if mode == AuthMode::Mtls {
            check_broker_certificate(config, &user)?;
        }
        let mut broker_credentials = Vec::new();
        // rand's thread generator is a CSPRNG seeded from the OS.
        let decoy_secret = rand::random::<[u8; 32]>().to_vec();
        let login = match password {
            Some(password) => {
                // The same keys and salt on every broker and every start:
                // the inter-broker user looks like any other user. The
                // salt is public (anyone may ask for it): derived from the
                // name, never from the password.
                for mechanism in Mechanism::ALL {
                    let salt = strand_net::scram::decoy_salt(INTER_BROKER_SALT_KEY, mechanism, &user);
                    let c = Credential::derive(mechanism, password.as_bytes(), &salt, DEFAULT_ITERATIONS)
                        .map_err(|e| e.to_string())?;
                    broker_credentials.push(c);
                }
                Some(strand_client::sasl::Credentials::new(
                    &broker_login(&user, config.node_id),
                    &password,
                ))
            }
            None => None,
        };
        Ok(ServerAuth {
            mode,
            superusers: config.superusers.clone(),
            inter_broker_user: user,
            broker_credentials,
            login,
            decoy_secret,
        })
    }

    /// The key of unknown users' decoy salts: the cluster's, once the
    /// table has it, else this process's.
    pub fn decoy_secret<'a>(&'a self, table: &'a crate::controller::MetadataTable) -> &'a [u8] {
        if table.decoy_secret.is_empty() {
            &self.decoy_secret
        } else {
            &table.decoy_secret
        }
    }

    /// Installs it on a shard (`Shard::ext`).
    pub fn install(shard: &Shard, auth: Arc<ServerAuth>) {
        let _ = shard.ext.get_or_default::<Installed>().0.set(auth);
    }

    /// The shard's settings (none installed: `--auth none`, nothing else).
    pub fn of(shard: &Shard) -> Arc<ServerAuth> {
        shard
            .ext
            .get_or_default::<Installed>()
            .0
            .get_or_init(Arc::default)
            .clone()
    }

    /// `user`'s credential for `mechanism`: a broker's login's (every
    /// `<inter_broker_user>.N` shares the inter-broker user's keys; the
    /// SCRAM proof covers the name) from this node's settings, any other
    /// from the table. The bare inter-broker user logs in as no one.
    pub fn credential(&self, shard: &Shard, user: &str, mechanism: Mechanism) -> Option<Credential> {
        if is_broker_name(&self.inter_broker_user, user) {
            broker_login_node(&self.inter_broker_user, user)?;
            return self
                .broker_credentials
                .iter()
                .find(|c| c.mechanism == mechanism)
                .cloned();
        }
        shard.table().users.get(user)?.credential(mechanism)
    }

    /// The principal of a connection that showed a certificate whose
    /// subject CN is `name` (`--auth mtls`; else none: the connection may
    /// log in with SCRAM).
    pub fn certified(&self, name: Option<String>) -> Option<Principal> {
        match self.mode {
            AuthMode::Mtls => name.map(|n| self.principal(n)),
            AuthMode::None | AuthMode::Scram => None,
        }
    }

    /// Who `user`, just authenticated, is.
    pub fn principal(&self, user: String) -> Principal {
        match broker_login_node(&self.inter_broker_user, &user) {
            Some(node) => Principal::Broker(node),
            None => Principal::User(user),
        }
    }

    /// Whether `user` is a broker's login name.
    pub fn is_broker_login(&self, user: &str) -> bool {
        broker_login_node(&self.inter_broker_user, user).is_some()
    }

    /// Whether `principal` may call `api` at all: the login a listener
    /// requires, and the internal APIs kept to brokers. What a user may do
    /// beyond that is its ACLs' ([`ServerAuth::acl_user`]). The refusal
    /// names the API and the principal.
    pub fn check(&self, principal: Option<&Principal>, api: Api) -> Result<(), WireError> {
        let needs = needs(api);
        if needs == Needs::Anyone {
            return Ok(());
        }
        match (principal, needs) {
            (None, _) if self.mode == AuthMode::None => Ok(()),
            (None, _) if self.mode == AuthMode::Mtls => Err(WireError::new(
                ErrorCode::NotAuthorized,
                format!(
                    "{}: this broker names users by their client certificate's subject CN, and this \
                     connection's certificate has none, or several, or one that is not UTF-8",
                    api.name()
                ),
            )),
            (None, _) => Err(WireError::new(
                ErrorCode::NotAuthorized,
                format!(
                    "{}: this broker requires SASL SCRAM authentication first (strand: --user NAME with the \
                     password in $STRAND_PASSWORD)",
                    api.name()
                ),
            )),
            (Some(Principal::User(name)), Needs::Broker) => Err(WireError::new(
                ErrorCode::NotAuthorized,
                format!("user {name:?} may not call {}: only brokers may", api.name()),
            )),
            (Some(_), _) => Ok(()),
        }
    }

    /// The user whose requests the ACLs decide (`handlers::authorize`):
    /// with `--auth scram` or `mtls`, a user that is not a superuser.
    pub fn acl_user<'a>(&self, principal: Option<&'a Principal>) -> Option<&'a str> {
        match principal {
            Some(Principal::User(name)) if self.mode != AuthMode::None && !self.is_superuser(name) => Some(name),
            _ => None,
        }
    }

    /// Whether `user` with `password` (HTTP basic auth on the metrics
    /// endpoint) is a cluster user that is a superuser or allowed
    /// `describe` on the cluster: `Err` says which it is not. One PBKDF2
    /// per check (the endpoint remembers what it checked).
    pub fn may_read_metrics(
        &self,
        table: &crate::controller::MetadataTable,
        user: &str,
        password: &str,
    ) -> Result<(), MetricsRefusal> {
        let known = table.users.get(user).and_then(|u| {
            u.credential(Mechanism::Sha256)
                .or_else(|| u.credential(Mechanism::Sha512))
        });
        let matched = match known {
            Some(c) => c.matches_password(password.as_bytes()),
            // As long as a known user's check: the time does not tell
            // which names exist.
            None => {
                let salt = strand_net::scram::decoy_salt(self.decoy_secret(table), Mechanism::Sha256, user);
                let _ = Credential::derive(Mechanism::Sha256, password.as_bytes(), &salt, DEFAULT_ITERATIONS);
                false
            }
        };
        if !matched {
            return Err(MetricsRefusal::Unauthenticated);
        }
        self.may_read_metrics_again(table, user)
    }

    /// [`ServerAuth::may_read_metrics`] for a user whose password was
    /// checked lately: its rights only.
    pub fn may_read_metrics_again(
        &self,
        table: &crate::controller::MetadataTable,
        user: &str,
    ) -> Result<(), MetricsRefusal> {
        use crate::controller::acls::{allows, Operation, Resource};
        if self.is_superuser(user) || allows(&table.acls, user, Operation::Describe, &Resource::Cluster) {
            Ok(())
        } else {
            Err(MetricsRefusal::Forbidden)
        }
    }

    pub fn is_superuser(&self, name: &str) -> bool {
        self.superusers.iter().any(|s| s == name)
    }
}

/// Why the metrics endpoint refused a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsRefusal {
    /// No user, an unknown one, or a wrong password (401).
    Unauthenticated,
    /// A user neither superuser nor allowed `describe` on the cluster (403).
    Forbidden,
    /// A password check too soon after the last (429; see
    /// `server::metrics_http`).
    Busy,
}

/// Who may call an API at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Before logging in too.
    Anyone,
    /// A logged-in principal (a user, as its ACLs allow).
    Principal,
    /// Another broker only (internal APIs).
    Broker,
}

fn needs(api: Api) -> Needs {
    match api {
        Api::ApiVersions | Api::SaslHandshake | Api::SaslAuthenticate => Needs::Anyone,
        Api::Controller | Api::ReplicaFetch => Needs::Broker,
        _ => Needs::Principal,
    }
}

/// At a cluster's first start: with `--superusers` and
/// `$STRAND_BOOTSTRAP_PASSWORD`, creates those users with that password
/// (`Command::BootstrapUsers`, which applies only while the cluster never
/// held a user: every node may propose it, and a later start with the
/// variable still set changes nothing). Shard 0, once the node holds the
/// table.
pub async fn bootstrap_superusers(shard: &std::rc::Rc<Shard>, auth: &ServerAuth) {
    ensure_decoy_secret(shard).await;
    use crate::controller::users::StoredCredential;
    let Some(password) = std::env::var(BOOTSTRAP_PASSWORD_ENV).ok().filter(|p| !p.is_empty()) else {
        if auth.mode == AuthMode::Scram && !shard.table().had_users {
            tracing::warn!(
                "authentication is on and the cluster has no users yet: start with --superusers NAME and the \
                 password in ${BOOTSTRAP_PASSWORD_ENV} to create the first"
            );
        }
        return;
    };
    if auth.superusers.is_empty() || shard.table().had_users {
        return;
    }
    let mut users = Vec::with_capacity(auth.superusers.len());
    for name in &auth.superusers {
        let mut credentials = Vec::new();
        for mechanism in Mechanism::ALL {
            match Credential::generate(mechanism, password.as_bytes(), DEFAULT_ITERATIONS) {
                Ok(c) => credentials.push(StoredCredential::from_credential(&c)),
                Err(e) => {
                    tracing::error!("deriving the first superusers' keys: {e}");
                    return;
                }
            }
        }
        users.push((name.clone(), credentials));
    }
    // Until it is committed (the controller may have no leader yet), or
    // another node's bootstrap or a created user made it moot.
    let mut wait = std::time::Duration::from_millis(500);
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        let command = crate::controller::Command::BootstrapUsers { users: users.clone() };
        match shard.propose(command).await {
            Ok(()) => {
                if shard.table().users.keys().any(|u| auth.is_superuser(u)) {
                    tracing::info!(superusers = ?auth.superusers, "the first superusers exist (from ${BOOTSTRAP_PASSWORD_ENV})");
                }
                return;
            }
            Err(e) if std::time::Instant::now() < give_up && !shard.stopping.get() && !shard.table().had_users => {
                tracing::warn!("creating the first superusers (trying again in {wait:?}): {e}");
                glommio::timer::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(10));
            }
            Err(e) => {
                tracing::error!("creating the first superusers: {e}");
                return;
            }
        }
    }
}

/// Gives the cluster its decoy-salt key (`Command::SetDecoySecret`: 32
/// random bytes, applied only while the table has none), so that every
/// broker shows an unknown name the same salt. Shard 0, at start.
async fn ensure_decoy_secret(shard: &std::rc::Rc<Shard>) {
    if !shard.table().decoy_secret.is_empty() {
        return;
    }
    let secret = rand::random::<[u8; 32]>().to_vec();
    if let Err(e) = shard
        .propose(crate::controller::Command::SetDecoySecret { secret })
        .await
    {
        tracing::warn!("giving the cluster its decoy-salt key (asked again at the next start): {e}");
    }
}

#[derive(Default)]
struct Installed(std::cell::OnceCell<Arc<ServerAuth>>);

#[cfg(test)]
mod tests {
    use super::*;

    fn scram() -> ServerAuth {
        ServerAuth {
            mode: AuthMode::Scram,
            superusers: vec!["root".into()],
            inter_broker_user: DEFAULT_INTER_BROKER_USER.into(),
            ..ServerAuth::default()
        }
    }

    #[test]
    fn each_principal_reaches_what_it_may() {
        let auth = scram();
        let user = Principal::User("alice".into());
        let root = Principal::User("root".into());
        for api in Api::ALL {
            let need = needs(api);
            assert_eq!(auth.check(Some(&Principal::Broker(2)), api), Ok(()), "{api:?}");
            assert_eq!(auth.check(None, api).is_ok(), need == Needs::Anyone, "{api:?}");
            assert_eq!(auth.check(Some(&user), api).is_ok(), need != Needs::Broker, "{api:?}");
            assert_eq!(auth.check(Some(&root), api).is_ok(), need != Needs::Broker, "{api:?}");
        }
        // ACLs decide for users, not for superusers or brokers.
        assert_eq!(auth.acl_user(Some(&user)), Some("alice"));
        assert_eq!(auth.acl_user(Some(&root)), None);
        assert_eq!(auth.acl_user(Some(&Principal::Broker(2))), None);
        let refused = auth.check(Some(&user), Api::ReplicaFetch).unwrap_err();
        assert_eq!(refused.code, ErrorCode::NotAuthorized);
        assert!(refused.message.contains("alice") && refused.message.contains("ReplicaFetch"));
    }

    #[test]
    fn without_auth_anyone_may_call_anything_but_a_user_still_not_an_internal_api() {
        let auth = ServerAuth::default();
        for api in Api::ALL {
            assert_eq!(auth.check(None, api), Ok(()), "{api:?}");
        }
        let user = Principal::User("alice".into());
        assert!(auth.check(Some(&user), Api::Controller).is_err());
        assert_eq!(auth.check(Some(&user), Api::DrainBroker), Ok(()));
        assert_eq!(auth.acl_user(Some(&user)), None, "no ACLs without --auth scram");
    }

    #[test]
    fn a_broker_login_names_its_node_and_only_that_spelling_does() {
        let auth = scram();
        assert_eq!(broker_login("strand-broker", 3), "strand-broker.3");
        assert_eq!(auth.principal("strand-broker.3".into()), Principal::Broker(3));
        assert_eq!(auth.principal("strand-broker.3".into()).node(), Some(3));
        for not_a_broker in [
            "strand-broker",
            "strand-broker.",
            "strand-broker.03",
            "strand-broker.+3",
            "strand-broker.x",
            "strand-broker3",
            "other.3",
        ] {
            assert_eq!(broker_login_node("strand-broker", not_a_broker), None, "{not_a_broker}");
        }
        // No user may take a broker's name, the bare one included.
        for taken in ["strand-broker", "strand-broker.3", "strand-broker.x"] {
            assert!(is_broker_name("strand-broker", taken), "{taken}");
        }
        assert!(!is_broker_name("strand-broker", "strand-brokers"));
        assert_eq!(
            auth.principal("strand-broker".into()),
            Principal::User("strand-broker".into())
        );
    }

    #[test]
    fn a_broker_speaks_only_for_itself() {
        assert_eq!(check_sent_by(Some(2), 2, "a replica fetch"), Ok(()));
        let refused = check_sent_by(Some(2), 1, "a replica fetch").unwrap_err();
        assert_eq!(refused.code, ErrorCode::NotAuthorized);
        assert!(
            refused.message.contains("broker 2") && refused.message.contains("broker 1"),
            "{refused:?}"
        );
        // --auth none: no logged-in broker, nothing to check.
        assert_eq!(check_sent_by(None, 1, "a replica fetch"), Ok(()));
    }
}
