//! PutUser, DeleteUser, ListUsers: the cluster's SASL users
//! (`controller::users`). Only superusers and brokers reach them when
//! authentication is on (`crate::auth`). A request carries salted keys,
//! never a password: `strand user create` derives them where the password
//! is typed.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, propose_error, request, respond};
use crate::auth::ServerAuth;
use crate::controller::users::StoredCredential;
use crate::controller::Command;
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// A user name from a request, refused when it is the brokers' own.
fn user_name(shard: &Shard, name: Option<&str>) -> Result<String, WireError> {
    let name = name.unwrap_or_default();
    if crate::auth::is_broker_name(&ServerAuth::of(shard).inter_broker_user, name) {
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            format!(
                "{name:?} is kept for the brokers' own logins (inter_broker_user, and it with \".<node id>\" \
                 after it): choose another user name"
            ),
        ));
    }
    crate::controller::users::check_name(name).map_err(|e| WireError::new(e.code(), e.to_string()))?;
    Ok(name.to_string())
}

pub async fn put(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let r = request::<PutUserRequest>(body)?;
    let name = user_name(shard, r.name())?;
    let given = r.credentials().unwrap_or_default();
    if given.len() > 8 {
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            "at most one credential per mechanism",
        ));
    }
    let credentials: Vec<StoredCredential> = given
        .iter()
        .map(|c| StoredCredential {
            mechanism: c.mechanism().unwrap_or_default().to_string(),
            salt: c.salt().map(|b| b.bytes().to_vec()).unwrap_or_default(),
            iterations: c.iterations(),
            stored_key: c.stored_key().map(|b| b.bytes().to_vec()).unwrap_or_default(),
            server_key: c.server_key().map(|b| b.bytes().to_vec()).unwrap_or_default(),
        })
        .collect();
    crate::controller::users::check_credentials(&credentials).map_err(|e| WireError::new(e.code(), e.to_string()))?;
    let result = shard
        .propose(Command::PutUser { name, credentials })
        .await
        .map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = PutUserResponse::create(&mut fbb, &PutUserResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

pub async fn delete(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let name = user_name(shard, request::<DeleteUserRequest>(body)?.name())?;
    let result = shard.propose(Command::DeleteUser { name }).await.map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = DeleteUserResponse::create(&mut fbb, &DeleteUserResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

pub fn list(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    request::<ListUsersRequest>(body)?;
    let auth = ServerAuth::of(shard);
    let table = shard.table();
    let mut fbb = FlatBufferBuilder::new();
    let mut users = Vec::with_capacity(table.users.len());
    for (name, user) in &table.users {
        let mechanisms: Vec<_> = user.mechanisms().into_iter().map(|m| fbb.create_string(m)).collect();
        let mechanisms = Some(fbb.create_vector(&mechanisms));
        let n = fbb.create_string(name);
        users.push(UserListing::create(
            &mut fbb,
            &UserListingArgs {
                name: Some(n),
                mechanisms,
                superuser: auth.is_superuser(name),
            },
        ));
    }
    let users = Some(fbb.create_vector(&users));
    let root = ListUsersResponse::create(&mut fbb, &ListUsersResponseArgs { error: None, users });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
