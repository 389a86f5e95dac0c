//! The one error type of the client.

use strand_wire::ErrorCode;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The broker answered with an error; with `NotLeader`, maybe the
    /// partition's leader as that broker knows it.
    #[error("{message} ({code:?})")]
    Broker {
        code: ErrorCodeName,
        message: String,
        leader: Option<LeaderHint>,
    },
    #[error("connection to {addr}: {message}")]
    Io { addr: String, message: String },
    /// TLS refused the connection: the broker's certificate (unknown
    /// issuer, wrong name, expired), or an alert from the broker (a client
    /// certificate it wanted or refused). Not retried: it does not mend by
    /// itself. (A connection closed during the handshake is `Io`.)
    #[error("TLS with {addr}: {message}")]
    Tls { addr: String, message: String },
    /// The SCRAM exchange failed on this side: the broker did not prove it
    /// holds the user's keys, or sent a malformed message. (A wrong user or
    /// password is the broker's `AuthenticationFailed`.) Not retried.
    #[error("authentication: {0} (AuthenticationFailed)")]
    Authentication(String),
    /// The broker's answer could not be read.
    #[error("bad response: {0}")]
    Protocol(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A record is larger than the queue (or the producer's buffer) takes.
    #[error("a record of {bytes} bytes (as a batch) is over the limit of {limit} bytes (MessageTooLarge)")]
    MessageTooLarge { bytes: usize, limit: usize },
    /// The producer's buffer is full and it was told not to wait.
    #[error("the producer's buffer is full ({buffered} of {limit} bytes waiting for acknowledgement)")]
    BufferFull { buffered: usize, limit: usize },
    /// Retries ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The producer or consumer was dropped or closed.
    #[error("the client was closed")]
    Closed,
}

/// A partition's leader as a broker named it in a `NotLeader` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderHint {
    pub node: u32,
    pub leader_epoch: u32,
}

/// An error code with its name, for messages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ErrorCodeName(pub ErrorCode);

impl std::fmt::Debug for ErrorCodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.variant_name().unwrap_or("unknown error"))
    }
}

impl ClientError {
    pub fn broker(code: ErrorCode, message: impl Into<String>) -> ClientError {
        ClientError::Broker {
            code: ErrorCodeName(code),
            message: message.into(),
            leader: None,
        }
    }

    /// The leader a `NotLeader` answer named, if it named one.
    pub fn leader_hint(&self) -> Option<LeaderHint> {
        match self {
            ClientError::Broker { leader, .. } => *leader,
            _ => None,
        }
    }

    /// The broker's error code, if the broker answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Broker { code, .. } => Some(code.0),
            _ => None,
        }
    }

    /// Whether the partition's leader may have moved (or the connection to
    /// it broke): metadata should be asked for again before retrying.
    pub fn leader_moved(&self) -> bool {
        self.is_io()
            || matches!(
                self.code(),
                Some(ErrorCode::NotLeader | ErrorCode::UnknownQueue | ErrorCode::UnknownPartition)
            )
    }

    /// Whether the connection failed (as opposed to an answer).
    pub fn is_io(&self) -> bool {
        matches!(self, ClientError::Io { .. })
    }

    /// Turns an `Error` table from a response into a result.
    pub fn check(error: Option<strand_wire::Error<'_>>) -> Result<(), ClientError> {
        match error {
            Some(e) if e.code() != ErrorCode::None => Err(ClientError::Broker {
                code: ErrorCodeName(e.code()),
                message: e.message().unwrap_or_default().to_string(),
                leader: e
                    .leader()
                    .zip(e.leader_epoch())
                    .map(|(node, leader_epoch)| LeaderHint { node, leader_epoch }),
            }),
            _ => Ok(()),
        }
    }
}
