//! Node operations: DrainBroker (a broker into or out of maintenance),
//! DecommissionBroker (every replica off a broker) and ReassignPartition
//! (a partition's replicas elsewhere), each a controller command; and
//! DescribeBroker (the answering broker about itself: its data directory's
//! space); and ElectLeaders (an operator's unclean election of offline
//! partitions).

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::{FlatBufferBuilder, WIPOffset};
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
    propose_and_answer(shard, header, command, |fbb, error| {
        let root = DrainBrokerResponse::create(fbb, &DrainBrokerResponseArgs { error });
        fbb.finish_minimal(root);
    })
    .await
}

pub async fn decommission(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let req = request::<DecommissionBrokerRequest>(body)?;
    let id = req.node_id();
    if req.cancel_node_id() != 0 {
        let id = req.cancel_node_id();
        return propose_and_answer(shard, header, Command::CancelDecommission { id }, |fbb, error| {
            let root = DecommissionBrokerResponse::create(fbb, &DecommissionBrokerResponseArgs { error });
            fbb.finish_minimal(root);
        })
        .await;
    }
    // The voters are fixed (`controller_voters`): one decommissioned and
    // switched off would leave the controller a voter short for good.
    let config = &shard.config;
    let voter = match config.controller_voters.is_empty() {
        true => id == config.node_id,
        false => config.controller_voters.iter().any(|v| v.id == id),
    };
    if voter {
        return Err(WireError::new(
            ErrorCode::InvalidConfig,
            format!(
                "broker {id} is a controller voter: the voters are fixed (controller_voters), and one switched off \
                 would leave the controller a voter short for good; decommission brokers that do not vote"
            ),
        ));
    }
    let command = Command::DecommissionBroker { id };
    propose_and_answer(shard, header, command, |fbb, error| {
        let root = DecommissionBrokerResponse::create(fbb, &DecommissionBrokerResponseArgs { error });
        fbb.finish_minimal(root);
    })
    .await
}

pub async fn reassign(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let req = request::<ReassignPartitionRequest>(body)?;
    let command = Command::ReassignPartition {
        queue: req.queue().unwrap_or_default().to_string(),
        partition: req.partition(),
        replicas: req.replicas().map(|r| r.iter().collect()).unwrap_or_default(),
    };
    propose_and_answer(shard, header, command, |fbb, error| {
        let root = ReassignPartitionResponse::create(fbb, &ReassignPartitionResponseArgs { error });
        fbb.finish_minimal(root);
    })
    .await
}

pub async fn elect(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let req = request::<ElectLeadersRequest>(body)?;
    if !req.unclean() {
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            "only unclean elections are asked for (preferred leaders come back by leader balancing)",
        ));
    }
    let queue = req.queue().unwrap_or_default().to_string();
    tracing::warn!(
        "unclean election asked for {queue}/{}: records only the missing replicas hold are given up",
        req.partition().map_or("*".to_string(), |p| p.to_string())
    );
    // One partition without a named replica: the choice is made here, on
    // this node's table, and named in the command (every controller
    // member then applies the same one).
    let replica = req.replica().or_else(|| {
        let table = shard.table();
        let p = table.queue(&queue)?.partitions.get(req.partition()? as usize)?;
        crate::controller::stm::unclean_candidate(&table, p)
    });
    let command = Command::ElectUnclean {
        queue,
        partition: req.partition(),
        replica,
    };
    propose_and_answer(shard, header, command, |fbb, error| {
        let root = ElectLeadersResponse::create(fbb, &ElectLeadersResponseArgs { error });
        fbb.finish_minimal(root);
    })
    .await
}

/// Commits `command` through the controller and answers with the
/// response `finish` builds around the error (none: done).
async fn propose_and_answer(
    shard: &Rc<Shard>,
    header: FrameHeader,
    command: Command,
    finish: impl FnOnce(&mut FlatBufferBuilder<'static>, Option<WIPOffset<Error<'static>>>),
) -> Result<OutFrame, WireError> {
    let result = shard.propose(command).await.map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    finish(&mut fbb, error);
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
