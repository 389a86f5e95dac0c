//! SaslHandshake and SaslAuthenticate: a connection logs in (`crate::auth`
//! says what it may do then; `strand_net::scram` has the exchange byte by
//! byte).
//!
//! A connection's login state is in its `ConnectionState`: the mechanism
//! the handshake chose, then the exchange after client-first, then the
//! principal after a client-final whose proof matched. A failed step
//! leaves the connection unauthenticated (it may start again) and is
//! answered `AuthenticationFailed` after a short pause, which slows a
//! password guessed on one connection.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::scram::{Mechanism, ScramError, ServerExchange};
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, request, respond};
use crate::auth::{Principal, ServerAuth};
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// How long a failed login waits before it is answered.
const FAILURE_PAUSE: Duration = Duration::from_millis(200);

/// One connection's login.
#[derive(Default)]
pub struct Login {
    /// Who it is, once logged in.
    pub principal: Option<Principal>,
    /// The user's record its exchange checked the proof against (a user
    /// of the table): the session lasts while the table holds it.
    pub record: Option<crate::controller::users::UserRecord>,
    step: Step,
}

impl Login {
    /// Logged in already as `principal` (its certificate named it), or not.
    pub fn new(principal: Option<Principal>) -> Login {
        Login {
            principal,
            record: None,
            step: Step::Idle,
        }
    }
}

#[derive(Default)]
enum Step {
    /// No exchange begun.
    #[default]
    Idle,
    /// The handshake chose the mechanism: client-first next.
    Chosen(Mechanism),
    /// Client-first answered: client-final next.
    Challenged(Box<ServerExchange>),
}

pub async fn handshake(
    shard: &Rc<Shard>,
    login: &RefCell<Login>,
    header: FrameHeader,
    body: &[u8],
) -> Result<OutFrame, WireError> {
    let asked = request::<SaslHandshakeRequest>(body)?
        .mechanism()
        .unwrap_or_default()
        .to_string();
    let mtls = ServerAuth::of(shard).mode == crate::auth::AuthMode::Mtls;
    let result = match Mechanism::from_name(&asked) {
        _ if mtls => Err(WireError::new(
            ErrorCode::InvalidRequest,
            "this broker names users by their client certificate (--auth mtls): connect without --user or \
             $STRAND_USER",
        )),
        _ if login.borrow().principal.is_some() => Err(WireError::new(
            ErrorCode::InvalidRequest,
            "this connection is already authenticated",
        )),
        Some(mechanism) => {
            login.borrow_mut().step = Step::Chosen(mechanism);
            Ok(())
        }
        None => {
            shard.metrics.authentication_failed("malformed");
            Err(WireError::new(
                ErrorCode::AuthenticationFailed,
                format!("unsupported SASL mechanism {asked:?}: this broker takes SCRAM-SHA-512 and SCRAM-SHA-256"),
            ))
        }
    };
    let mut fbb = FlatBufferBuilder::new();
    let names: Vec<_> = Mechanism::ALL.iter().map(|m| fbb.create_string(m.name())).collect();
    let mechanisms = Some(fbb.create_vector(&names));
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = SaslHandshakeResponse::create(&mut fbb, &SaslHandshakeResponseArgs { error, mechanisms });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

pub async fn authenticate(
    shard: &Rc<Shard>,
    login: &RefCell<Login>,
    header: FrameHeader,
    body: &[u8],
) -> Result<OutFrame, WireError> {
    let message = request::<SaslAuthenticateRequest>(body)?
        .auth_bytes()
        .map(|b| b.bytes().to_vec())
        .unwrap_or_default();
    let result = step(shard, login, &message);
    if let Err(e) = &result {
        if e.code == ErrorCode::AuthenticationFailed {
            glommio::timer::sleep(FAILURE_PAUSE).await;
        }
    }
    let mut fbb = FlatBufferBuilder::new();
    let auth_bytes = result.as_ref().ok().map(|m| fbb.create_vector(m));
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = SaslAuthenticateResponse::create(&mut fbb, &SaslAuthenticateResponseArgs { error, auth_bytes });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

/// The next step of the connection's exchange: the message to answer with.
fn step(shard: &Rc<Shard>, login: &RefCell<Login>, message: &[u8]) -> Result<Vec<u8>, WireError> {
    let auth = ServerAuth::of(shard);
    let taken = std::mem::take(&mut login.borrow_mut().step);
    let failed = |e: ScramError| {
        let reason = match e {
            ScramError::WrongPassword => "wrong_password",
            _ => "malformed",
        };
        shard.metrics.authentication_failed(reason);
        WireError::new(ErrorCode::AuthenticationFailed, e.to_string())
    };
    match taken {
        Step::Idle => Err(WireError::new(
            ErrorCode::InvalidRequest,
            "SaslAuthenticate before SaslHandshake",
        )),
        Step::Chosen(mechanism) => {
            let table = shard.table();
            let (exchange, server_first) = ServerExchange::start(
                mechanism,
                message,
                |user| auth.credential(shard, user, mechanism),
                auth.decoy_secret(&table),
            )
            .map_err(failed)?;
            // Users are in the table, which a starting broker may not hold
            // yet: a client retries (the other brokers' login needs none).
            if !shard.serving.get() && !auth.is_broker_login(exchange.user()) {
                return Err(WireError::new(
                    ErrorCode::ControllerUnavailable,
                    "the broker is starting; retry",
                ));
            }
            let mut login = login.borrow_mut();
            login.record = table.users.get(exchange.user()).cloned();
            login.step = Step::Challenged(Box::new(exchange));
            Ok(server_first)
        }
        Step::Challenged(exchange) => {
            let (user, server_final) = exchange.finish(message).map_err(failed)?;
            tracing::debug!(%user, "a connection logged in");
            login.borrow_mut().principal = Some(auth.principal(user));
            Ok(server_final)
        }
    }
}
