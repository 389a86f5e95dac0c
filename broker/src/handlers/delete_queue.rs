//! DeleteQueue: remove a queue (its partitions' files go on every shard).

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, propose_error, request, respond, user_queue_name};
use crate::controller::Command;
use crate::shard::messages::WireError;
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let name = user_queue_name(request::<DeleteQueueRequest>(body)?.name())?;
    let result = shard
        .propose(Command::DeleteQueue { name })
        .await
        .map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = DeleteQueueResponse::create(&mut fbb, &DeleteQueueResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
