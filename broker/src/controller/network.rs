//! The controller's Raft network: openraft's RPCs, and proposals forwarded
//! to the leader, as `Controller` API frames on peer links
//! (`crate::peer::PeerLink`) to the other nodes' client ports.
//!
//! Runs on: shard 0, where the controller member runs (the links are
//! shard 0's; a frame that reaches another shard of the peer is handed to
//! its shard 0 there: `router::controller_rpc`).
//!
//! On the wire (`flatbuffers/schema/strand.fbs`, "Controller"): a
//! `ControllerRequest` {op, from, payload} answered by a
//! `ControllerResponse` {error, leader, payload}; the payloads are the JSON
//! of openraft's request and response types (its serde form) or of a
//! [`Command`] and `Result<u64, ControllerError>` (the log index the
//! proposal was applied at). Every call carries the deadline openraft gives
//! it (`RPCOption::hard_ttl`), or [`PROPOSE_TIMEOUT`]: a paused or cut-off
//! peer fails the call, it never hangs the member.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::Serialize;
use strand_net::message::{read_body, TailBuilder};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::{
    Api, ControllerOp, ControllerRequest, ControllerRequestArgs, ControllerResponse, ControllerResponseArgs, Error,
    ErrorArgs, ErrorCode,
};

use super::store::TypeConfig;
use crate::peer::{PeerError, Peers};

/// How long a forwarded proposal may take, end to end.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Refuses a message about broker `claimed` (a vote asked, a lease renewed,
/// an ISR changed as its leader...) from logged-in broker `caller` when
/// they differ: a broker speaks only for itself. `caller` none (`--auth
/// none`): nothing to check. The refusal is `NotAuthorized`'s message.
pub fn sent_by(caller: Option<u64>, claimed: u64, what: &str) -> Result<(), String> {
    match caller {
        Some(node) if claimed == 0 => Err(format!("broker {node} sent {what} that names no broker (node 0)")),
        Some(node) if node != claimed => Err(format!(
            "broker {node} may not send {what} for broker {claimed}: a broker speaks only for itself"
        )),
        _ => Ok(()),
    }
}

/// A controller request's body.
pub fn encode_request(op: ControllerOp, from: u64, payload: &[u8]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let payload = fbb.create_vector(payload);
    let root = ControllerRequest::create(
        &mut fbb,
        &ControllerRequestArgs {
            op,
            from,
            payload: Some(payload),
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Why a controller request was not carried out (the response's `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
    /// The leader this node knows (0: none), for `NotLeader`.
    pub leader: u64,
}

/// A controller response's body: `Ok(payload)` or the refusal.
pub fn encode_response(answer: &Result<Vec<u8>, Refusal>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let (error, leader, payload) = match answer {
        Ok(payload) => (None, 0, Some(fbb.create_vector(payload))),
        Err(r) => {
            let message = fbb.create_string(&r.message);
            let error = Error::create(
                &mut fbb,
                &ErrorArgs {
                    code: r.code,
                    message: Some(message),
                    ..Default::default()
                },
            );
            (Some(error), r.leader, None)
        }
    };
    let root = ControllerResponse::create(&mut fbb, &ControllerResponseArgs { error, leader, payload });
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Reads a controller response's body back.
pub fn decode_response(body: &[u8]) -> Result<Result<Vec<u8>, Refusal>, String> {
    let resp = read_body::<ControllerResponse>(body).map_err(|e| e.to_string())?;
    Ok(match resp.error() {
        Some(e) if e.code() != ErrorCode::None => Err(Refusal {
            code: e.code(),
            message: e.message().unwrap_or_default().to_string(),
            leader: resp.leader(),
        }),
        _ => Ok(resp.payload().map(|p| p.bytes().to_vec()).unwrap_or_default()),
    })
}

/// JSON of a payload (openraft's and the controller's types always serialise).
pub fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    match serde_json::to_vec(value) {
        Ok(v) => v,
        Err(e) => unreachable!("controller messages serialise: {e}"),
    }
}

/// The peer links of shard 0, one per peer address, shared by the Raft
/// network and proposal forwarding.
#[derive(Clone)]
pub struct Links {
    links: Rc<Peers>,
    /// This node's id (the `from` of every request).
    pub from: u64,
}

impl Links {
    pub fn new(from: u64, max_frame_bytes: u32, security: crate::frame_io::PeerSecurity) -> Links {
        Links {
            links: Rc::new(Peers::new(max_frame_bytes, security)),
            from,
        }
    }

    /// Sends `op` with `payload` to the node at `addr` and returns its
    /// answer, within `timeout`.
    pub async fn call(
        &self,
        addr: SocketAddr,
        op: ControllerOp,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Result<Vec<u8>, Refusal>, PeerError> {
        let body = encode_request(op, self.from, payload);
        let frame = self
            .links
            .get(addr)
            .call(Api::Controller, &body, TailBuilder::default(), timeout)
            .await?;
        decode_response(&frame.body).map_err(|message| PeerError::Unreachable {
            addr,
            message: format!("a malformed controller response: {message}"),
        })
    }
}

impl RaftNetworkFactory<TypeConfig> for Links {
    type Network = Connection;
    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Connection {
        Connection {
            target,
            addr: node
                .addr
                .parse()
                .map_err(|_| format!("{:?} is not HOST:PORT", node.addr)),
            links: self.clone(),
        }
    }
}

/// openraft's connection to one member.
pub struct Connection {
    target: u64,
    addr: Result<SocketAddr, String>,
    links: Links,
}

type RpcResult<T, E> = Result<T, RPCError<u64, BasicNode, E>>;

impl Connection {
    async fn rpc<Req: Serialize, Resp: DeserializeOwned, E>(
        &self,
        op: ControllerOp,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, RaftError<u64, E>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let addr = self
            .addr
            .clone()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&std::io::Error::other(e))))?;
        let answer = self
            .links
            .call(addr, op, &to_json(request), option.hard_ttl())
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let payload = answer.map_err(|r| {
            RPCError::Network(NetworkError::new(&std::io::Error::other(format!(
                "node {} refused: {}",
                self.target, r.message
            ))))
        })?;
        let result: Result<Resp, RaftError<u64, E>> = serde_json::from_slice(&payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, RaftError<u64>> {
        self.rpc(ControllerOp::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, openraft::error::InstallSnapshotError>> {
        self.rpc(ControllerOp::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, option: RPCOption) -> RpcResult<VoteResponse<u64>, RaftError<u64>> {
        self.rpc(ControllerOp::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip() {
        let body = encode_request(ControllerOp::Propose, 3, b"{\"x\":1}");
        let req = read_body::<ControllerRequest>(&body).unwrap();
        assert_eq!((req.op(), req.from()), (ControllerOp::Propose, 3));
        assert_eq!(req.payload().unwrap().bytes(), b"{\"x\":1}");

        let ok = Ok(b"[1,2]".to_vec());
        assert_eq!(decode_response(&encode_response(&ok)).unwrap(), ok);
        let refused = Err(Refusal {
            code: ErrorCode::NotLeader,
            message: "node 2 leads".into(),
            leader: 2,
        });
        assert_eq!(decode_response(&encode_response(&refused)).unwrap(), refused);
    }

    #[test]
    fn corrupt_responses_are_errors_not_panics() {
        let good = encode_response(&Ok(vec![7; 40]));
        for cut in 0..good.len() {
            let _ = decode_response(&good[..cut]);
        }
        let mut flipped = good.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = decode_response(&flipped);
            flipped[i] ^= 0xff;
        }
        assert!(decode_response(b"").is_err());
    }
}
