//! AlterAcls and ListAcls: the cluster's ACL entries
//! (`controller::acls`). Only superusers, users allowed `admin` on the
//! cluster, and brokers reach them when authentication is on
//! (`crate::auth`).

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, propose_error, request, respond};
use crate::controller::acls::{AclEntry, Operation, ResourcePattern};
use crate::controller::{Command, ControllerError};
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// The entry an `AclBinding` names, checked.
fn entry(binding: Option<AclBinding<'_>>) -> Result<AclEntry, WireError> {
    let refused = |e: ControllerError| WireError::new(e.code(), e.to_string());
    let b = binding.ok_or_else(|| WireError::new(ErrorCode::InvalidRequest, "no ACL in the request"))?;
    let operation = b.operation().unwrap_or_default();
    let operation = Operation::from_name(operation).ok_or_else(|| {
        refused(ControllerError::InvalidAcl(format!(
            "operation {operation:?}: produce, consume, describe, create, alter, delete or admin"
        )))
    })?;
    let resource = ResourcePattern::from_parts(
        b.resource_type().unwrap_or_default(),
        b.resource_name().unwrap_or_default(),
    )
    .map_err(refused)?;
    let entry = AclEntry {
        user: b.user().unwrap_or_default().to_string(),
        operation,
        resource,
    };
    entry.check().map_err(refused)?;
    Ok(entry)
}

pub async fn alter(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let r = request::<AlterAclsRequest>(body)?;
    let entry = entry(r.acl())?;
    let command = match r.remove() {
        true => Command::RemoveAcl { entry },
        false => Command::AddAcl { entry },
    };
    let result = shard.propose(command).await.map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = AlterAclsResponse::create(&mut fbb, &AlterAclsResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

pub fn list(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let user = request::<ListAclsRequest>(body)?.user().filter(|u| !u.is_empty());
    let table = shard.table();
    let mut fbb = FlatBufferBuilder::new();
    let mut acls = Vec::new();
    for a in table.acls.iter().filter(|a| user.is_none_or(|u| a.user == u)) {
        let args = AclBindingArgs {
            user: Some(fbb.create_string(&a.user)),
            operation: Some(fbb.create_string(a.operation.name())),
            resource_type: Some(fbb.create_string(a.resource.kind())),
            resource_name: Some(fbb.create_string(a.resource.name())),
        };
        acls.push(AclBinding::create(&mut fbb, &args));
    }
    let acls = Some(fbb.create_vector(&acls));
    let root = ListAclsResponse::create(&mut fbb, &ListAclsResponseArgs { error: None, acls });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
