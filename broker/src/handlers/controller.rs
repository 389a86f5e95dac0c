//! Controller: another node's controller member talking to this one (Raft
//! votes, log entries, snapshots) or a proposal forwarded to this node as
//! the controller leader. The body's payload goes to the member on shard 0
//! (`crate::router::controller_rpc`); byte layout in
//! `crate::controller::network`.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::ControllerRequest;

use super::request;
use crate::controller::network::encode_response;
use crate::shard::messages::WireError;
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let req = request::<ControllerRequest>(body)?;
    let payload = req.payload().map(|p| p.bytes().to_vec()).unwrap_or_default();
    let answer = crate::router::controller_rpc(shard, req.op(), payload).await;
    Ok(OutFrame::new(header, &encode_response(&answer), TailBuilder::default()))
}
