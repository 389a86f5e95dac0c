//! Node operations: DrainBroker (a broker into or out of maintenance,
//! through the controller) and DescribeBroker (the answering broker about
//! itself: its data directory's space).

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, propose_error, request, respond};
use crate::controller::Command;
use crate::shard::messages::WireError;
use crate::shard::Shard;

pub async fn drain(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let req = request::<DrainBrokerRequest>(body)?;
    let command = Command::DrainBroker {
        id: req.node_id(),
        draining: req.draining(),
    };
    let result = crate::router::propose(shard, command).await.map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = DrainBrokerResponse::create(&mut fbb, &DrainBrokerResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

pub fn describe(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    request::<DescribeBrokerRequest>(body)?;
    let space = shard.disk.space().unwrap_or_default();
    let mut fbb = FlatBufferBuilder::new();
    let root = DescribeBrokerResponse::create(
        &mut fbb,
        &DescribeBrokerResponseArgs {
            error: None,
            node_id: shard.config.node_id,
            disk_free_bytes: space.free,
            disk_total_bytes: space.total,
            disk_threshold_bytes: space.threshold,
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
