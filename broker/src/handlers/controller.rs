//! Controller: another node's controller member talking to this one (Raft
//! votes, log entries, snapshots) or a proposal forwarded to this node as
//! the controller leader. The body's payload goes to the member on shard 0
//! (`crate::router::controller_rpc`); byte layout in
//! `crate::controller::network`.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::{ControllerRequest, ErrorCode};

use super::request;
use crate::controller::network::encode_response;
use crate::controller::NodeId;
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// `caller` is the logged-in broker that sent it (none: `--auth none`),
/// which must be the node the request says it is from; the member checks
/// what the payload says about its sender (`Controller::serve`).
pub async fn handle(
    shard: &Rc<Shard>,
    header: FrameHeader,
    body: &[u8],
    caller: Option<NodeId>,
) -> Result<OutFrame, WireError> {
    let req = request::<ControllerRequest>(body)?;
    crate::auth::check_sent_by(caller, req.from(), "a controller message")?;
    let payload = req.payload().map(|p| p.bytes().to_vec()).unwrap_or_default();
    let answer = crate::router::controller_rpc(shard, req.op(), payload, caller).await;
    if matches!(&answer, Err(r) if r.code == ErrorCode::NotAuthorized) {
        shard.metrics.denied("Controller");
    }
    Ok(OutFrame::new(header, &encode_response(&answer), TailBuilder::default()))
}
